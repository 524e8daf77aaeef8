"""Linear transformer "RNN" attention (Katharopoulos et al. 2020), bidirectional.

φ(x) = elu(x) + 1; out = φ(Q)[φ(K)ᵀV] / (φ(Q)[φ(K)ᵀ1] + 1e-6) as in idiap/fast-transformers
``LinearAttention``.

Product order (per head; feature dim = d_h):
  1. Q, K, V = X W_Q, X W_K, X W_V             3 × [N, d_m] · [d_m, d_m]
  2. φ(Q), φ(K)                                elementwise
  3. φ(K)ᵀ V                                   [d_h, N] · [N, d_h]
  4. φ(Q) · (φ(K)ᵀV)                           [N, d_h] · [d_h, d_h]
  5. denominator φ(Q)·(φ(K)ᵀ1)                 [N, d_h] · [d_h]
  6. out = concat_heads · W_O

Padding: masked keys' features and values are exact zeros.
"""

from __future__ import annotations

import functools
from typing import Any

from flurka.attention.base import AttentionLayer
from flurka.attention.feature_maps import elu_features, query_side, rnn_denominator, row_key_side
from flurka.attention.execution import kernel, layer_tiling
from flurka.attention.projected import ProjectedQuerySide


def elu_key_side(k, v, key_mask, head_dim=None):
    """(φ(K)ᵀV, φ(K)ᵀ1) with masked keys and values exact zeros."""
    return row_key_side(k, v, key_mask, functools.partial(elu_features, head_dim=head_dim))


def elu_attention(q, k, v, key_mask, *, head_dim=None, fused=False):
    """Linear attention with φ = elu+1 on projected heads; float32 [b, n, h, d_h] (fused: in v's
    dtype, what W_O takes). ``head_dim``:
    the true d_h when the last axis is zero-padded (those features, elu(0)+1 = 1, are zeroed);
    ``fused`` (a :class:`~flurka.kernels.query_side.Tiling`, or True for the current one): the query
    side as one Pallas kernel (:mod:`flurka.kernels.query_side`)."""
    kv, k_sum = elu_key_side(k, v, key_mask, head_dim)
    if fused:
        return kernel("fused_query_side", "fused=True")(q, kv, k_sum, feature="elu", head_dim=head_dim or q.shape[-1],
                                                       tiling=fused, out_dtype=v.dtype)
    return query_side(q, functools.partial(elu_features, head_dim=head_dim), kv, k_sum,
                      rnn_denominator, v.dtype)


class RNNAttention(ProjectedQuerySide, AttentionLayer):
    """Deterministic-kernel linear attention (no random features). ``fused``: the query side as
    a Pallas kernel; ``fused_projections`` too: with W_Q and W_O in it
    (:mod:`flurka.kernels.projected_layer`)."""

    mechanism = "rnn"
    feature = "elu"

    def __init__(self, *, fused: Any = False, fused_projections: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.fused = layer_tiling(self.mechanism, fused, self.padded_head_dim)
        self.init_projections(fused_projections)

    def kernel_key_side(self, k, v, key_mask, rng):
        return (*elu_key_side(k, v, key_mask, self.head_dim), None)

    def core(self, q, k, v, key_mask, rng):
        return elu_attention(q, k, v, key_mask, head_dim=self.head_dim, fused=self.fused)
