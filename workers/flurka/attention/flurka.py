"""FLuRKA (paper eq. 3): φ(X W_Q) [φ((E1 X) W_K)ᵀ ((E2 X) W_V)], normalised like the kernel.

Each variant is the Linformer low-rank K/V path (:class:`~flurka.attention.lowrank.LowRankKV`,
attribute ``seq_proj``, identical to ``linformer``'s) in front of its kernel constituent's own
``core`` — same feature map, same normaliser, same random-feature variables — so with
E1 = E2 = I (d_k = N) ``flurka-performer``/``flurka-rnn`` are exactly ``performer``/``rnn``, and
up-training copies every parameter path from either constituent.

Product order (per head; d_p = feature dim: m for performer, d_h for rnn):
  1. Q = X W_Q                                 [N, d_m] · [d_m, d_m]
  2. X1 = E1·(mask⊙X), X2 = E2·(mask⊙X)        [d_k, N] · [N, d_m]   (once if sharing="kv")
  3. K' = X1 W_K, V' = X2 W_V                  [d_k, d_m] · [d_m, d_m]
  4. φ(Q), φ(K')  (performer: Qω [N,d_h]·[d_h,m], K'ω [d_k,d_h]·[d_h,m], exp; rnn: elu+1)
  5. φ(K')ᵀ V'                                 [d_p, d_k] · [d_k, d_h]
  6. φ(Q) · (φ(K')ᵀV')                         [N, d_p] · [d_p, d_h]
  7. denominator φ(Q)·(φ(K')ᵀ1)                [N, d_p] · [d_p]
  8. out = concat_heads · W_O

``flurka-eva``: EVA (:mod:`flurka.attention.eva`) applied to the compressed sequence, as eq. 3
applies the kernel to it. A compressed row of pooled E summarises a block of positions, so the
compressed rows are the sequence at a coarser resolution: query t sits at compressed position
r(t) = ⌊t·d_k/L⌋ (L = max_len, E's length), and
  * exact part: the compressed rows are cut into windows of w' rows; query t attends exactly to
    the rows of the window holding r(t) (EVA's local window, in compressed coordinates);
  * control variates: the compressed rows are cut into chunks of c' rows, each summarised as in
    EVA (k̃_c = LN(Lin_k(k̄_c)), ω_c = ½(LN(Lin_q(q̄_c)) + k̃_c) + ε_c, β_c by self-normalised
    importance weights over the chunk's rows), q̄_c the mean of the real queries t whose r(t)
    lies in chunk c; every query sees every chunk, as in EVA;
  * one joint softmax over [window logits, chunk logits].
``window_size`` and ``chunk_size`` keep EVA's meaning — positions of the sequence — and are
scaled with d_k: w' = max(1, round(window_size·d_k/L)) rows, c' likewise, so the layer sees the
stretch of sequence EVA would, at the compressed resolution. With E = I and d_k = L it is EVA
exactly (tested). Cost, linear in N: N·(w' + C)·d_h for the logits and the weighted sums, plus
d_k·d_h for the chunk summaries (C = ⌈d_k/c'⌉ chunks, padded to lcm(w', c')). ``fused``: the chunk
half of the joint softmax in flash attention's Pallas kernel, joined with the window half
through their log-normalisers (EVA's fused path).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flurka.attention.base import F32, NEG_INF, contract, pad_to, round_up, zero_padding
from flurka.attention.eva import (CHUNK_SIZE, WINDOW_SIZE, EVAAttention, chunk_control_variates,
                                  joint_softmax)
from flurka.attention.lowrank import LowRankKV
from flurka.attention.performer import PerformerAttention
from flurka.attention.rnn import RNNAttention

Array = jax.Array


class FlurkaPerformer(LowRankKV, PerformerAttention):
    """Linformer-Performer: FAVOR+ on compressed keys/values."""

    mechanism = "flurka-performer"


class FlurkaRNN(LowRankKV, RNNAttention):
    """Linformer-RNN: elu+1 linear attention on compressed keys/values."""

    mechanism = "flurka-rnn"


def compressed_size(size: int, d_k: int, max_len: int) -> int:
    """A window or chunk of ``size`` positions in compressed rows: max(1, round(size·d_k/L))."""
    return max(1, (2 * size * d_k + max_len) // (2 * max_len))


def compressed_positions(n: int, d_k: int, max_len: int) -> np.ndarray:
    """r(t) = ⌊t·d_k/L⌋ for t < n, int32 [n]: where each query sits among the compressed rows
    (the row pooled E starts it in); clipped to the last row (an aligned input may run past L)."""
    return np.minimum(np.arange(n) * d_k // max_len, d_k - 1).astype(np.int32)


def compressed_eva_attention(q, k, v, query_mask, *, max_len: int, window_size: int,
                             chunk_size: int, mu_q, mu_k, noise=None, fused=None,
                             head_dim: int | None = None, row_mask=None):
    """flurka-eva's core (definition in the module docstring); ``window_size`` and ``chunk_size``
    in compressed rows (w', c').

    q: [b, n, h, d]; k, v: [b, d_k, h, d] compressed; query_mask [b, n] or None; ``max_len``:
    E's length L; noise None, [≥C, h, head_dim] or [b, ≥C, h, head_dim]; ``head_dim``: the
    true d_h where d is zero-padded past it (aligned layers); ``row_mask`` [b, d_k]: the
    compressed rows that see a real position (the rest, bias-only rows of padding, are masked
    and left out of their chunk's summary). Returns float32 [b, n, h, d] (``fused``: v's dtype);
    products take operands in q's dtype and accumulate in float32, as
    :func:`~flurka.attention.eva.eva_attention`.
    """
    b, n, h, d = q.shape
    m = k.shape[1]
    scale = (head_dim or d) ** -0.5
    w, c = window_size, chunk_size
    m_pad = round_up(m, math.lcm(w, c))
    rows = jnp.ones((b, m), bool) if row_mask is None else row_mask
    rows = pad_to(rows, m_pad)
    k, v = (zero_padding(pad_to(t, m_pad), rows) for t in (k, v))
    qmask = jnp.ones((b, n), bool) if query_mask is None else query_mask
    q = zero_padding(q, qmask)
    pos = compressed_positions(n, m, max_len)

    window = pos // w                                         # each query's window of rows
    kw, vw = (t.reshape(b, m_pad // w, w, h, d)[:, window] for t in (k, v))   # [b, n, w, h, d]
    local = contract("bnhd,bnjhd->bhnj", q, kw, q.dtype) * scale
    local = jnp.where(rows.reshape(b, m_pad // w, w)[:, None, window], local, NEG_INF)

    nc = m_pad // c
    kc, vc = (t.reshape(b, nc, c, h, d) for t in (k, v))
    mc = rows.reshape(b, nc, c)
    chunk = pos // c                                          # each query's chunk (for q̄)
    q_sum = jax.ops.segment_sum(q.astype(F32).transpose(1, 0, 2, 3), chunk, nc,
                                indices_are_sorted=True).transpose(1, 0, 2, 3)
    count = jax.ops.segment_sum(qmask.astype(F32).T, chunk, nc, indices_are_sorted=True).T
    q_bar = q_sum / jnp.maximum(count, 1.0)[..., None, None]
    if noise is not None:
        noise = noise[..., :nc, :, :]
    k_tilde, beta = chunk_control_variates(kc, vc, mc, q_bar, mu_q, mu_k, noise, head_dim)
    chunk_bias = jnp.where(jnp.any(mc, axis=-1), 0.0, NEG_INF)
    return joint_softmax(local, q, k_tilde, beta, chunk_bias, vw, scale, fused)


class FlurkaEVA(LowRankKV, EVAAttention):
    """Linformer-EVA: EVA's local window and chunk control variates on the compressed rows
    (module docstring); ``window_size`` and ``chunk_size`` in positions, as EVA's. ``fused``: the
    chunk half of the joint softmax as a Pallas kernel."""

    mechanism = "flurka-eva"

    def __init__(self, *, window_size: int = WINDOW_SIZE, chunk_size: int = CHUNK_SIZE,
                 fused: Any = False, fused_projections: bool = False, **kwargs):
        if fused_projections:
            raise ValueError("flurka-eva: fused_projections is not available: each query has a "
                             "window of its own, and the projected kernel takes one key set for "
                             "every query")
        super().__init__(window_size=window_size, chunk_size=chunk_size, fused=fused, **kwargs)

    @property
    def compressed_window(self) -> int:
        """w': the window in compressed rows."""
        return compressed_size(self.window_size, self.d_k, self.max_len)

    @property
    def compressed_chunk(self) -> int:
        """c': the chunk in compressed rows."""
        return compressed_size(self.chunk_size, self.d_k, self.max_len)

    def num_chunks(self) -> int:
        unit = math.lcm(self.compressed_window, self.compressed_chunk)
        return round_up(self.d_k, unit) // self.compressed_chunk

    def aligned_rows(self, xc):
        """Aligned, the compressed rows stay d_k: the windows and chunks are cut from the true
        rows (E·X still runs over the padded N and d_model)."""
        return xc

    def attend(self, x, mask, rng):
        q, k, v = self.low_rank_qkv(x, mask)
        return compressed_eva_attention(
            q, k, v, mask, max_len=self.max_len, window_size=self.compressed_window,
            chunk_size=self.compressed_chunk, mu_q=self.adaptive_mu_q, mu_k=self.adaptive_mu_k,
            noise=self.current_noise(q.shape[0], rng), fused=self.fused, head_dim=self.head_dim,
            row_mask=self.real_rows(x.shape[0], mask, x.shape[1]))
