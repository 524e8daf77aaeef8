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

``flurka-eva``: EVA's local window has no meaning on compressed keys — a row of E1·X mixes every
position, so no compressed row is "near" a query. Definition used here, keeping EVA's structure
(exact softmax terms + chunk-level random-feature control variates in one joint softmax):
  * exact part: the first ``window_size`` compressed rows (default d_k // 4) are attended exactly by
    every query (a global window; which rows play this role is learned through E1/E2);
  * control variates: the remaining d_k − window_size rows are cut into chunks of ``chunk_size``,
    each summarised as in EVA (k̃_c = LN(Lin_k(k̄_c)), ω_c = ½(LN(Lin_q(q̄)) + k̃_c) + ε_c, β_c by
    self-normalised importance weights), where q̄ is the mean of the sequence's real queries
    (query chunks do not line up with compressed chunks);
  * one joint softmax over [window_size exact logits, chunk logits].
This is linear in N (cost N·(window_size + chunks)·d_h plus d_k·d_h for the chunk summaries),
reduces to ``linformer`` when window_size = d_k (no chunks; tested), and is pure RF control
variates when window_size = 0. Its product order: steps 1-3 above; chunk summaries on K', V'
(2 × [C, d_h]·[d_h, d_h], d_k·d_h for weights and β); logits Q·[K'_exact; k̃]ᵀ
([N, d_h]·[d_h, window_size + C]); joint softmax; A·[V'_exact; β] ([N, window_size + C]·[·, d_h]).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flurka.attention.base import F32, NEG_INF, pad_to, zero_padding
from flurka.attention.eva import EVAAttention, chunk_control_variates, masked_mean
from flurka.attention.fused import Tiling, fused_softmax_attention, reference_softmax_attention
from flurka.attention.fused_layer import SOFTMAX, ProjectedQuerySide
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


def compressed_key_set(k, v, q_bar, *, window_size: int, chunk_size: int, mu_q, mu_k,
                       noise=None, head_dim: int | None = None, row_mask=None):
    """flurka-eva's joint key set, which every query attends: its window's compressed rows and
    the chunk summaries (definition in the module docstring), (keys, values) [b, window_size + C,
    h, d] in k's and v's dtype. k, v: [b, d_k, h, d] compressed (all rows real); q_bar [b, h, ·]
    float32, the mean of the sequence's real queries (d wide, or the true ``head_dim``: the
    proposal reads only those columns); noise None, [≥C, h, head_dim] or [b, ≥C, h, head_dim].
    The short key sets are joined here (not the [N, ·] logits after the product: a concatenation
    pass over [b, h, N, window_size + C] float32 per layer). ``row_mask`` [b, d_k] bool or None:
    the compressed rows that see a real position (the rest are bias-only rows of padding, left
    out of their chunk's summary and, in the window, masked). Returns (keys, values, key mask
    [b, window_size + C] bool or None): a joint key is masked where its row, or every row of its
    chunk, sees only padding."""
    b, m, h, d = k.shape
    if row_mask is not None:   # the chunk summaries take masked rows as zeros
        k, v = (jnp.where(row_mask[:, :, None, None], t, jnp.zeros((), t.dtype)) for t in (k, v))
    keys, values = [k[:, :window_size]], [v[:, :window_size]]
    masks = [] if row_mask is None else [row_mask[:, :window_size]]
    rest = m - window_size
    if rest > 0:
        nc = -(-rest // chunk_size)
        kc, vc = (pad_to(t[:, window_size:], nc * chunk_size).reshape(b, nc, chunk_size, h, d)
                  for t in (k, v))
        real = jnp.ones((b, rest), bool) if row_mask is None else row_mask[:, window_size:]
        mc = pad_to(real, nc * chunk_size).reshape(b, nc, chunk_size)
        if row_mask is not None:
            masks.append(jnp.any(mc, axis=-1))
        if noise is not None:
            noise = noise[..., :nc, :, :]
        q_bar = jnp.broadcast_to(q_bar[:, None], (b, nc) + q_bar.shape[1:])
        k_tilde, beta = chunk_control_variates(kc, vc, mc, q_bar, mu_q, mu_k, noise, head_dim)
        keys.append(k_tilde.astype(k.dtype))
        values.append(beta.astype(v.dtype))
    key_mask = None if row_mask is None else jnp.concatenate(masks, axis=1)
    return jnp.concatenate(keys, axis=1), jnp.concatenate(values, axis=1), key_mask


def compressed_eva_attention(q, k, v, query_mask, *, window_size: int, chunk_size: int, mu_q,
                             mu_k, noise=None, fused=None, head_dim: int | None = None,
                             row_mask=None):
    """flurka-eva's core (definition in the module docstring).

    q: [b, n, h, d]; k, v: [b, d_k, h, d] compressed (all rows real); query_mask [b, n] or None;
    noise None, [≥C, h, head_dim] or [b, ≥C, h, head_dim]; ``head_dim``: the true d_h where d is
    zero-padded past it (aligned layers); ``row_mask`` [b, d_k]: the compressed rows that see a
    real position (:func:`compressed_key_set`). Returns float32 [b, n, h, d]; products take operands
    in q's dtype and accumulate in float32 (as :func:`~flurka.attention.eva.eva_attention`).
    ``fused`` (a :class:`~flurka.attention.fused.Tiling`): the query side — one softmax over
    the window_size + C keys — as one Pallas kernel (its gradient two more), its result in v's
    dtype.
    """
    b, n = q.shape[:2]
    q = zero_padding(q, query_mask)
    qmask = jnp.ones((b, n), bool) if query_mask is None else query_mask
    q_bar = masked_mean(q[:, None], qmask[:, None], axis=2)[:, 0]            # [b, h, d]
    keys, values, key_mask = compressed_key_set(
        k, v, q_bar, window_size=window_size, chunk_size=chunk_size, mu_q=mu_q, mu_k=mu_k,
        noise=noise, head_dim=head_dim, row_mask=row_mask)
    scale = (head_dim or q.shape[-1]) ** -0.5
    bias = None if key_mask is None else jnp.where(key_mask, 0.0, NEG_INF).astype(F32)
    if fused:
        return fused_softmax_attention(q, keys, values, scale=scale, bias=bias, tiling=fused,
                                       out_dtype=v.dtype)
    return reference_softmax_attention(q, keys, values, scale=scale, bias=bias)


class FlurkaEVA(LowRankKV, ProjectedQuerySide, EVAAttention):
    """Linformer-EVA: exact global window of compressed rows + chunk control variates.
    ``fused``: its query side (a softmax over the joint key set) as a Pallas kernel;
    ``fused_projections`` too: with W_Q and W_O in it (:mod:`flurka.attention.fused_layer`)."""

    mechanism = "flurka-eva"
    feature = SOFTMAX

    def __init__(self, *, window_size: int | None = None, chunk_size: int = 16,
                 fused: bool | Tiling = False, fused_projections: bool = False, **kwargs):
        super().__init__(window_size=window_size, chunk_size=chunk_size, fused=fused, **kwargs)
        self.init_projections(fused_projections)

    def check_window(self, window_size):
        if window_size is None:
            window_size = self.d_k // 4
        if not isinstance(window_size, int) or isinstance(window_size, bool) \
                or not 0 <= window_size <= self.d_k:
            raise ValueError(f"flurka-eva: window_size (exact compressed rows) must be an int in "
                             f"[0, d_k={self.d_k}], got {window_size!r}")
        return window_size

    def num_chunks(self) -> int:
        return -(-(self.d_k - self.window_size) // self.chunk_size)

    def aligned_rows(self, xc):
        """Aligned, the compressed rows stay d_k: its window and chunks are cut from the true
        rows (E·X still runs over the padded N and d_model)."""
        return xc

    def key_set(self, k, v, q_bar, rng, row_mask=None):
        """The projected kernel's side: (keys, values), and the keys' logit bias [b, J] where
        ``row_mask`` (:meth:`real_rows`) leaves compressed rows that see only padding — masked
        as :func:`compressed_eva_attention` masks them (pooled E on a padded batch has such
        rows)."""
        keys, values, key_mask = compressed_key_set(
            k, v, q_bar, window_size=self.window_size, chunk_size=self.chunk_size,
            mu_q=self.adaptive_mu_q, mu_k=self.adaptive_mu_k,
            noise=self.current_noise(k.shape[0], rng), head_dim=self.head_dim,
            row_mask=row_mask)
        if key_mask is None:
            return keys, values
        return keys, values, jnp.where(key_mask, 0.0, NEG_INF).astype(F32)

    def projected_key_side(self, x, mask, rng, norm=None):
        """(keys, values) for the projected kernel. Q never exists there, so q̄ — the mean of
        the real queries — is W_Q's image of the real rows' mean (Q is affine in x: the same
        up to rounding). ``norm``: x is the block's input, and x̂'s mean comes from the
        compression kernel, which sums its standardised rows as it loads them."""
        b, n, _ = x.shape
        if norm is not None:
            k, v, total = self.normalised_kv(x, norm, with_sum=True)
            x_bar = norm.real_mean(x, total)
        else:
            k, v = self.low_rank_kv(x)
            count = (jnp.full((b,), n, F32) if mask is None
                     else jnp.sum(mask, axis=1).astype(F32))
            x_bar = jnp.sum(x.astype(F32), axis=1) / jnp.maximum(count, 1.0)[:, None]
        q_bar = x_bar @ self.query.kernel[...].astype(F32)
        if self.query.bias is not None:
            q_bar = q_bar + self.query.bias[...].astype(F32)
        return self.key_set(k, v, q_bar.reshape(b, self.num_heads, self.head_dim), rng,
                            self.real_rows(b, mask, n))

    def attend(self, x, mask, rng):
        q, k, v = self.low_rank_qkv(x, mask)
        rows = self.real_rows(x.shape[0], mask, x.shape[1])
        return compressed_eva_attention(
            q, k, v, mask, window_size=self.window_size, chunk_size=self.chunk_size,
            mu_q=self.adaptive_mu_q, mu_k=self.adaptive_mu_k,
            noise=self.current_noise(q.shape[0], rng), fused=self.fused, head_dim=self.head_dim,
            row_mask=rows)
