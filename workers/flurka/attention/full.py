"""Full softmax attention: softmax(Q Kᵀ/√d_h) V, O(N²).

Product order (per head; what ``flops.py`` counts):
  1. Q = X W_Q, K = X W_K, V = X W_V          3 × [N, d_m] · [d_m, d_m]
  2. S = Q Kᵀ / √d_h                          [N, d_h] · [d_h, N]      (per head)
  3. A = softmax(S) row-wise (masked keys excluded)
  4. A V                                      [N, N] · [N, d_h]       (per head)
  5. out = concat_heads · W_O                 [N, d_m] · [d_m, d_m]

Padding: masked keys get a logit of -1e30 so their softmax weight is exactly 0; padded query rows
produce values nobody reads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flurka.attention.base import NEG_INF, AttentionLayer, contract

Array = jax.Array


def softmax_attention(q: Array, k: Array, v: Array, key_mask: Array | None = None, *,
                      head_dim: int | None = None) -> Array:
    """Core on already-projected heads.

    q: [b, n, h, d], k/v: [b, m, h, d], key_mask: [b, m] bool or None; ``head_dim`` the true d_h
    when d is zero-padded (aligned layers). Logits, softmax and the A·V accumulation run in
    float32; A·V takes A rounded to v's dtype (flash attention's P·V); returns float32 [b, n, h, d].
    """
    scale = (head_dim or q.shape[-1]) ** -0.5
    logits = contract("bqhd,bkhd->bhqk", q, k, v.dtype) * scale
    if key_mask is not None:
        logits = jnp.where(key_mask[:, None, None, :], logits, NEG_INF)
    weights = jax.nn.softmax(logits, axis=-1)
    return contract("bhqk,bkhd->bqhd", weights, v, v.dtype)


class FullAttention(AttentionLayer):
    """Standard multi-head softmax attention (the quality reference)."""

    mechanism = "full"

    def core(self, q, k, v, key_mask, rng):
        return softmax_attention(q, k, v, key_mask, head_dim=self.head_dim)
