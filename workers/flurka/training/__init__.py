"""Training: ``run(config) -> result`` (AdamW with the paper's schedules, periodic eval, orbax
checkpoints with bit-for-bit resume, FLOP accounting, divergence detection, up-training), and
``load_run(workdir)``: a trained model back from its checkpoints.

Configs come from :mod:`flurka.configs` (``get_config("lra-listops-small", attention=...)``).
"""

from flurka.configs import BENCHMARKS, TrainConfig, get_config
from flurka.training.api import json_safe, run
from flurka.training.loop import evaluate, train
from flurka.training.restore import TrainedRun, load_run

__all__ = ["BENCHMARKS", "TrainConfig", "get_config", "run", "train", "evaluate", "json_safe", "load_run",
           "TrainedRun"]
