"""Linformer sequence projections E1/E2 and the low-rank K/V path shared by ``linformer`` and
every ``flurka-*`` layer.

Order (paper §2/§3, fairseq's ``multihead_linear_attention``): compress the *input* over the
sequence first, then project: K' = (E1·X) W_K, V' = (E2·X) W_V, costs d_k·N·d_m + d_k·d_m·d_m each
(``sharing="kv"``: one E·X for both). Unlike fairseq, padded rows of X are zeroed before the
compression (E·(mask⊙X)), so padded content never reaches a real output — before W_Q too (the
padded rows' outputs are nobody's), so the step keeps one masked input, not two; E is sliced to the
actual length N (E[:, :N]). d_k ≤ max_len is checked at construction; d_k > N at call time is
allowed: the compressed K'/V' then have d_k rows of rank ≤ N (with E = I, d_k = N = max_len,
Linformer is exactly full attention).

E's initialisation (``e_init``): ``"pool"`` (the default) starts every row of E as the mean of
one contiguous block of positions (row i averages positions ⌊i·L/d_k⌋ … ⌊(i+1)·L/d_k⌋ − 1 of
max_len L): a compressed row starts as a local summary, which the keys of language and images
are, and trains from there. ``"gaussian"`` is the paper's (Linformer's) N(0, 1/d_k): every
compressed row a dense random signed mix of all positions, which trains to lower quality on the
small benchmarks (README's quality table). Pass ``e_init="gaussian"`` to reproduce the paper.

Padding: a compressed row whose E1 and E2 rows weigh no real position sees only padding: its key
and value are the projections' biases alone (K' = b_K, V' = b_V), content-free. Such rows are
masked out of the key set (:meth:`LowRankKV.compressed_mask`), so padding changes no output
whatever E is (random E has no zero rows; pooled E on a short sequence has many).

Sharing (Linformer §4 "parameter sharing", fairseq flags):
  ``"headwise"`` (default, fairseq's default): separate E1, E2 per layer, shared by all heads.
  ``"kv"``: one E for keys and values (fairseq ``--shared-kv-compressed``).
  ``"none"``: separate E1, E2 for every head (the paper's non-shared variant; E: [H, d_k, max_len]).
  Layerwise sharing (fairseq ``--shared-layer-kv-compressed``): build one :class:`SeqProjection`
  and pass it as ``seq_proj=`` to every layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flurka.attention.base import (
    check_positive_int, compress, pad_to, project_heads, round_up, zero_padding)
from flurka.catalogue.mechanisms import E_INITS

Array = jax.Array
SHARINGS = ("headwise", "kv", "none")


def linformer_init(d_k: int):
    """N(0, 1/d_k) — Linformer's E, F entries (paper §2)."""
    return jax.nn.initializers.normal(stddev=d_k ** -0.5)


def pool_matrix(d_k: int, length: int) -> np.ndarray:
    """[d_k, length] block means: row i averages positions ⌊i·length/d_k⌋ … ⌊(i+1)·length/d_k⌋−1
    (d_k ≤ length, so no block is empty)."""
    edges = (np.arange(d_k + 1) * length) // d_k
    e = np.zeros((d_k, length), np.float64)
    for i in range(d_k):
        e[i, edges[i]:edges[i + 1]] = 1.0 / (edges[i + 1] - edges[i])
    return e


def e_initializer(e_init: str, d_k: int):
    """An initializer ``(key, shape, dtype)`` for E [(H,) d_k, max_len]."""
    if e_init == "gaussian":
        return linformer_init(d_k)

    def pool(key, shape, dtype=jnp.float32):
        del key
        return jnp.broadcast_to(jnp.asarray(pool_matrix(shape[-2], shape[-1]), dtype), shape)
    return pool


