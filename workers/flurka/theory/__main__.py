"""``python -m flurka.theory``: the theory JSON writer (:mod:`flurka.theory.cli`)."""

import sys

from flurka.theory.cli import main

sys.exit(main())
