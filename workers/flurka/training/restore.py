"""A trained model back from its work dir: ``load_run(path)``.

A training run's work dir (``flurka train --workdir DIR`` with checkpoints, a sweep trial's
``<run-dir>/work/<trial>``, or the ``model`` artifact a sweep logs to MLflow for its best trial,
once downloaded) holds Orbax checkpoints whose metadata carry the run's config; the model is
rebuilt from that config and restored at a step.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from flax import nnx

from flurka.configs.base import TrainConfig, from_dict
from flurka.training.checkpoints import Checkpointer, checkpoint_meta
from flurka.training.loop import load_dataset, make_phase
from flurka.training.optimizer import make_optimizer
from flurka.training.tasks import make_task


@dataclasses.dataclass
class TrainedRun:
    workdir: str
    step: int
    config: TrainConfig
    attention: str       # the mechanism of the checkpointed model (the base before an up-training switch)
    model: nnx.Module
    dataset: Any
    task: Any

    def describe(self) -> str:
        return (f"{os.path.basename(os.path.normpath(self.workdir))} ({self.config.benchmark}, "
                f"{self.attention}, step {self.step})")


def train_config(meta: dict) -> TrainConfig:
    """The TrainConfig a checkpoint's metadata recorded (either layout: :func:`from_dict`)."""
    return from_dict(meta["config"])


def load_run(workdir: str | os.PathLike, step: int | None = None) -> TrainedRun:
    """The model of ``workdir``'s checkpoint at ``step`` (default: the latest), with the run's
    data set and task (``model.eval()`` for evaluation: dropout off, EVA's ε at its mean)."""
    workdir = os.fspath(workdir)
    step, meta = checkpoint_meta(workdir, step)
    if meta.get("handover_from"):
        raise ValueError(f"step {step} of {workdir} is mid hand-over (blended "
                         f"{meta['handover_from']} → {meta['attention']}); pick another step")
    config = train_config(meta)
    dataset = load_dataset(config)
    task = make_task(config, dataset.info)
    phase = make_phase(config, dataset.info, meta["attention"], task, make_optimizer(config),
                       mesh=None)
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        state, _ = ckpt.restore(step, phase.state())
    model = phase.parts.merge(state["params"], state["other"])
    return TrainedRun(workdir, step, config, meta["attention"], model, dataset, task)
