"""A trial's process ended by Tune prints no stack trace: Ray's SIGTERM handler raises
SystemExit, and where that lands in a finalizer Python reports it as "Exception ignored in"
with a traceback (seen at the end of every `make sweep` phase)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from flurka.sweeps.trainable import quiet_termination
if sys.argv[1] == "quiet":
    quiet_termination()
    quiet_termination()                    # idempotent: one hook, not a chain of them

class Exits:
    def __del__(self):
        raise SystemExit(1)                # what Ray's handler raises inside a finalizer

class Fails:
    def __del__(self):
        raise ValueError("a real error")

e = Exits(); del e
f = Fails(); del f
print("alive")
"""


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                          timeout=120, check=True)


def test_the_trainable_drops_only_the_termination_from_finalizers():
    loud, quiet = _run("loud"), _run("quiet")
    assert loud.stdout == quiet.stdout == "alive\n"
    assert "SystemExit" in loud.stderr and "ValueError: a real error" in loud.stderr
    assert "SystemExit" not in quiet.stderr
    assert quiet.stderr.count("Exception ignored") == 1          # the ValueError, still reported
    assert "ValueError: a real error" in quiet.stderr