class SeqProjection(nnx.Module):
    """E1 (``e1``) and E2 (``e2``; absent when ``sharing="kv"``), learned, [(H,) d_k, max_len]."""

    def __init__(self, *, d_k: int, max_len: int, num_heads: int = 1, sharing: str = "headwise",
                 e_init: str = "pool", rngs: nnx.Rngs, param_dtype=jnp.float32):
        check_positive_int("d_k", d_k)
        if sharing not in SHARINGS:
            raise ValueError(f"sharing must be one of {SHARINGS}, got {sharing!r}")
        if e_init not in E_INITS:
            raise ValueError(f"e_init must be one of {E_INITS}, got {e_init!r}")
        if d_k > max_len:
            raise ValueError(f"d_k={d_k} must be <= max_len={max_len}")
        self.d_k, self.max_len, self.sharing = d_k, max_len, sharing
        shape = (num_heads, d_k, max_len) if sharing == "none" else (d_k, max_len)
        init = e_initializer(e_init, d_k)
        self.e1 = nnx.Param(init(rngs.params(), shape, param_dtype))
        self.e2 = None if sharing == "kv" else nnx.Param(init(rngs.params(), shape, param_dtype))

    def matrices(self, n: int) -> tuple[Array, Array]:
        """(E1, E2) sliced to length n."""
        e1 = self.e1[...][..., :n]
        e2 = e1 if self.e2 is None else self.e2[...][..., :n]
        return e1, e2


