"""EVA: efficient attention via control variates (Zheng et al., ICLR 2023), non-causal.

A port of the 1-D, non-causal path of HKUNLP/efficient-attention ``efficient_attention/eva.py``
(``adaptive_proj="default"``, ``overlap_window=False``). Per head, with scale s = d_h^-1/2:

* local part — the sequence is cut into windows of ``window_size``; a query attends exactly to
  the keys of its own window: logits s·q_i·k_j.
* random-feature control variates — the sequence is cut into chunks of ``chunk_size``. Per chunk
  c: k̄_c, q̄_c = means of its (real) keys/queries; k̃_c = LN(Lin_k(k̄_c)) (``adaptive_mu_k``);
  proposal mean μ_c = ½(LN(Lin_q(q̄_c)) + k̃_c); one sample ω_c = μ_c + ε_c (training) or μ_c
  (``deterministic``); self-normalised importance weights over the chunk's keys
  softmax_j(s·ω_c·k_j − s·|k_j|²/2) give the chunk value β_c = Σ_j w_j v_j; the chunk logit for
  query i is s·q_i·k̃_c.
* one joint softmax over [local logits, all chunk logits]; out_i = Σ_local a_ij v_j + Σ_c a_ic β_c.

Kept: the adaptive proposal (Linear + LayerNorm for μ_q, μ_k; LayerNorm eps 1e-5 as torch), the
official code's log-weight scaling, every chunk in the joint softmax (as the code does, chunks that
overlap the local window included), non-overlapping windows (the default).
Changed / simplified, and why:
* ``chunk_size`` is the option instead of ``num_landmarks`` (the chunk count then grows with N,
  the linear-cost regime the FLOP model and the paper's speed study use).
* The sequence is padded to a multiple of lcm(window_size, chunk_size) with masked rows, and the
  chunk means are over *real* tokens only, with empty chunks masked out of the softmax (the
  original averages padded zeros in and keeps empty chunks). With this, right padding changes
  nothing at real positions — padding is exact in the strong sense.
* ε is a :class:`RandomFeatures` variable ``noise`` [max_chunks, h, d_h] drawn at construction
  (``redraw=False``), or drawn per call from ``rng`` with shape [b, chunks, h, d_h] (``redraw=True``,
  the original's fresh ``randn_like`` per step). ``deterministic=True`` (``model.eval()``) uses
  ω = μ as the original does at eval time.
* No relative position bias (``use_rpe``/``use_t5_rpe``): position information comes from the model.

Speed options: aligned (``align``), d_h is zero-padded like every other dimension, the proposal
seeing the true columns (:func:`chunk_control_variates`, flurka-eva's too); ``fused``, the
[N, C] chunk half of the joint softmax runs in the Pallas softmax kernel
(:func:`flurka.kernels.joint_softmax.fused_joint_softmax`; flurka-eva's chunk half too).

Product order (per head; w = window_size, c = chunk_size, C = N/c chunks):
  1. Q, K, V = X W_Q, X W_K, X W_V             3 × [N, d_m] · [d_m, d_m]
  2. chunk means, μ, k̃: Lin_q, Lin_k            2 × [C, d_h] · [d_h, d_h]
  3. importance log-weights ω_c·k_j            [N, d_h] (one ω per chunk) → N·d_h
  4. β_c = Σ_j w_j v_j                         C × [1, c] · [c, d_h]  → N·d_h
  5. local logits q_i·k_j                      N/w × [w, d_h] · [d_h, w] → N·w·d_h
  6. chunk logits q_i·k̃_c                      [N, d_h] · [d_h, C]
  7. joint softmax; local A·V and chunk A·β     N·w·d_h + N·C·d_h
  8. out = concat_heads · W_O
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from flurka.attention.base import (
    F32, NEG_INF, AttentionLayer, RandomFeatures, check_positive_int, contract, pad_to,
    round_up, zero_padding)
from flurka.attention.execution import kernel, layer_tiling
from flurka.attention.performer import RandomFeatureMixin

Array = jax.Array
LN_EPS = 1e-5  # torch.nn.LayerNorm default, as in the official code
WINDOW_SIZE = 16  # the defaults of window_size and chunk_size (positions), EVA's and flurka-eva's
CHUNK_SIZE = 16


def masked_mean(x: Array, mask: Array, axis: int) -> Array:
    """Mean of x over ``axis`` counting only rows where mask (x's masked rows are already zero)."""
    count = jnp.sum(mask, axis=axis).astype(F32)
    return jnp.sum(x.astype(F32), axis=axis) / jnp.maximum(count, 1.0)[..., None, None]


def chunk_control_variates(kc, vc, mc, q_bar, mu_q, mu_k, noise, head_dim: int | None = None):
    """Per-chunk RF control variates.

    kc, vc: [b, C, c, h, d] in the compute dtype (masked rows zero); mc: [b, C, c] bool; q_bar:
    [b, C, h, d]; noise: None, [C, h, head_dim] or [b, C, h, head_dim]. Returns float32
    (k̃ [b, C, h, d], β [b, C, h, d]); products take operands in kc's dtype and accumulate in
    float32. ``head_dim`` (default d): the true d_h where d carries zero columns past it
    (aligned layers): the proposal sees the true columns only, its outputs get zero ones, and
    the scale is the true size's — so k̃ and ω are the unaligned ones, zero-extended.
    """
    d = kc.shape[-1]
    head_dim = head_dim or d
    scale = head_dim ** -0.5

    def proposal(mu, x):
        return pad_to(mu(x[..., :head_dim]), d, axis=-1)

    k_tilde = proposal(mu_k, masked_mean(kc, mc, axis=2))
    omega = 0.5 * (proposal(mu_q, q_bar) + k_tilde)
    if noise is not None:
        omega = omega + pad_to(noise, d, axis=-1)
    kf = kc.astype(F32)
    log_w = (contract("bcjhd,bchd->bchj", kc, omega, kc.dtype) * scale
             - 0.5 * scale * jnp.sum(kf * kf, axis=-1).transpose(0, 1, 3, 2))
    log_w = jnp.where(mc[:, :, None, :], log_w, NEG_INF)
    beta = contract("bchj,bcjhd->bchd", jax.nn.softmax(log_w, axis=-1), vc, vc.dtype)
    return k_tilde, beta


def eva_attention(q, k, v, key_mask, *, window_size: int, chunk_size: int, mu_q, mu_k,
                  noise=None, head_dim: int | None = None, fused=None):
    """EVA on projected heads q, k, v [b, n, h, d] (self-attention: key_mask is also the query
    mask); noise None (ω = μ), [≥C, h, head_dim] or [b, ≥C, h, head_dim]; ``head_dim``: the
    true d_h where d is zero-padded past it (aligned layers). Returns float32 [b, n, h, d]
    (``fused``: v's dtype). Products take operands in q's dtype (softmax weights and chunk
    summaries rounded to it) and accumulate in float32. ``fused`` (a
    :class:`~flurka.kernels.query_side.Tiling`): the chunk half of the joint softmax as a Pallas
    kernel (:func:`flurka.kernels.joint_softmax.fused_joint_softmax`)."""
    b, n, h, d = q.shape
    scale = (head_dim or d) ** -0.5
    unit = math.lcm(window_size, chunk_size)
    n_pad = round_up(n, unit)
    mask = jnp.ones((b, n), bool) if key_mask is None else key_mask
    mask = pad_to(mask, n_pad)
    q, k, v = (zero_padding(pad_to(t, n_pad), mask) for t in (q, k, v))

    nw, w = n_pad // window_size, window_size
    qw, kw, vw = (t.reshape(b, nw, w, h, d) for t in (q, k, v))
    local = contract("bgihd,bgjhd->bhgij", qw, kw, q.dtype) * scale
    local = jnp.where(mask.reshape(b, nw, w)[:, None, :, None, :], local, NEG_INF)

    nc, c = n_pad // chunk_size, chunk_size
    kc, vc, qc = (t.reshape(b, nc, c, h, d) for t in (k, v, q))
    mc = mask.reshape(b, nc, c)
    if noise is not None:  # an aligned input may run past max_len: its extra chunks are empty
        noise = pad_to(noise[..., :nc, :, :], nc, axis=-3)
    k_tilde, beta = chunk_control_variates(kc, vc, mc, masked_mean(qc, mc, axis=2), mu_q, mu_k,
                                           noise, head_dim)
    chunk_bias = jnp.where(jnp.any(mc, axis=-1), 0.0, NEG_INF)   # [b, C]: empty chunks out
    return joint_softmax(local.reshape(b, h, n_pad, w), q, k_tilde, beta, chunk_bias, vw, scale,
                         fused)[:, :n]


def joint_softmax(local, q, k_tilde, beta, chunk_bias, vw, scale, fused=None):
    """EVA's one softmax over each query's window logits ``local`` [b, h, n, w] (float32, masked)
    and its chunk logits s·q·k̃ (``chunk_bias`` [b, C]: 0, or NEG_INF on empty chunks), applied
    to the window's values ``vw`` and the chunk values β [b, C, h, d]. ``vw``: per window
    [b, n/w, w, h, d] (EVA's windows of the sequence) or per query [b, n, w, h, d] (flurka-eva's,
    gathered from the compressed rows); :func:`window_sum` tells them apart. float32 (``fused``:
    the chunk half in the Pallas kernel, the result in vw's dtype)."""
    args = (local, q, k_tilde, beta, chunk_bias, vw, scale)
    if fused:
        return kernel("fused_joint_softmax", "fused=True")(*args, fused)
    return xla_joint_softmax(*args)


def window_sum(weights, vw, dtype):
    """Σ_j weights[b, h, i, j]·v_j over each query's window: ``vw`` per window [b, n/w, w, h, d]
    or per query [b, n, w, h, d] (at w = 1 the two are one layout and one product). float32
    [b, n, h, d]."""
    b, h, n, w = weights.shape
    if vw.shape[1] == n:
        return contract("bhnj,bnjhd->bnhd", weights, vw, dtype)
    return contract("bhgij,bgjhd->bgihd", weights.reshape(b, h, n // w, w, w), vw,
                    dtype).reshape(b, n, h, vw.shape[-1])


def xla_joint_softmax(local, q, k_tilde, beta, chunk_bias, vw, scale):
    """The joint softmax (:func:`_joint_softmax`) from the chunk summaries; float32."""
    chunk = contract("bnhd,bchd->bhnc", q, k_tilde, q.dtype) * scale + chunk_bias[:, None, None, :]
    return _joint_softmax(local, chunk, vw, beta, vw.dtype)


def _joint_softmax(local, chunk, vw, beta, dtype):
    """One softmax over each query's window logits ``local`` [b, h, n, w] and the chunk logits
    ``chunk`` [b, h, n, C] (float32), applied to its window's values ``vw`` (:func:`window_sum`)
    and the chunk values β [b, C, h, d]; float32 [b, n, h, d].

    [N, C] is EVA's one large array (8 heads × 55.5k × 3.5k in float32 is 6.2 GB in the
    N-sweep), so the passes over it are counted. Its exp is rounded to the product's operand
    dtype as it is written. The products take unnormalised weights, and their [N, d] results are
    divided by the normaliser, as flash attention does. The chunk weights' sum comes from the
    A·β product, as a column of ones beside β. What is left is the logits written once, read by
    the max and by the exp, and the weights written and read once. The two parts share one
    maximum: no concatenated [N, w + C] copy (in the windows' layout that copy and its reads
    were most of the step's traffic)."""
    d = beta.shape[-1]
    top = jnp.maximum(jnp.max(local, axis=-1, keepdims=True),
                      jnp.max(chunk, axis=-1, keepdims=True))
    local = jnp.exp(local - top)
    weights = jnp.exp(chunk - top).astype(dtype)
    ones = jnp.ones(beta.shape[:-1] + (1,), beta.dtype)
    chunked = contract("bhnc,bchd->bnhd", weights, jnp.concatenate([beta, ones], axis=-1), dtype)
    windowed = window_sum(local, vw, dtype)
    total = jnp.sum(local, axis=-1).transpose(0, 2, 1)[..., None] + chunked[..., d:]
    return (windowed + chunked[..., :d]) / total


def adaptive_proposal(head_dim: int, rngs: nnx.Rngs, param_dtype) -> nnx.Sequential:
    """EVA's ``adaptive_mu_{q,k}``: Linear(d_h, d_h) then LayerNorm(d_h)."""
    return nnx.Sequential(
        nnx.Linear(head_dim, head_dim, param_dtype=param_dtype, rngs=rngs),
        nnx.LayerNorm(head_dim, epsilon=LN_EPS, param_dtype=param_dtype, rngs=rngs))


class EVAAttention(RandomFeatureMixin, AttentionLayer):
    """EVA with local windows of ``window_size`` and RF control variates over ``chunk_size``
    chunks. ``deterministic`` (set by ``nnx.Module.eval()``) uses ω = μ."""

    mechanism = "eva"

    def __init__(self, *, window_size: int = WINDOW_SIZE, chunk_size: int = CHUNK_SIZE, redraw: bool = False,
                 deterministic: bool = False, fused: Any = False, **kwargs):
        super().__init__(**kwargs)
        self.fused = layer_tiling(self.mechanism, fused, self.padded_head_dim)
        self.window_size = self.check_window(window_size)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.redraw = bool(redraw)
        self.deterministic = bool(deterministic)
        rngs, param_dtype = kwargs["rngs"], kwargs.get("param_dtype", jnp.float32)
        self.adaptive_mu_q = adaptive_proposal(self.head_dim, rngs, param_dtype)
        self.adaptive_mu_k = adaptive_proposal(self.head_dim, rngs, param_dtype)
        self.noise = RandomFeatures(self.draw_noise(rngs.params()))

    def check_window(self, window_size):
        return check_positive_int("window_size", window_size)

    def num_chunks(self) -> int:
        """Chunks at n = max_len (the noise buffer's length)."""
        unit = math.lcm(self.window_size, self.chunk_size)
        return -(-self.max_len // unit) * unit // self.chunk_size

    def draw_noise(self, key: Array, batch: int | None = None) -> Array:
        """ε ~ N(0, I): [chunks, h, d_h], or [batch, chunks, h, d_h]."""
        shape = (self.num_chunks(), self.num_heads, self.head_dim)
        return jax.random.normal(key, shape if batch is None else (batch,) + shape, F32)

    def current_noise(self, batch: int, rng):
        if self.deterministic:
            return None
        if self.redraw:
            return self.draw_noise(self.check_rng(rng), batch)
        return self.noise[...]

    def core(self, q, k, v, key_mask, rng):
        return eva_attention(q, k, v, key_mask, window_size=self.window_size,
                             chunk_size=self.chunk_size, mu_q=self.adaptive_mu_q,
                             mu_k=self.adaptive_mu_k, noise=self.current_noise(q.shape[0], rng),
                             head_dim=self.head_dim, fused=self.fused)
