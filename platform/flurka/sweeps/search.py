"""Optuna over the planned α branches, scored on the final metric only."""

from __future__ import annotations

from typing import Any

from ray.tune.search.optuna import OptunaSearch


class FinalMetricOptuna(OptunaSearch):
    """A trial reports its training loss every few steps and its quality metric (``final_*``) once,
    at the end. Optuna scores samples on the latter; Ray's OptunaSearch would read it from every
    intermediate report (for pruning) and fail on the first one. Pruning is ASHA's job here."""

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if self.metric in result:
            super().on_trial_result(trial_id, result)