class LowRankKV:
    """Mixin for an :class:`~flurka.attention.base.AttentionLayer`: adds ``seq_proj`` and replaces
    K, V by their compressed versions before the layer's own ``core`` (softmax for Linformer, the
    kernel for FLuRKA). ``core``'s key mask is :meth:`compressed_mask`: with a padding mask, the
    compressed rows that see only padding are masked."""

    def __init__(self, *, d_k: int | None = None, sharing: str = "headwise",
                 e_init: str = "pool", seq_proj: SeqProjection | None = None, **kwargs):
        if seq_proj is None:  # checked first (before any parameter is drawn)
            if d_k is None:
                raise ValueError(f"{self.mechanism}: d_k (the downsampling factor) is required")
            check_positive_int("d_k", d_k)
            if d_k > kwargs.get("max_len", d_k):
                raise ValueError(f"{self.mechanism}: d_k={d_k} must be <= "
                                 f"max_len={kwargs['max_len']}")
            if sharing not in SHARINGS:
                raise ValueError(f"{self.mechanism}: sharing must be one of {SHARINGS}, "
                                 f"got {sharing!r}")
            if e_init not in E_INITS:
                raise ValueError(f"{self.mechanism}: e_init must be one of {E_INITS}, "
                                 f"got {e_init!r}")
        self.d_k = d_k if seq_proj is None else seq_proj.d_k  # kernels may size buffers from it
        super().__init__(**kwargs)
        if seq_proj is None:
            seq_proj = SeqProjection(d_k=d_k, max_len=self.max_len, num_heads=self.num_heads,
                                     sharing=sharing, e_init=e_init, rngs=kwargs["rngs"],
                                     param_dtype=kwargs.get("param_dtype", jnp.float32))
        elif seq_proj.max_len < self.max_len:
            raise ValueError(f"{self.mechanism}: shared seq_proj has max_len={seq_proj.max_len} "
                             f"< layer max_len={self.max_len}")
        self.seq_proj = seq_proj

    def low_rank_qkv(self, x: Array, mask: Array | None) -> tuple[Array, Array, Array]:
        """Q, K', V' (:meth:`low_rank_kv`) from the layer's input. Its padded rows are zeroed
        once, before W_Q as well as before the compression (the padded rows' outputs are
        nobody's), so XLA keeps one masked normalised input, not a masked and an unmasked one."""
        x = zero_padding(x, mask)
        return (self.heads(self.query, x), *self.low_rank_kv(x))

    @property
    def fuses_norm(self) -> bool:
        """With ``fused_projections`` and one E per layer, the block's pre-attention LayerNorm
        runs inside the compression kernel and the projected query side
        (:mod:`flurka.kernels.compress`): x̂ never reaches memory."""
        return self.fused_projections and self.seq_proj.e1.ndim == 2

    def keys_values(self, x: Array, mask: Array | None) -> tuple[Array, Array, Array | None]:
        """K', V' and their key mask (compressed rows: none unless aligned); ``x``'s padded rows
        zeroed by the caller."""
        return (*self.low_rank_kv(x), self.compressed_mask(x.shape[0], mask, x.shape[1]))

    def low_rank_kv(self, x: Array) -> tuple[Array, Array]:
        """K' = (E1·X) W_K, V' = (E2·X) W_V as heads [b, d_k, h, d_h] (aligned:
        [b, round_up(d_k), h, padded d_h], the rows past d_k masked by :meth:`compressed_mask`);
        x: the layer's input with its padded rows zeroed (:func:`zero_padding`)."""
        e1, e2 = (self.aligned_e(e, x.shape[1]) for e in self.seq_proj.matrices(x.shape[1]))
        x1 = self.aligned_rows(compress(e1, x))
        x2 = x1 if self.seq_proj.e2 is None else self.aligned_rows(compress(e2, x))
        if e1.ndim == 3:  # per-head E: head h's compression through head h's W only
            return tuple(project_heads(p, xc, *self.head_weights(p, xc.shape[-1]),
                                       spec="bhkd,dhe->bkhe")
                         for p, xc in ((self.key, x1), (self.value, x2)))
        return self.heads(self.key, x1), self.heads(self.value, x2)

    def aligned_rows(self, xc: Array) -> Array:
        """The compressed input [b, (h,) d_k, d] with zero rows up to round_up(d_k) (aligned
        layers). Padded here (a few MB), not as zero rows of E, which would copy E on every call
        ([1536, 55 552] twice per N-sweep layer): E·X runs over E's d_k rows as stored, the row
        pitch (N) being what its GEMM needs aligned."""
        return xc if not self.align else pad_to(xc, round_up(self.d_k, self.align), axis=-2)

    def aligned_e(self, e: Array, n: int) -> Array:
        """E [(h,) d_k, ≤n] zero-padded to [(h,) d_k, n] (aligned layers: the padded input may be
        longer than max_len; its extra rows are zeros, so E's zeros there are exact). None of it
        is copied where the model is built for the padded length (a ``pad_to`` batch)."""
        if not self.align or e.shape[-1] == n:
            return e
        return pad_to(e, n, axis=-1)

    def seen_rows(self, mask: Array | None, n: int) -> Array:
        """[b, d_k] bool ([1, d_k] without a mask): the compressed rows whose E1 or E2 row weighs
        a real position of ``mask`` [b, n] (per-head E: in any head), or any of the n positions.
        The others are bias-only keys and values (pooled E sliced to a short n has such rows)."""
        e1, e2 = self.seq_proj.matrices(n)
        weighs = self.aligned_e(e1, n) != 0     # [(h,) d_k, n]: E1's or E2's entry is nonzero
        if self.seq_proj.e2 is not None:
            weighs = weighs | (self.aligned_e(e2, n) != 0)
        if weighs.ndim == 3:                    # per-head E: in any head
            weighs = jnp.any(weighs, axis=0)
        # a compare-and-reduce, not a product: no GEMM for the FLOP model or the bf16 policy
        if mask is None:
            return jnp.any(weighs, axis=-1)[None]
        return jnp.any(weighs[None] & mask[:, None, :], axis=-1)

    def compressed_mask(self, batch: int, mask: Array | None = None,
                        n: int | None = None) -> Array | None:
        """Key mask of the compressed rows [b, round_up(d_k)]: the rows that see a real position
        (:meth:`seen_rows`; all, without a mask) and are not aligned padding rows; None where
        every row is real."""
        d_k_pad = round_up(self.d_k, self.align)
        seen = self.real_rows(batch, mask, n or mask.shape[1])
        if seen is None:
            if d_k_pad == self.d_k:
                return None
            return jnp.broadcast_to(jnp.arange(d_k_pad) < self.d_k, (batch, d_k_pad))
        return pad_to(seen, d_k_pad, axis=1)

    def real_rows(self, batch: int, mask: Array | None, n: int) -> Array | None:
        """[b, d_k] :meth:`seen_rows`, or None where every row is real: no mask, and E as built
        for at least n positions (a row of E is zero over them only if trained so)."""
        if mask is None and not self.seq_proj.e1[...].shape[-1] > n:
            return None
        return jnp.broadcast_to(self.seen_rows(mask, n), (batch, self.d_k))

    def attend(self, x, mask, rng):
        q, k, v = self.low_rank_qkv(x, mask)
        return self.core(q, k, v, self.compressed_mask(x.shape[0], mask, x.shape[1]), rng)
