"""Blended hand-over layers for up-training (paper §4.2): a FLuRKA variant that also computes its
up-training base mechanism from the *same* parameters and returns their mix.

Why: at the up-training switch the trained base (``linformer``, or the variant's kernel
constituent) is replaced by the FLuRKA variant, which carries every shared parameter but computes
a different function of them. For ``flurka-performer`` after a Linformer base that difference is
large: FAVOR+'s estimate of the softmax kernel degrades exponentially with the logit scale, and
Linformer-compressed keys (E·X mixes N rows) sit where a few dozen features are ~100 % off exact
softmax — the loss jumps far above the base run's noise. A hand-over layer lets training move
the model over gradually:

    ctx = (1 − β)·base_ctx + β·variant_ctx        (per head, before W_O; W_O is linear and shared)

with β ∈ [0, 1] ramped by the training loop over ``TrainConfig.handover_steps`` steps
(:mod:`flurka.training.uptrain`, which also says what the ramp does and does not achieve).
β = 0 is the base model, β = 1 the variant, both computed from
W_Q, W_K, W_V, W_O, E1/E2 and the random features of this one layer.

The class is the variant's own class plus :class:`HandoverMixin`, so every parameter keeps the
variant's path (``query``, ``key``, ``value``, ``out``, ``seq_proj/e1``, ...): optimizer states
and carried parameters move in and out of the hand-over unchanged. The only extra variable is β
itself (:class:`HandoverBeta`, named ``handover_beta``: neither a parameter nor an RNG, so it
travels with the model's ``other`` state and is a traced input of the jitted step — changing it
never recompiles).

The base branch, per base mechanism:

* ``linformer``: softmax over the compressed K' = (E1·X) W_K, V' = (E2·X) W_V (the variant's own
  low-rank path, exactly ``LinformerAttention``);
* ``performer`` / ``rnn``: the kernel on the *uncompressed* keys/values, with the layer's
  random features ω (carried from the base at the switch) — exactly ``PerformerAttention`` /
  ``RNNAttention``;
* ``eva``: EVA on the uncompressed keys/values with its adaptive proposal (carried) and ω = μ
  (EVA's deterministic/eval-time estimate): the base's noise buffer ε has EVA's shape, not
  flurka-eva's, so it does not survive the switch. Its window and chunks are the variant's
  ``window_size`` and ``chunk_size`` (positions for both layers).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from flurka.attention.base import F32
from flurka.attention.eva import eva_attention
from flurka.catalogue.mechanisms import FLURKA, constituents
from flurka.attention.full import softmax_attention
from flurka.attention.performer import favor_attention
from flurka.attention.rnn import elu_attention

Array = jax.Array
BETA = "handover_beta"   # the variable's attribute name (flat paths end in "/handover_beta")


class HandoverBeta(nnx.Variable):
    """β, the FLuRKA variant's share of a hand-over layer's output (float32 scalar, not trained)."""


class HandoverMixin:
    """Mixed in front of a FLuRKA variant's class (see :func:`handover_class`)."""

    def __init__(self, *, handover_from: str, **kwargs):
        valid = tuple(constituents(self.mechanism).values())
        if handover_from not in valid:
            raise ValueError(f"{self.mechanism}: handover_from must be one of its up-training bases "
                             f"{valid}, got {handover_from!r}")
        for option in ("align", "fused_projections"):
            if kwargs.get(option):
                raise ValueError(f"{self.mechanism}: {option} (a speed option) is not supported "
                                 f"by hand-over layers")
        super().__init__(**kwargs)
        self.handover_from = handover_from
        self.handover_beta = HandoverBeta(jnp.zeros((), F32))

    def base_attend(self, x: Array, mask: Array | None, rng: Array | None) -> Array:
        """The base mechanism's per-head context [b, n, h, d_h] from this layer's parameters."""
        if self.handover_from == "linformer":
            q, k, v = self.low_rank_qkv(x, mask)
            return softmax_attention(q, k, v, self.compressed_mask(x.shape[0], mask, x.shape[1]))
        q, k, v = (self.heads(p, x) for p in (self.query, self.key, self.value))
        if self.handover_from == "performer":
            return favor_attention(q, k, v, mask, self.omega(rng))
        if self.handover_from == "rnn":
            return elu_attention(q, k, v, mask)
        return eva_attention(q, k, v, mask, window_size=self.window_size,
                             chunk_size=self.chunk_size, mu_q=self.adaptive_mu_q,
                             mu_k=self.adaptive_mu_k, noise=None)

    def attend(self, x, mask, rng):
        variant = super().attend(x, mask, rng).astype(F32)
        base = self.base_attend(x, mask, rng).astype(F32)
        beta = self.handover_beta[...].astype(F32)
        return (1.0 - beta) * base + beta * variant


@functools.cache
def handover_class(cls: type) -> type:
    """``cls`` (a FLuRKA variant's layer class) with :class:`HandoverMixin` in front. Cached, so
    the same variant always gets the same class (jit caches compare graph definitions, which
    hold the class)."""
    if getattr(cls, "mechanism", None) not in FLURKA:
        raise ValueError(f"hand-over layers exist for FLuRKA variants only ({', '.join(FLURKA)}), "
                         f"got {getattr(cls, 'mechanism', cls)!r}")
    return type(f"Handover{cls.__name__}", (HandoverMixin, cls),
                {"__module__": __name__, "__doc__": f"{cls.__name__} blended with its base "
                 "during the up-training hand-over (see flurka.attention.handover)."})

