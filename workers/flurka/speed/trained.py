"""The theory on a trained model: Theorem 1's errors and Fig. 1's ranks on the activations that
each of its attention layers really receives, not on random inputs.

A training run's work dir (``flurka train --workdir DIR`` with checkpoints, or a sweep trial's)
holds Orbax checkpoints whose metadata carry the run's config. :func:`load_run` rebuilds the
model at a checkpoint; :func:`capture` runs one eval batch through the model's own forward pass
and records what every encoder block hands its attention (LN(x) and the mask); the errors then
compare every mechanism against full softmax attention *with that layer's trained W_Q, W_K, W_V,
W_O* on those inputs, and the ranks are those of the trained layer's own φ(Q)φ(K)ᵀ when it is a
feature-map mechanism (the paper's Fig. 1: a trained performer), else of performer / rnn layers
carrying its trained projections.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flurka.attention import make_attention
from flurka.models.encoder import EncoderBlock
from flurka.speed import theory

Array = jax.Array


@dataclasses.dataclass
class TrainedRun:
    workdir: str
    step: int
    config: Any          # flurka.configs.base.TrainConfig
    attention: str       # the mechanism of the checkpointed model (the base before an up-training switch)
    model: nnx.Module
    dataset: Any
    task: Any

    def describe(self) -> str:
        return (f"{os.path.basename(os.path.normpath(self.workdir))} ({self.config.benchmark}, "
                f"{self.attention}, step {self.step})")


def checkpoint_meta(workdir: str, step: int | None = None) -> tuple[int, dict]:
    """(step, metadata) of a run's checkpoint (default: its latest); one-line ValueError when the
    directory holds none — cheap, so the CLI checks it before any compute."""
    from flurka.training.checkpoints import Checkpointer

    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        raise ValueError(f"{workdir} is not a training work dir with checkpoints "
                         f"(no {directory}; train with --workdir and checkpoint_every > 0)")
    with Checkpointer(directory, read_only=True) as ckpt:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"{directory} holds no checkpoint yet")
        return step, ckpt.meta(step)


def train_config(meta: dict):
    """The TrainConfig a checkpoint's metadata recorded."""
    from flurka.configs.base import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    stored = {k: v for k, v in meta["config"].items() if k in fields}
    stored["metrics"] = tuple(stored.get("metrics", ()))
    return TrainConfig(**stored)


def load_run(workdir: str, step: int | None = None) -> TrainedRun:
    """The model of ``workdir``'s checkpoint at ``step`` (default: the latest), with the run's
    data set and task."""
    from flurka.training.checkpoints import Checkpointer
    from flurka.training.loop import load_dataset, make_phase
    from flurka.training.optimizer import make_optimizer
    from flurka.training.tasks import make_task

    step, meta = checkpoint_meta(workdir, step)
    if meta.get("handover_from"):
        raise ValueError(f"step {step} of {workdir} is mid hand-over (blended "
                         f"{meta['handover_from']} → {meta['attention']}); pick another step")
    config = train_config(meta)
    dataset, task = load_dataset(config), make_task(config)
    phase = make_phase(config, dataset.info, meta["attention"], task, make_optimizer(config),
                       mesh=None)
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        state, _ = ckpt.restore(step, phase.state())
    model = phase.parts.merge(state["params"], state["other"])
    return TrainedRun(workdir, step, config, meta["attention"], model, dataset, task)


class _Recorder(nnx.Module):
    """Stands in for a block's attention during :func:`capture`: reports its input, then runs it."""

    def __init__(self, inner: nnx.Module, report):
        self.inner, self.report = inner, report

    @property
    def fuses_norm(self) -> bool:
        return self.inner.fuses_norm

    def __call__(self, x, mask=None, *, rng=None, norm=None, statistics=None, residual=False):
        """``norm``: the block's LayerNorm handed over un-applied; the report is its output."""
        self.report(self.inner, x if norm is None else norm(x), mask)
        return self.inner(x, mask, rng=rng, norm=norm, statistics=statistics, residual=residual)


@dataclasses.dataclass
class Captured:
    layer: int              # encoder blocks in the order the forward pass runs them
    attention: nnx.Module   # the trained attention layer
    x: Array                # [batch, seq, d_model]: LN(x), what the attention received
    mask: Array | None      # [batch, seq] bool


def capture(run: TrainedRun, examples: int) -> list[Captured]:
    """Every encoder block's attention input on the first ``examples`` eval examples (the first
    call per block: a two-tower classifier runs its encoder twice)."""
    batch = {k: jnp.asarray(v) for k, v in next(run.dataset.eval_batches(examples)).items()
             if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
    blocks = [node for _, node in nnx.iter_graph(run.model) if isinstance(node, EncoderBlock)]
    seen: dict[int, Captured] = {}

    def report(inner, x, mask):
        if id(inner) not in seen:
            seen[id(inner)] = Captured(len(seen), inner, x, mask)

    originals = [block.attention for block in blocks]
    try:
        for block in blocks:
            block.attention = _Recorder(block.attention, report)
        run.task.forward(run.model, batch, deterministic=True)
    finally:
        for block, attention in zip(blocks, originals):
            block.attention = attention
    return sorted(seen.values(), key=lambda c: c.layer)


def with_projections(trained: nnx.Module, mechanism: str, **options) -> nnx.Module:
    """A fresh ``mechanism`` layer of the trained layer's size holding its W_Q, W_K, W_V, W_O."""
    layer = make_attention(mechanism, d_model=trained.d_model, num_heads=trained.num_heads,
                           max_len=trained.max_len, rngs=nnx.Rngs(0), **options)
    copied = theory.copy_shared(trained, layer, theory.PROJECTIONS)
    if copied != list(theory.PROJECTIONS):
        raise ValueError(f"{trained.mechanism}: cannot copy its projections "
                         f"(copied {copied} of {list(theory.PROJECTIONS)})")
    return layer


def error_rows(captured: Sequence[Captured], **grid) -> list[dict[str, Any]]:
    """``theory.approximation_errors`` per captured layer (``grid``: d_k_values, m_values,
    mechanisms, seeds), against full attention with the layer's trained projections; rows gain
    ``layer``."""
    rows = []
    for c in captured:
        full = with_projections(c.attention, "full")
        for row in theory.approximation_errors(
                d_model=c.attention.d_model, num_heads=c.attention.num_heads,
                seq_len=c.x.shape[1], x=c.x, mask=c.mask, full=full, **grid):
            rows.append({**row, "layer": c.layer})
    return rows


def rank_rows(captured: Sequence[Captured], mechanisms: Sequence[str], *, d_k: int, m: int,
              tol: float | None = None) -> list[dict[str, Any]]:
    """Ranks of φ(Q)φ(K)ᵀ per captured layer, example and head: the trained layer itself when
    its mechanism is one of ``mechanisms`` (``trained: True``), else a ``mechanisms`` layer with
    its projections (d_k / m as given)."""
    rows = []
    for c in captured:
        for mech in mechanisms:
            own = mech == c.attention.mechanism
            if own:
                layer = c.attention
            else:
                uses_dk, uses_m = theory.uses(mech)
                layer = with_projections(c.attention, mech, **theory.layer_options(
                    d_k if uses_dk else None, m if uses_m else None))
            rows += [{**row, "layer": c.layer, "trained": own, "seed": None}
                     for row in theory.rank_rows(layer, c.x, c.mask, tol)]
    return rows
