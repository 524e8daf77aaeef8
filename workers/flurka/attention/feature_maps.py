"""Feature maps φ and the linear-attention contraction they share.

Kernel attention computes, per head, φ(Q) [φ(K)ᵀ V] / (φ(Q) [φ(K)ᵀ 1]) — the bracket first, so the
cost is linear in the sequence length. ``performer`` uses FAVOR+ positive random features, ``rnn``
uses elu(x)+1; the FLuRKA variants reuse exactly these functions on compressed keys.

Precision: feature maps, sums and normalisers run in float32; matrix products take their operands
in the compute dtype (the dtype of the projected heads) and accumulate in float32 — so a bf16
layer's N-sized products run on bf16 tensor cores, not as float32 (TF32 at best) GEMMs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flurka.attention.base import F32, contract, zero_padding

Array = jax.Array

FAVOR_EPS = 1e-6   # google-research performer: numerical_stabilizer (features and denominator)
RNN_EPS = 1e-6     # fast-transformers LinearAttention eps


# -- random projections ---------------------------------------------------------------------
def gaussian_orthogonal_matrix(key: Array, num_rows: int, num_cols: int, *,
                               orthogonal: bool = True) -> Array:
    """ω ∈ R^{m×d}: rows are orthogonal within each block of d (Performer ORF), with the norms of
    i.i.d. Gaussian rows so that each row is still marginally N(0, I_d) (google's scaling=0)."""
    block_key, norm_key = jax.random.split(key)
    if not orthogonal:
        return jax.random.normal(block_key, (num_rows, num_cols), F32)
    num_blocks = -(-num_rows // num_cols)
    blocks = jax.random.normal(block_key, (num_blocks, num_cols, num_cols), F32)
    q, r = jnp.linalg.qr(blocks)                       # columns orthonormal
    # Householder QR leaves sign(diag R) arbitrary-but-data-dependent, which biases the column
    # directions (the first one always points away from e1's sign); fixing the signs makes Q Haar
    # distributed, so each feature direction is uniform and FAVOR+ stays unbiased.
    q = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[..., None, :]
    rows = jnp.swapaxes(q, -1, -2).reshape(num_blocks * num_cols, num_cols)[:num_rows]
    norms = jnp.linalg.norm(jax.random.normal(norm_key, (num_rows, num_cols), F32), axis=1)
    return rows * norms[:, None]


# -- feature maps ---------------------------------------------------------------------------
def favor_features(x: Array, omega: Array, *, is_query: bool, mask: Array | None = None,
                   eps: float = FAVOR_EPS, head_dim: int | None = None,
                   num_features: int | None = None) -> Array:
    """FAVOR+ positive features φ(x) = m^-1/2 (exp(ωᵀx' − |x'|²/2 − s) + eps), x' = d^-1/4 x.

    x: [b, n, h, d], omega: [m, d] → [b, n, h, m] float32; ωᵀx takes its operands in x's dtype
    (the layer's compute dtype) and accumulates in float32. The stabilizer s is the max of the
    whole exponent ωᵀx' − |x'|²/2, per row for queries and per (batch, head) over real keys and
    features for keys, so it cancels in the normalised output and the largest feature is exactly
    m^-1/2. google-research takes the max of ωᵀx' alone (without −|x'|²/2); then, once
    |k'|²/2 ≳ 10 (large keys, e.g. Linformer-compressed ones after some training), every key
    feature falls below ``eps`` and the denominator below its 1e-6 guard, and the output collapses
    towards 0 whatever m — a float32 artefact, not FAVOR+'s variance. Masked key rows are exact
    zeros (callers zero their input first, so no overflow or NaN gradient can come from padded
    content).

    Aligned layers zero-pad x's last axis and ω's columns (``head_dim`` = the true d) and ω's rows
    (``num_features`` = the true m): padded features are exact zeros and stay out of the stabilizer.
    """
    d = head_dim or x.shape[-1]
    m = num_features or omega.shape[0]
    dash = d ** -0.25 * contract("bnhd,md->bnhm", x, omega, x.dtype)
    xf = x.astype(F32)
    diag = 0.5 * d ** -0.5 * jnp.sum(xf * xf, axis=-1, keepdims=True)
    logit = dash - diag
    real = None if m == omega.shape[0] else jnp.arange(omega.shape[0]) < m
    if real is not None:
        logit = jnp.where(real, logit, -jnp.inf)
    if is_query:
        stab = jnp.max(logit, axis=-1, keepdims=True)
    else:
        valid = logit if mask is None else jnp.where(mask[:, :, None, None], logit, -jnp.inf)
        # features first (the contiguous axis), then positions: one strided pass over [b, n, h]
        # where a joint max over (n, m) strides the whole feature tensor
        stab = jnp.max(jnp.max(valid, axis=3, keepdims=True), axis=1, keepdims=True)
    feat = m ** -0.5 * (jnp.exp(logit - jax.lax.stop_gradient(stab)) + eps)
    if real is not None:
        feat = jnp.where(real, feat, 0.0)
    return mask_rows(feat, None if is_query else mask)


def elu_features(x: Array, mask: Array | None = None, *, head_dim: int | None = None) -> Array:
    """Linear-transformer feature map φ(x) = elu(x) + 1 (Katharopoulos et al.), float32; with a
    zero-padded last axis (``head_dim`` = true size) the padded features are zeroed."""
    feat = jax.nn.elu(x.astype(F32)) + 1.0
    if head_dim is not None and head_dim < x.shape[-1]:
        feat = jnp.where(jnp.arange(x.shape[-1]) < head_dim, feat, 0.0)
    return mask_rows(feat, mask)


def mask_rows(feat: Array, mask: Array | None) -> Array:
    if mask is None:
        return feat
    return jnp.where(mask[:, :, None, None], feat, 0.0)


# -- contraction shared by every kernel method ------------------------------------------------
def favor_denominator(r: Array, eps: float = FAVOR_EPS) -> Array:
    """google-research: R + 2·eps·[|R| ≤ eps] (nudges only near-zero denominators)."""
    return r + 2.0 * eps * (jnp.abs(r) <= eps)


def rnn_denominator(r: Array, eps: float = RNN_EPS) -> Array:
    """fast-transformers: R + eps."""
    return r + eps


def key_side(k_feat: Array, v: Array) -> tuple[Array, Array]:
    """(φ(K)ᵀV [b, h, f, d], φ(K)ᵀ1 [b, h, f]), float32 — the bracket of φ(Q)[φ(K)ᵀV] /
    (φ(Q)[φ(K)ᵀ1]), computed first so the cost is linear in N.

    k_feat: [b, m, h, f] float32 (masked rows already zero), v: [b, m, h, d] (masked rows zero).
    Every product here and in :func:`query_side` takes its operands in v's dtype (the compute
    dtype: features are rounded to it, as flash attention rounds its softmax weights) and
    accumulates in float32."""
    return contract("bmhf,bmhd->bhfd", k_feat, v, v.dtype), jnp.sum(k_feat, axis=1)


def row_key_side(k: Array, v: Array, key_mask: Array | None, features) -> tuple[Array, Array]:
    """:func:`key_side` of a feature map that works per row on the last axis (elu+1; not
    FAVOR+'s keys, whose stabiliser spans positions), masked keys' features and values exact
    zeros. On a CPU the heads go first before the feature map, as in :func:`query_side`."""

    def heads_major(k, v):
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        real = None if key_mask is None else key_mask[:, None, :, None]

        def zero(x):
            return x if real is None else jnp.where(real, x, jnp.zeros((), x.dtype))

        feat, v = zero(features(zero(k))), zero(v)
        return contract("bhmf,bhmd->bhfd", feat, v, v.dtype), jnp.sum(feat, axis=2)

    def positions_major(k, v):
        k, v = zero_padding(k, key_mask), zero_padding(v, key_mask)
        return key_side(mask_rows(features(k), key_mask), v)

    return jax.lax.platform_dependent(k, v, cpu=heads_major, default=positions_major)


def query_side(q: Array, features, kv: Array, k_sum: Array, denominator, dtype) -> Array:
    """φ(Q)·KV / denominator(φ(Q)·Σφ(K)) on ``dtype`` operands, φ = ``features`` (a query
    feature map: per row, on the last axis, so either layout takes it); float32 [b, n, h, d]
    (the part :mod:`flurka.kernels.query_side` runs as one kernel)."""

    def heads_major(q):
        # on a CPU, heads first before the feature map (it fuses into that copy, where after
        # it XLA materialises it and copies again), and divide before moving them back: the
        # division's backward then reduces the denominator's cotangent along contiguous rows
        q_feat = features(q.transpose(0, 2, 1, 3))
        num = contract("bhnf,bhfd->bhnd", q_feat, kv, dtype)
        den = contract("bhnf,bhf->bhn", q_feat, k_sum, dtype)
        return (num / denominator(den)[..., None]).transpose(0, 2, 1, 3)

    def positions_major(q):
        # heads-major output, transposed after: XLA:CPU (jax 0.10) has no bf16×bf16→f32 kernel
        # for the "bnhf,bhfd->bnhd" layout and fails at run time; this layout it has
        q_feat = features(q)
        num = contract("bnhf,bhfd->bhnd", q_feat, kv, dtype)
        den = contract("bnhf,bhf->bnh", q_feat, k_sum, dtype)
        return num.transpose(0, 2, 1, 3) / denominator(den)[..., None]

    return jax.lax.platform_dependent(q, cpu=heads_major, default=positions_major)
