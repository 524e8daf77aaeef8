"""``run(config) -> result``: the Ray-free entry point (sweeps, the CLI and notebooks call it).

The result is a JSON-serializable dict::

    {"status": "ok" | "diverged at step k", "benchmark", "attention", "seed", "steps",
     "final_metrics": {metric: value}, "history": [{"step", "loss", "train_flops", ...}],
     "eval_history": [{"step", "train_flops", metric...}], "train_flops": total,
     "wall_time_s", "time_split": {part: seconds} (see flurka.training.loop), "num_params",
     "switches": [up-training switches], "dataset": {"name", "digest", "task", "num_train",
     "num_eval", "num_eval_<split>" per extra eval split} (flurka.data.Dataset.describe), "config": {...}}

``final_metrics`` and each ``eval_history`` entry also hold the config's metrics on the data set's
extra eval splits, named ``<metric>_<split>`` (glue-mnli: ``accuracy_mismatched``).

Non-finite floats (a diverged loss, an undefined correlation) become ``None`` so that strict
JSON readers accept it.
"""

from __future__ import annotations

import math
from typing import Any

from flurka.configs.base import TrainConfig
from flurka.training.loop import train


def json_safe(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:   # numpy / jax scalars
        return json_safe(x.item())
    return x


def run(config: TrainConfig, **kwargs: Any) -> dict:
    """Train ``config`` (see :func:`flurka.training.loop.train` for ``callback``/``progress``)."""
    return json_safe(train(config, **kwargs))
