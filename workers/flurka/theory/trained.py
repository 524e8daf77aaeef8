"""The theory on a trained model: Theorem 1's errors and Fig. 1's ranks on the activations that
each of its attention layers really receives, not on random inputs.

:func:`flurka.training.load_run` rebuilds a run's model at a checkpoint of its work dir;
:func:`capture` runs one eval batch through the model's own forward pass
and records what every encoder block hands its attention (LN(x) and the mask); the errors then
compare every mechanism against full softmax attention *with that layer's trained W_Q, W_K, W_V,
W_O* on those inputs, and the ranks are those of the trained layer's own φ(Q)φ(K)ᵀ when it is a
feature-map mechanism (the paper's Fig. 1: a trained performer), else of performer / rnn layers
carrying its trained projections.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flurka.attention import make_attention
from flurka.models.encoder import EncoderBlock
from flurka import theory
from flurka.training.restore import TrainedRun

Array = jax.Array


class _Recorder(nnx.Module):
    """Stands in for a block's attention during :func:`capture`: reports its input, then runs it."""

    def __init__(self, inner: nnx.Module, report):
        self.inner, self.report = inner, report

    @property
    def fuses_norm(self) -> bool:
        return self.inner.fuses_norm

    def __call__(self, x, mask=None, *, rng=None):
        self.report(self.inner, x, mask)
        return self.inner(x, mask, rng=rng)

    def fused_block(self, x, mask=None, *, norm=None, **kernel_options):
        """``norm``: the block's LayerNorm handed over un-applied; the report is its output."""
        self.report(self.inner, x if norm is None else norm(x), mask)
        return self.inner.fused_block(x, mask, norm=norm, **kernel_options)


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
    return list(iter_error_rows(captured, **grid))


def iter_error_rows(captured: Sequence[Captured], **grid) -> Iterator[dict[str, Any]]:
    """:func:`error_rows` one row at a time."""
    for c in captured:
        full = with_projections(c.attention, "full")
        for row in theory.iter_approximation_errors(
                d_model=c.attention.d_model, num_heads=c.attention.num_heads,
                seq_len=c.x.shape[1], x=c.x, mask=c.mask, full=full, **grid):
            yield {**row, "layer": c.layer}


def rank_rows(captured: Sequence[Captured], mechanisms: Sequence[str], *, d_k: int, m: int,
              tol: float | None = None) -> list[dict[str, Any]]:
    """Ranks of φ(Q)φ(K)ᵀ per captured layer, example and head: the trained layer itself when
    its mechanism is one of ``mechanisms`` (``trained: True``), else a ``mechanisms`` layer with
    its projections (d_k / m as given)."""
    return list(iter_rank_rows(captured, mechanisms, d_k=d_k, m=m, tol=tol))


def iter_rank_rows(captured: Sequence[Captured], mechanisms: Sequence[str], *, d_k: int, m: int,
                   tol: float | None = None) -> Iterator[dict[str, Any]]:
    """:func:`rank_rows`, one layer's rows (examples × heads) after another."""
    for c in captured:
        for mech in mechanisms:
            own = mech == c.attention.mechanism
            if own:
                layer = c.attention
            else:
                uses_dk, uses_m = theory.uses(mech)
                layer = with_projections(c.attention, mech, **theory.layer_options(
                    d_k if uses_dk else None, m if uses_m else None))
            yield from [{**row, "layer": c.layer, "trained": own, "seed": None}
                        for row in theory.rank_rows(layer, c.x, c.mask, tol)]
