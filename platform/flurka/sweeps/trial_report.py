"""What a trial reports to Tune beside its metrics, declared once for the trainable that writes
it and the driver's readers (the MLflow callback, the progress line, the runner). Plain Python:
the trainable imports it without MLflow, the callback without JAX.

A training entry's metrics come as they are, an evaluation's as ``eval_<name>``
(:data:`EVAL_PREFIX`); the final report carries ``training.run``'s whole result as JSON under
:data:`RESULT_KEY`, or, for a trial that ended itself on a failure no retry can mend (a corrupt
checkpoint), its one-line reason under :data:`FAILURE_KEY`.
"""

from __future__ import annotations

import json
from typing import Any

RESULT_KEY = "result_json"
EVAL_PREFIX = "eval_"
FAILURE_KEY = "failure"


def trial_result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """training.run's result dict from a trial's last reported metrics (None if it never finished)."""
    if not result or not result.get(RESULT_KEY):
        return None
    return json.loads(result[RESULT_KEY])


def trial_failure(result: dict[str, Any] | None) -> str | None:
    """The one line a trial reported on ending without a result (a corrupt checkpoint), if any."""
    return (result or {}).get(FAILURE_KEY) or None


__all__ = ["RESULT_KEY", "EVAL_PREFIX", "FAILURE_KEY", "trial_result", "trial_failure"]
