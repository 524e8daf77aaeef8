"""Fused query side of kernel attention — the N-sized half of FLuRKA's core — as a Pallas kernel.

After the key side (φ(K')ᵀV' and φ(K')ᵀ1: d_k rows for FLuRKA, cheap) every query row needs
  φ(q) → φ(q)·KV [f×d] and φ(q)·Σφ(K) → their quotient.
XLA runs that as separate passes over [N, f] tensors (ωᵀq logits in float32, their row max, the
features, then two products reading the features again); this kernel does it per block of query
rows in one pass, so the logits and features never reach memory: it reads q and writes the output
(in the compute dtype, what W_O takes), once each — a last row block past N is masked, not the
operands padded and the output sliced, which cost two more passes over [N, d] (N = 52.5k in the
flash comparison is no multiple of 128).

Same maths as the XLA path (``feature_maps.favor_features``/``elu_features`` and
``query_side``), same precision policy (products on compute-dtype operands,
float32 accumulation, features rounded to the compute dtype), so that path is the reference the
kernels are tested against, forward and gradient.

The backward is a second kernel (flash attention's recipe: keep the output, recompute the rest):
per block of query rows it recomputes φ(q) and the denominator, and with
δ = Σ_d g·out it forms ∂num = g / D, ∂den = −δ / D, ∂φ = ∂num·KVᵀ + ∂den·Σφ(K)ᵀ, then
dq through the feature map, and accumulates φᵀ·∂num (→ dKV) and φᵀ·∂den (→ dΣφ(K)) over its
``bwd_rows`` rows; XLA sums those per-program partials. So training never materialises [N, f]
either. ω is a fixed random draw (never trained): the fused query side treats it as a constant.

Pallas's Triton backend on GPU; elsewhere (CPU tests) Pallas's interpreter runs the same kernel.
Triton loads power-of-two blocks and its dots need sides ≥ 16, so the head dim and the feature
count are zero-padded (:func:`tile_size`; exact — the padded features are masked) to a power of two
≥ 16 up to 128, and above that to a multiple of 128 that the kernels walk in 128-wide blocks: the
appendix-C flash comparison (d_h = m = 128) runs as one block, the N-sweep's d_h = m = 325 as
3 × 3 blocks of 128 (384, what ``align=128`` pads to anyway) in a kernel of its own
(:func:`_wide_kernel`: 64-row programs for Hopper's warpgroup MMA, where the one-block kernel's
layout spills registers unless it runs 16 rows on the older per-warp MMA). Wide query sides have
the forward kernel only: the backward kernel keeps a program's dKV [f, d] in float32, which past
128 × 128 no longer fits a GPU's registers, so their gradient is the XLA path's.

With ``fused_projections`` the layer's W_Q and W_O join this kernel
(:mod:`flurka.kernels.projected_layer`: q and the per-head context never reach memory).

The EVAs' chunk half is a softmax, not a kernel feature map: one softmax over a short key set
every query sees, the chunk summaries (EVA's N / chunk_size, flurka-eva's over its compressed
rows; empty chunks masked by a key bias). :func:`fused_softmax_attention` runs it as flash
attention does (online softmax over 64-key steps, :func:`online_softmax`; backward: dq per row
block, dK and dV per key block, from each row's saved log-sum-exp), same tiling and masking,
returning each row's log-sum-exp too, through which the layer joins it with its windows' softmax
exactly (:func:`flurka.attention.eva.joint_softmax`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flurka.attention.base import F32, contract, pad_to, round_up
from flurka.attention.feature_maps import (
    FAVOR_EPS, elu_features, favor_denominator, favor_features, query_side, rnn_denominator)

Array = jax.Array
FEATURES = ("favor", "elu")
BLOCK = 128        # widest kernel block on the head-dim and feature sides (Triton flash's d_h)
MAX_WIDTH = 512    # widest fused head dim / feature count: 4 blocks, [f, d] = 16 KV blocks


@dataclasses.dataclass(frozen=True)
class Tiling:
    """How the two kernels are launched — the knobs a GPU tunes (``benchmarks/gpu_session.py
    --tune-fused``), none of which changes the result. Rows are powers of two ≥ 16 (Triton's dots);
    warps None: 8 once a [rows, 128] float32 tile is live (Triton flash attention's choice at head
    dim 128), else 4. The forward of wide query sides (head dim or features past 128) has its
    own launch (``wide_*``): 64 rows is the fewest Hopper's warpgroup MMA (wgmma) takes — below,
    Triton falls back to per-warp mma.sync — and on 8 warps they spill least. The softmax
    kernel past one block wide (the EVAs' chunk summaries) is another kernel,
    so it has a launch of its own (``softmax_*``), tuned on it; ptxas's registers
    and spills for each option: ``make aot ARGS="--target h100 --tilings"``, recorded in
    benchmarks/results/h100/NOTES.md. Which is fastest is the card's to say."""

    block_n: int = 128      # query rows per forward program (at widths ≤ 128)
    num_warps: int | None = None
    # Backward step: smaller, its [rows, f] float32 tiles are several (φ, ∂φ, slope) beside the
    # [f, d] dKV accumulator: at 64 rows FAVOR+ spills (ptxas), at 32 nothing does.
    bwd_block_n: int = 32
    bwd_rows: int = 1024    # query rows per backward program: fewer programs, fewer partials
    bwd_num_warps: int | None = None
    num_stages: int = 2
    wide_block_n: int = 64  # query rows per forward program past one block wide
    wide_num_warps: int = 8
    wide_num_stages: int = 1
    softmax_block_n: int = 64  # the softmax's, past one block wide
    softmax_num_warps: int = 8
    softmax_num_stages: int = 1  # at 64 rows x 384: 2 stages overflow shared memory

    def __post_init__(self):
        for name in ("block_n", "bwd_block_n", "bwd_rows", "wide_block_n", "softmax_block_n"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 16 or value & (value - 1):
                raise ValueError(f"Tiling.{name} must be a power of two >= 16, got {value!r}")
        if self.bwd_rows < self.bwd_block_n:
            raise ValueError(f"Tiling.bwd_rows ({self.bwd_rows}) must be >= bwd_block_n "
                             f"({self.bwd_block_n})")
        for name in ("num_warps", "bwd_num_warps", "wide_num_warps", "softmax_num_warps"):
            if getattr(self, name) not in (None, 1, 2, 4, 8, 16):
                raise ValueError(f"Tiling.{name} must be None or 1, 2, 4, 8, 16, "
                                 f"got {getattr(self, name)!r}")
        for name in ("num_stages", "wide_num_stages", "softmax_num_stages"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Tiling.{name} must be an int >= 1, got {getattr(self, name)!r}")


class TilingScope:
    """The launch shape kernels built now take: ``use(t)`` sets it inside a ``with`` block (a GPU
    session's tuned choice), ``current()`` reads it. Layers read it at construction and keep it;
    a bare kernel call reads it when traced, so a jitted function already traced keeps the
    tiling it was traced with."""

    def __init__(self, default):
        self._stack = [default]

    @contextlib.contextmanager
    def use(self, tiling):
        self._stack.append(tiling)
        try:
            yield tiling
        finally:
            self._stack.pop()

    def current(self):
        return self._stack[-1]


# Fused layers built inside ``use_tiling(t)`` launch their kernels with t (:func:`layer_tiling`).
_SCOPE = TilingScope(Tiling())
use_tiling, current_tiling = _SCOPE.use, _SCOPE.current


def layer_tiling(mechanism: str, fused: bool | Tiling, head_dim: int,
                 num_features: int | None = None) -> Tiling | None:
    """A layer's ``fused`` option, resolved at construction: None (the XLA path), the given
    :class:`Tiling`, or for ``True`` the one :func:`use_tiling` sets now. The layer keeps it as a
    static attribute, so a jitted step traced for one tiling is never reused for another."""
    if not fused:
        return None
    check_fusable(mechanism, head_dim, num_features)
    return fused if isinstance(fused, Tiling) else current_tiling()


def check_fusable(mechanism: str, head_dim: int, num_features: int | None = None) -> None:
    """Clear error (at construction, before any compute) for sizes the kernel does not take."""
    for name, size in (("head dim", head_dim), ("num_features", num_features)):
        if size is not None and size > MAX_WIDTH:
            raise ValueError(f"{mechanism}: fused=True takes a {name} (after any align padding) "
                             f"up to {MAX_WIDTH} (a program holds its rows' logits and all of "
                             f"KV), got {size}; use the XLA path (fused=False)")


def tile_size(size: int) -> int:
    """What a head dim or feature count is zero-padded to in the kernels: a power of two ≥ 16
    (Triton's blocks and dots) up to :data:`BLOCK`, a multiple of it above."""
    return max(16, pl.next_power_of_2(size)) if size <= BLOCK else round_up(size, BLOCK)


def column_blocks(size: int) -> list:
    """Static column blocks of a tiled side: one up to :data:`BLOCK`, else BLOCK-wide ones."""
    width = min(size, BLOCK)
    return [pl.ds(i * width, width) for i in range(size // width)]


def _launch(tiling: Tiling, width: int, softmax: bool = False) -> tuple[int, int | None, int]:
    """(rows per program, warps, stages) of a forward kernel whose query side is ``width``
    wide: the one-block launch, or past BLOCK the wide one (the softmax kernel's own)."""
    if width <= BLOCK:
        return tiling.block_n, tiling.num_warps, tiling.num_stages
    if softmax:
        return tiling.softmax_block_n, tiling.softmax_num_warps, tiling.softmax_num_stages
    return tiling.wide_block_n, tiling.wide_num_warps, tiling.wide_num_stages


def summed(terms):
    return functools.reduce(operator.add, terms)


def reference_query_side(q, kv, k_sum, omega, *, feature: str, head_dim: int,
                         num_features: int | None):
    """The XLA path's query half (what the kernel computes); float32 [b, n, h, d]."""
    if feature == "favor":
        feat = functools.partial(favor_features, omega=omega, is_query=True, head_dim=head_dim,
                                 num_features=num_features)
        return query_side(q, feat, kv, k_sum, favor_denominator, q.dtype)
    return query_side(q, functools.partial(elu_features, head_dim=head_dim), kv, k_sum,
                      rnn_denominator, q.dtype)


def dot(a, b, contracting=((1,), (0,))):
    """a·b (default), aᵀ·b (((0,), (0,))) or a·bᵀ (((1,), (1,))), float32 accumulation."""
    return jax.lax.dot_general(a, b, (contracting, ((), ())), preferred_element_type=F32)


def row_features(q, omega_t, feature_blocks, feature, head_dim, num_features):
    """φ(q) per feature block, float32 [rows, block] (padded features zero), and ∂φ/∂logit (favor:
    the features without their eps, the stabiliser being a constant) or ∂φ/∂q (elu) —
    favor_features/elu_features' maths on one row block. ``q``: the rows' head-dim blocks;
    ``omega_t(c, j)``: ωᵀ's block (head-dim block c, feature block j). The favor stabiliser is
    the row's max over all feature blocks; elu's features are elementwise (block j is q's)."""
    real = [jax.lax.broadcasted_iota(jnp.int32, (1, j.size), 1) + j.start
            < (num_features or head_dim) for j in feature_blocks]
    if feature == "favor":
        sq = summed(jnp.sum(jnp.square(qc.astype(F32)), axis=1, keepdims=True) for qc in q)
        logits = [jnp.where(r, head_dim ** -0.25 * summed(dot(qc, omega_t(c, j))
                                                          for c, qc in enumerate(q))
                            - 0.5 * head_dim ** -0.5 * sq, -jnp.inf)
                  for j, r in enumerate(real)]
        top = functools.reduce(jnp.maximum, [jnp.max(x, axis=1, keepdims=True) for x in logits])
        slopes = [num_features ** -0.5 * jnp.exp(x - top) for x in logits]
        feats = [x + num_features ** -0.5 * FAVOR_EPS for x in slopes]
    else:
        qf = [qc.astype(F32) for qc in q]
        slopes = [jnp.where(x > 0, 1.0, jnp.exp(x)) for x in qf]                # elu'(q)
        feats = [jnp.where(x > 0, x + 1.0, jnp.exp(x)) for x in qf]             # elu(q) + 1
    return ([jnp.where(r, x, 0.0) for r, x in zip(real, feats)],
            [jnp.where(r, x, 0.0) for r, x in zip(real, slopes)])


def _split_refs(refs, feature):
    """(q_ref, omega_t_ref or None, *rest): the elu kernels take no ω."""
    if feature == "favor":
        return refs
    return (refs[0], None, *refs[1:])


def real_rows(start, rows: int, n: int):
    """[rows, 1] mask of the rows from ``start`` that exist (< ``n``)."""
    return start + jax.lax.broadcasted_iota(jnp.int32, (rows, 1), 0) < n


def program_rows(block_n: int, n: int, axis: int = 2):
    """The real-row mask of this program's block of ``block_n`` rows (grid axis ``axis`` walks
    the rows: the query-side kernels' last); None where every block is whole."""
    return real_rows(pl.program_id(axis) * block_n, block_n, n) if n % block_n else None


def block_slice(i, width: int = BLOCK):
    """The ``i``-th ``width``-wide block of an axis (``i`` traced: a loop's index)."""
    return pl.ds(pl.multiple_of(i * width, width), width)


def row_vector(v, dtype):
    """A [d] parameter as the [1, d] block a kernel loads, in the compute dtype."""
    return v.astype(dtype)[None, :]


def masked_load(ref, real):
    """``ref``'s block, zero in the rows ``real`` (None: all) marks as past the array."""
    return plgpu.load(ref, mask=real, other=None if real is None else 0)


def row_columns(refs, rows, real):
    """Per-row float32 vectors (statistics, keep, lse, δ) of a block of rows as [rows, 1]
    columns (None for an absent ref)."""
    mask = None if real is None else real[:, 0]
    return [None if ref is None else masked_load(ref.at[rows], mask)[:, None] for ref in refs]


def _kernel(*refs, feature, head_dim, num_features, denominator, n):
    """One program: a block of query rows, one block wide (wider: :func:`_wide_kernel`).
    The last block may run past the ``n`` real rows: its loads and stores are masked there
    (rather than the operands padded and the output sliced: two more passes over [N, d])."""
    q_ref, omega_t_ref, kv_ref, k_sum_ref, o_ref = _split_refs(refs, feature)
    fb, db = column_blocks(kv_ref.shape[0]), column_blocks(kv_ref.shape[1])
    block_n = q_ref.shape[0]
    real = program_rows(block_n, n)
    q = [masked_load(q_ref.at[:, c], real) for c in db]  # [bn, ≤128] compute dtype
    feats, _ = row_features(q, lambda c, j: omega_t_ref[db[c], fb[j]], fb, feature, head_dim,
                            num_features)
    feats = [x.astype(q[0].dtype) for x in feats]
    den = denominator(summed(jnp.sum(x.astype(F32) * k_sum_ref[:, j].astype(F32), axis=1,
                                      keepdims=True) for x, j in zip(feats, fb)))
    for c in db:
        out = summed(dot(x, kv_ref[j, c]) for x, j in zip(feats, fb)) / den
        plgpu.store(o_ref.at[:, c], out.astype(o_ref.dtype), mask=real)


def _wide_kernel(*refs, feature, head_dim, num_features, denominator, n):
    """:func:`_kernel` for query sides past one block wide, in programs of ``wide_block_n``
    rows (64 for Hopper's warpgroup MMA) that keep little float32 state live: first every feature
    block in the compute dtype (what the products take), one float32 logit block at a time,
    then each output block in turn (one [rows, 128] accumulator). FAVOR+'s stabiliser is then a
    running max, as in flash attention's softmax: block j's features are exp(logit - M_j), M_j
    the row's max so far, and their products are scaled by exp(M_j - top) once the row's max
    ``top`` is known; the features' eps, which that scaling must not touch, enters at the end
    through Σ_j KV_j (``kv_sum_ref``) and Σ_j Σφ(K)_j. The features are rounded before that
    scaling, not after (as the XLA path and :func:`_kernel` do): the same within the compute
    dtype's rounding. elu's features are elementwise: recomputed from q per output block."""
    if feature == "favor":
        q_ref, omega_t_ref, kv_ref, k_sum_ref, kv_sum_ref, o_ref = refs
    else:
        q_ref, kv_ref, k_sum_ref, o_ref = refs
    fb, db = column_blocks(kv_ref.shape[0]), column_blocks(kv_ref.shape[1])
    block_n = q_ref.shape[0]
    real = program_rows(block_n, n)
    columns = [jax.lax.broadcasted_iota(jnp.int32, (1, j.size), 1) + j.start for j in fb]
    if feature == "favor":
        q = [masked_load(q_ref.at[:, c], real) for c in db]  # [bn, 128] compute dtype
        sq = summed(jnp.sum(jnp.square(qc.astype(F32)), axis=1, keepdims=True) for qc in q)
        feats, tops, top = [], [], jnp.full((block_n, 1), -jnp.inf, F32)
        for j, column in zip(fb, columns):
            logit = jnp.where(column < num_features,
                              head_dim ** -0.25 * summed(dot(qc, omega_t_ref[db[c], j])
                                                         for c, qc in enumerate(q))
                              - 0.5 * head_dim ** -0.5 * sq, -jnp.inf)
            top = jnp.maximum(top, jnp.max(logit, axis=1, keepdims=True))
            feats.append(jnp.exp(logit - top).astype(q_ref.dtype))
            tops.append(top)
        scales = [jnp.exp(t - top) for t in tops]                        # [bn, 1] each, ≤ 1
        feat = lambda i: feats[i]  # noqa: E731
    else:                           # elu's feature block j is q's block j: recomputed, not kept
        def feat(i):
            x = masked_load(q_ref.at[:, fb[i]], real).astype(F32)
            return jnp.where(columns[i] < head_dim, jnp.where(x > 0, x + 1.0, jnp.exp(x)),
                             0.0).astype(q_ref.dtype)
        scales = [1.0] * len(fb)
    den = summed(r * jnp.sum(feat(i).astype(F32) * k_sum_ref[:, j].astype(F32), axis=1,
                              keepdims=True) for i, (r, j) in enumerate(zip(scales, fb)))
    if feature == "favor":                          # φ = m^-½ (exp(logit - top) + eps)
        den = num_features ** -0.5 * (den + FAVOR_EPS * summed(
            jnp.sum(k_sum_ref[:, j].astype(F32), axis=1, keepdims=True) for j in fb))
    den = denominator(den)
    for c in db:
        out = summed(r * dot(feat(i), kv_ref[j, c]) for i, (r, j) in enumerate(zip(scales, fb)))
        if feature == "favor":
            out = num_features ** -0.5 * (out + FAVOR_EPS * kv_sum_ref[:, c])
        plgpu.store(o_ref.at[:, c], (out / den).astype(o_ref.dtype), mask=real)


def query_side_gradient(q, g, out, kv, k_sum, omega_t, *, feature, head_dim, num_features,
                        denominator):
    """In a kernel: one block of rows' share of the query side's gradient — (dq float32
    [rows, d], its φᵀ·∂num [f, d] and Σ_rows φ·∂den [1, f] partials, the context ``out``). ``q``
    and ``out`` in the compute dtype as the forward had them (``out`` None: recomputed here as
    the forward rounds it); ``g`` float32 [rows, d]; KV [f, d], Σφ(K) [1, f], ωᵀ [d, f] or
    None."""
    f = kv.shape[0]
    (feat,), (slope,) = row_features([q], lambda c, j: omega_t, column_blocks(f), feature,
                                     head_dim, num_features)
    feat = feat.astype(q.dtype)                                          # as the forward used it
    den = denominator(jnp.sum(feat.astype(F32) * k_sum.astype(F32), axis=1, keepdims=True))
    if out is None:
        out = (dot(feat, kv) / den).astype(q.dtype)
    inv = 1.0 / den                                                      # D' = 1 for both maps
    d_num = (g * inv).astype(q.dtype)                                    # [rows, d]
    d_den = -jnp.sum(g * out.astype(F32), axis=1, keepdims=True) * inv   # [rows, 1]
    d_feat = dot(d_num, kv, ((1,), (1,))) + d_den * k_sum.astype(F32)    # [rows, f]
    d_logit = d_feat * slope
    if feature == "favor":   # logit = d^-¼ qωᵀ − d^-½ |q|²/2
        dq = (head_dim ** -0.25 * dot(d_logit.astype(q.dtype), omega_t, ((1,), (1,)))
              - head_dim ** -0.5 * q.astype(F32) * jnp.sum(d_logit, axis=1, keepdims=True))
    else:                    # φ is elementwise: f = d
        dq = d_logit
    return (dq, dot(feat, d_num, ((0,), (0,))),
            jnp.sum(feat.astype(F32) * d_den, axis=0, keepdims=True), out)


def _bwd_kernel(*refs, feature, head_dim, num_features, denominator, block_n, n):
    """One program: ``bwd_rows`` query rows in steps of ``block_n``; writes their dq and its
    partial dKV [f, d] and dΣφ(K) [1, f]. Query sides up to one block wide (see :func:`_fused_bwd`).
    Rows past ``n`` load as zeros (a zero cotangent adds nothing to the partials) and store
    nothing."""
    q_ref, omega_t_ref, kv_ref, k_sum_ref, out_ref, g_ref, dq_ref, dkv_ref, dk_sum_ref = \
        _split_refs(refs, feature)
    f, d = kv_ref.shape
    program_rows = q_ref.shape[0]
    first = pl.program_id(2) * program_rows   # outside the loop: the interpreter needs it there
    kv, k_sum = kv_ref[...], k_sum_ref[...]                              # compute dtype
    omega_t = None if omega_t_ref is None else omega_t_ref[...]

    def step(i, partials):
        rows = block_slice(i, block_n)
        real = real_rows(first + i * block_n, block_n, n) if n % program_rows else None
        dq, dkv, dk_sum, _ = query_side_gradient(
            masked_load(q_ref.at[rows, :], real), masked_load(g_ref.at[rows, :], real).astype(F32),
            masked_load(out_ref.at[rows, :], real), kv, k_sum, omega_t, feature=feature,
            head_dim=head_dim, num_features=num_features, denominator=denominator)
        plgpu.store(dq_ref.at[rows, :], dq.astype(dq_ref.dtype), mask=real)
        return partials[0] + dkv, partials[1] + dk_sum

    dkv, dk_sum = jax.lax.fori_loop(0, program_rows // block_n, step,
                                    (jnp.zeros((f, d), F32), jnp.zeros((1, f), F32)))
    dkv_ref[...] = dkv
    dk_sum_ref[...] = dk_sum


def feature_denominator(feature):
    """The denominator function of ``feature``'s query side (FAVOR+'s or the RNN's)."""
    return favor_denominator if feature == "favor" else rnn_denominator


def _compiler_params(d, f, num_warps, num_stages):
    return plgpu.CompilerParams(num_warps=num_warps or (8 if max(d, f) >= 128 else 4),
                                num_stages=num_stages)


def _head_operands(q, kv, k_sum, omega, feature):
    """ω [d, f] (favor), KV [b, h, f, d] and Σφ(K) [b, h, 1, f] in the compute dtype, with their
    block specs (whole per head) for a (batch, head, row-block) grid."""
    d, f = q.shape[-1], kv.shape[2]
    operands = [kv.astype(q.dtype), k_sum.astype(q.dtype)[:, :, None, :]]
    specs = [pl.BlockSpec((pl.squeezed, pl.squeezed, f, d), lambda i, j, k: (i, j, 0, 0)),
             pl.BlockSpec((pl.squeezed, pl.squeezed, 1, f), lambda i, j, k: (i, j, 0, 0))]
    if feature == "favor":
        operands.insert(0, omega.astype(q.dtype).T)
        specs.insert(0, pl.BlockSpec((d, f), lambda i, j, k: (0, 0)))
    return operands, specs


def _row_spec(rows, d):
    return pl.BlockSpec((pl.squeezed, rows, pl.squeezed, d), lambda i, j, k: (i, k, j, 0))


def _pallas_query_side(q, kv, k_sum, omega, feature, head_dim, num_features, tiling, out_dtype,
                       *, interpret):
    b, n, h, d = q.shape
    operands, specs = _head_operands(q, kv, k_sum, omega, feature)
    width = max(d, kv.shape[2])
    block_n, num_warps, num_stages = _launch(tiling, width)
    kernel = _kernel if width <= BLOCK else _wide_kernel
    if width > BLOCK and feature == "favor":   # Σ_j KV_j, as the kernel reads KV (compute dtype)
        operands.append(kv.astype(q.dtype).astype(F32).sum(axis=2)[:, :, None, :])
        specs.append(pl.BlockSpec((pl.squeezed, pl.squeezed, 1, d), lambda i, j, k: (i, j, 0, 0)))
    return pl.pallas_call(
        functools.partial(kernel, feature=feature, head_dim=head_dim, num_features=num_features,
                          denominator=feature_denominator(feature), n=n),
        out_shape=jax.ShapeDtypeStruct((b, n, h, d), out_dtype),
        grid=(b, h, pl.cdiv(n, block_n)), in_specs=[_row_spec(block_n, d), *specs],
        out_specs=_row_spec(block_n, d),
        compiler_params=_compiler_params(d, kv.shape[2], num_warps, num_stages),
        interpret=interpret, name=f"flurka_{feature}_query_side")(q, *operands)


def _pallas_query_side_bwd(q, kv, k_sum, omega, out, g, feature, head_dim, num_features,
                           tiling, *, interpret):
    """(dq, dKV, dΣφ(K)) of the query side, given its output ``out`` and cotangent ``g``."""
    b, n, h, d = q.shape
    f = kv.shape[2]
    block_n = tiling.bwd_block_n
    rows = min(tiling.bwd_rows, pl.next_power_of_2(round_up(n, block_n)))
    chunks = pl.cdiv(n, rows)
    operands, specs = _head_operands(q, kv, k_sum, omega, feature)
    row = _row_spec(rows, d)
    partial_spec = lambda *shape: pl.BlockSpec((pl.squeezed,) * 3 + shape,  # noqa: E731
                                               lambda i, j, k: (i, j, k, 0, 0))
    dq, dkv, dk_sum = pl.pallas_call(
        functools.partial(_bwd_kernel, feature=feature, head_dim=head_dim,
                          num_features=num_features, denominator=feature_denominator(feature),
                          block_n=block_n, n=n),
        out_shape=(jax.ShapeDtypeStruct((b, n, h, d), q.dtype),
                   jax.ShapeDtypeStruct((b, h, chunks, f, d), F32),
                   jax.ShapeDtypeStruct((b, h, chunks, 1, f), F32)),
        grid=(b, h, chunks), in_specs=[row, *specs, row, row],
        out_specs=(row, partial_spec(f, d), partial_spec(1, f)),
        compiler_params=_compiler_params(d, f, tiling.bwd_num_warps, tiling.num_stages),
        interpret=interpret,
        name=f"flurka_{feature}_query_side_bwd")(q, *operands, out, g)
    return dq, dkv.sum(axis=2), dk_sum.sum(axis=(2, 3))


def on_gpu_or_interpreted(call, interpret):
    """``call(interpret=False)`` (the Triton kernel) when lowered for a GPU, Pallas's interpreter
    elsewhere — chosen at lowering, so a CPU host can lower the GPU program; ``interpret=True``
    forces the interpreter."""
    if interpret:
        return call(interpret=True)
    return jax.lax.platform_dependent(cuda=lambda: call(interpret=False),
                                      default=lambda: call(interpret=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _fused(q, kv, k_sum, omega, feature, head_dim, num_features, tiling, out_dtype, interpret):
    return _fused_fwd(q, kv, k_sum, omega, feature, head_dim, num_features, tiling, out_dtype,
                      interpret)[0]


def _fused_fwd(q, kv, k_sum, omega, feature, head_dim, num_features, tiling, out_dtype,
               interpret):
    out = on_gpu_or_interpreted(functools.partial(
        _pallas_query_side, q, kv, k_sum, omega, feature, head_dim, num_features, tiling,
        out_dtype), interpret)
    return out, (q, kv, k_sum, omega, out)


def _fused_bwd(feature, head_dim, num_features, tiling, out_dtype, interpret, saved, g):
    q, kv, k_sum, omega, out = saved
    if max(q.shape[-1], kv.shape[2]) > BLOCK:   # wide: the XLA path's gradient (module docstring)
        _, vjp = jax.vjp(functools.partial(reference_query_side, omega=omega, feature=feature,
                                           head_dim=head_dim, num_features=num_features),
                         q, kv, k_sum)
        return (*vjp(g.astype(F32)), jnp.zeros_like(omega))
    dq, dkv, dk_sum = on_gpu_or_interpreted(functools.partial(
        _pallas_query_side_bwd, q, kv, k_sum, omega, out, g, feature, head_dim, num_features,
        tiling), interpret)
    return dq, dkv.astype(kv.dtype), dk_sum.astype(k_sum.dtype), jnp.zeros_like(omega)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_query_side(q: Array, kv: Array, k_sum: Array, omega: Array | None = None, *,
                     feature: str, head_dim: int, num_features: int | None = None,
                     interpret: bool = False, tiling: Tiling | bool | None = None,
                     out_dtype=F32) -> Array:
    """φ(q)·KV / denominator(φ(q)·Σφ(K)) in one kernel; [b, n, h, d] in ``out_dtype`` (float32
    unless the caller only wants the compute dtype: a layer's W_O takes that, and writing it
    halves the kernel's output); differentiable in q, kv and k_sum by the backward kernel (ω is
    held constant).

    q [b, n, h, d] (compute dtype; d may be zero-padded past ``head_dim``); kv [b, h, f, d] and
    k_sum [b, h, f] from the key side; omega [f, d] for ``feature="favor"`` (rows past
    ``num_features`` zero). d and f are zero-padded here to :func:`tile_size`. Off the GPU (or
    with ``interpret=True``) Pallas's interpreter runs the kernels. ``tiling``: their launch
    shape (anything but a :class:`Tiling`, e.g. a layer's ``fused=True``: :func:`current_tiling`).
    """
    if feature not in FEATURES:
        raise ValueError(f"feature must be one of {FEATURES}, got {feature!r}")
    d, f = q.shape[-1], kv.shape[2]
    td, tf = tile_size(d), tile_size(f)
    if omega is None:
        omega = jnp.zeros((0,), q.dtype)  # unused by the elu kernels; a leaf for the custom VJP
    elif (f, d) != (tf, td):
        omega = _pad(_pad(omega, tf, 0), td, 1)
    out = _fused(_pad(q, td, 3), _pad(_pad(kv, tf, 2), td, 3), _pad(k_sum, tf, 2),
                 jax.lax.stop_gradient(omega), feature, head_dim, num_features,
                 tiling if isinstance(tiling, Tiling) else current_tiling(),
                 jnp.dtype(out_dtype), interpret)
    return out if td == d else out[..., :d]


# The EVAs' chunk half: exact softmax over a short key set shared by every query (the chunk
# summaries) — flash attention's online softmax over key blocks, per block of query rows.
KEY_BLOCK = 64     # keys per step: a [rows, 64] float32 logit tile beside the [rows, d] output


def _logits(q, k, first, keys, scale, bias=None):
    """scale · q kᵀ (+ the keys' ``bias`` [1, KEY_BLOCK]; float32 [rows, KEY_BLOCK]) against
    the key block from key ``first``, keys past ``keys`` −inf; ``q`` and ``k``: their head-dim
    blocks, in the same order."""
    logits = scale * summed(dot(qc, kc, ((1,), (1,))) for qc, kc in zip(q, k))
    if bias is not None:
        logits = logits + bias
    column = first + jax.lax.broadcasted_iota(jnp.int32, (1, KEY_BLOCK), 1)
    return jnp.where(column < keys, logits, -jnp.inf)


def _key_rows(i):
    """Key block ``i``'s rows."""
    return block_slice(i, KEY_BLOCK)


def online_softmax(q, key_block, value_block, key_blocks: int, keys: int, scale: float,
                   key_bias=None):
    """A block of query rows (``q``: its head-dim blocks) against ``key_blocks`` blocks of
    :data:`KEY_BLOCK` keys, the first ``keys`` real: flash attention's running max ``top``,
    ``total`` (Σ exp(logit − top)) [rows, 1] and the unnormalised output's head-dim blocks,
    float32. ``key_block(rows)``/``value_block(rows)``: those keys' and values' head-dim blocks
    (compute dtype); ``key_bias(rows)``: their logit bias [1, KEY_BLOCK] (None: none)."""
    def step(i, carry):
        top, total, acc = carry
        rows = _key_rows(i)
        logits = _logits(q, key_block(rows), i * KEY_BLOCK, keys, scale,
                         None if key_bias is None else key_bias(rows))
        new_top = jnp.maximum(top, jnp.max(logits, axis=1, keepdims=True))
        weights, rescale = jnp.exp(logits - new_top), jnp.exp(top - new_top)
        total = total * rescale + jnp.sum(weights, axis=1, keepdims=True)
        values = value_block(rows)
        weights = weights.astype(values[0].dtype)
        return new_top, total, [a * rescale + dot(weights, v) for a, v in zip(acc, values)]

    rows = q[0].shape[0]
    carry = (jnp.full((rows, 1), -jnp.inf, F32), jnp.zeros((rows, 1), F32),
             [jnp.zeros(qc.shape, F32) for qc in q])
    return jax.lax.fori_loop(0, key_blocks, step, carry)


def _softmax_kernel(q_ref, k_ref, v_ref, *refs, n, keys, scale, biased):
    """One program: a block of query rows against all ``keys`` rows of k and v (padded to
    :data:`KEY_BLOCK`: those logits masked), head dim in 128-wide blocks; ``biased``: the first
    of ``refs`` is the keys' logit bias [J padded]. With an lse output (differentiated steps, or
    a caller that joins this softmax with another) also each row's log Σ exp(logits), which the
    backward recomputes the weights from."""
    bias_ref, (o_ref, *lse_ref) = leading(refs, biased)
    db = column_blocks(q_ref.shape[1])
    real = program_rows(q_ref.shape[0], n)
    q = [masked_load(q_ref.at[:, c], real) for c in db]
    top, total, acc = online_softmax(q, lambda rows: [k_ref[rows, c] for c in db],
                                     lambda rows: [v_ref[rows, c] for c in db],
                                     k_ref.shape[0] // KEY_BLOCK, keys, scale,
                                     bias_rows(bias_ref))
    for a, c in zip(acc, db):
        plgpu.store(o_ref.at[:, c], (a / total).astype(o_ref.dtype), mask=real)
    if lse_ref:
        plgpu.store(lse_ref[0], (top + jnp.log(total))[:, 0],
                    mask=None if real is None else real[:, 0])


def leading(refs, present: bool):
    """(the first of a kernel's optional refs, or None where absent; the refs after it)."""
    return (refs[0], refs[1:]) if present else (None, refs)


def bias_rows(bias_ref):
    """``key_bias`` for :func:`online_softmax`: the key block's bias as a [1, KEY_BLOCK] row."""
    return None if bias_ref is None else (lambda rows: bias_ref[rows][None, :])


def _softmax_rows(q_ref, g_ref, rows, real):
    """A row block's q and cotangent g in the compute dtype (rows past N: zeros, which add
    nothing to any gradient)."""
    q = masked_load(q_ref.at[rows, :], real)
    return q, masked_load(g_ref.at[rows, :], real).astype(q.dtype)


def row_delta(g, out):
    """Flash attention's δ = Σ_d g·out per row, float32 [rows, 1]."""
    return jnp.sum(g.astype(F32) * out.astype(F32), axis=1, keepdims=True)


def softmax_query_gradient(q, g, lse, delta, k_ref, v_ref, keys: int, scale: float,
                           bias_ref=None):
    """In a kernel: dq (float32, ``scale`` applied) of a block of query rows — q and g in the
    compute dtype, lse and δ = Σ_d g·out [rows, 1] — over the key blocks of ``k_ref``/``v_ref``
    ([J padded, d]; ``bias_ref``: the keys' logit bias [J padded] or None): P = exp(logits −
    lse), dS = P ⊙ (g vᵀ − δ), dq = scale · dS k (flash attention's backward, query side)."""
    key_bias = bias_rows(bias_ref)

    def step(i, dq):
        k = k_ref[_key_rows(i), :]
        bias = None if key_bias is None else key_bias(_key_rows(i))
        weights = jnp.exp(_logits([q], [k], i * KEY_BLOCK, keys, scale, bias) - lse)
        d_logits = weights * (dot(g, v_ref[_key_rows(i), :], ((1,), (1,))) - delta)
        return dq + dot(d_logits.astype(q.dtype), k)

    dq = jax.lax.fori_loop(0, k_ref.shape[0] // KEY_BLOCK, step, jnp.zeros(q.shape, F32))
    return scale * dq


def _softmax_dq_kernel(q_ref, k_ref, v_ref, o_ref, g_ref, lse_ref, *refs, n, keys, scale,
                       biased, lse_cotangent):
    """dq of a block of query rows (:func:`softmax_query_gradient`), and their δ for the key
    side's kernel (which then reads no output). ``refs``: the keys' bias (``biased``), the lse
    output's cotangent (``lse_cotangent``: ∂lse/∂logits = P, so it enters as δ − g_lse), then
    dq and δ."""
    bias_ref, refs = leading(refs, biased)
    g_lse_ref, (dq_ref, delta_ref) = leading(refs, lse_cotangent)
    block_n = q_ref.shape[0]
    real = program_rows(block_n, n)
    rows = pl.ds(0, block_n)
    q, g = _softmax_rows(q_ref, g_ref, rows, real)
    delta = row_delta(g, masked_load(o_ref.at[rows, :], real))
    lse, g_lse = row_columns((lse_ref, g_lse_ref), rows, real)
    if g_lse is not None:
        delta = delta - g_lse
    dq = softmax_query_gradient(q, g, lse, delta, k_ref, v_ref, keys, scale, bias_ref)
    plgpu.store(dq_ref, dq.astype(dq_ref.dtype), mask=real)
    plgpu.store(delta_ref, delta[:, 0], mask=None if real is None else real[:, 0])


def _softmax_dkv_kernel(q_ref, k_ref, v_ref, g_ref, lse_ref, delta_ref, *refs, n, keys,
                        key_blocks, scale, block_n, biased):
    """One key block's partial dK, dV over a chunk of query rows in steps of ``block_n``:
    dV += Pᵀ g, dK += scale · dSᵀ q (flash attention's backward, key side), each row's δ as the
    query side's kernel wrote it; XLA sums the chunks' partials. The grid's last axis is
    chunk × key blocks + key block, so a chunk's key blocks are neighbouring programs (a GPU
    starts blocks batch, then head, then this axis fastest) that run together and read its q and
    g rows from L2, not each again from memory: key block-major order read them 5 times per
    layer at 304 keys."""
    bias_ref, (dk_ref, dv_ref) = leading(refs, biased)
    chunk_rows = q_ref.shape[0]
    # program ids read outside the loop: the interpreter cannot lower them inside it
    first = pl.program_id(2) // key_blocks * chunk_rows
    first_key = pl.program_id(2) % key_blocks * KEY_BLOCK
    k, v = k_ref[...], v_ref[...]
    bias = None if bias_ref is None else bias_ref[...][None, :]

    def step(i, carry):
        dk, dv = carry
        rows = block_slice(i, block_n)
        real = real_rows(first + i * block_n, block_n, n) if n % chunk_rows else None
        q, g = _softmax_rows(q_ref, g_ref, rows, real)
        lse, delta = row_columns((lse_ref, delta_ref), rows, real)
        weights = jnp.exp(_logits([q], [k], first_key, keys, scale, bias) - lse)
        d_logits = weights * (dot(g, v, ((1,), (1,))) - delta)
        return (dk + dot(d_logits.astype(q.dtype), q, ((0,), (0,))),
                dv + dot(weights.astype(q.dtype), g, ((0,), (0,))))

    zeros = jnp.zeros(k.shape, F32)
    dk, dv = jax.lax.fori_loop(0, chunk_rows // block_n, step, (zeros, zeros))
    dk_ref[...] = scale * dk
    dv_ref[...] = dv


def reference_softmax_attention(q, k, v, *, scale, bias=None, with_lse=False):
    """The XLA path's softmax over a shared key set (what :func:`fused_softmax_attention`
    computes): logits on compute-dtype operands in float32 (+ the keys' ``bias`` [b, J]),
    weights cast to v's dtype; float32 [b, n, h, d], and with ``with_lse`` each row's
    log Σ exp(logits) [b, h, n]."""
    logits = contract("bnhd,bjhd->bhnj", q, k, q.dtype) * scale
    if bias is not None:
        logits = logits + bias[:, None, None, :]
    out = contract("bhnj,bjhd->bnhd", jax.nn.softmax(logits, axis=-1), v, v.dtype)
    return (out, jax.nn.logsumexp(logits, axis=-1)) if with_lse else out


def _whole(k):
    """All keys of a (batch, head), for a (batch, head, ·) grid."""
    return pl.BlockSpec((pl.squeezed, k.shape[1], pl.squeezed, k.shape[3]),
                        lambda i, j, r: (i, 0, j, 0))


def _whole_bias(bias):
    """All keys' bias [b, J padded] of a batch element, for a (batch, head, ·) grid."""
    return [] if bias is None else [pl.BlockSpec((pl.squeezed, bias.shape[1]),
                                                 lambda i, j, r: (i, 0))]


def _lse_spec(rows):
    return pl.BlockSpec((pl.squeezed, pl.squeezed, rows), lambda i, j, r: (i, j, r))


def _optional(*arrays):
    return [a for a in arrays if a is not None]


def _pallas_softmax(q, k, v, bias, keys, scale, tiling, out_dtype, with_lse, *, interpret):
    """The forward kernel's output (and with ``with_lse``, each row's lse [b, h, n])."""
    b, n, h, d = q.shape
    block_n, num_warps, num_stages = _launch(tiling, d, softmax=True)
    out_shape = [jax.ShapeDtypeStruct((b, n, h, d), out_dtype)]
    out_specs = [_row_spec(block_n, d)]
    if with_lse:
        out_shape.append(jax.ShapeDtypeStruct((b, h, n), F32))
        out_specs.append(_lse_spec(block_n))
    outs = pl.pallas_call(
        functools.partial(_softmax_kernel, n=n, keys=keys, scale=scale,
                          biased=bias is not None),
        out_shape=out_shape, grid=(b, h, pl.cdiv(n, block_n)),
        in_specs=[_row_spec(block_n, d), _whole(k), _whole(v), *_whole_bias(bias)],
        out_specs=out_specs,
        compiler_params=_compiler_params(d, KEY_BLOCK, num_warps, num_stages),
        interpret=interpret, name="flurka_softmax_query_side")(q, k, v, *_optional(bias))
    return tuple(outs) if with_lse else outs[0]


def _pallas_softmax_bwd(q, k, v, bias, out, lse, g, g_lse, keys, scale, tiling, *, interpret):
    """(dq, dk, dv) from the two backward kernels (query side up to one block wide); ``g_lse``:
    the lse output's cotangent [b, h, n], or None."""
    b, n, h, d = q.shape
    dq_rows = max(16, tiling.block_n // 2)
    row_spec = _row_spec(dq_rows, d)
    dq, delta = pl.pallas_call(
        functools.partial(_softmax_dq_kernel, n=n, keys=keys, scale=scale,
                          biased=bias is not None, lse_cotangent=g_lse is not None),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(lse.shape, F32)],
        grid=(b, h, pl.cdiv(n, dq_rows)),
        in_specs=[row_spec, _whole(k), _whole(v), row_spec, row_spec, _lse_spec(dq_rows),
                  *_whole_bias(bias), *([_lse_spec(dq_rows)] if g_lse is not None else [])],
        out_specs=[row_spec, _lse_spec(dq_rows)],
        compiler_params=_compiler_params(d, KEY_BLOCK, tiling.bwd_num_warps, tiling.num_stages),
        interpret=interpret, name="flurka_softmax_query_side_dq")(
            q, k, v, out, g, lse, *_optional(bias, g_lse))
    return (dq, *softmax_key_gradient(q, k, v, lse, delta, g, keys, scale, tiling,
                                      interpret=interpret, bias=bias))


def softmax_key_gradient(q, k, v, lse, delta, g, keys, scale, tiling, *, interpret, bias=None):
    """(dk, dv) [b, J padded, h, d] in k's dtype: the key side's backward kernel over q, the
    output's cotangent g [b, n, h, d] (compute dtype), each row's lse and δ = Σ_d g·out
    [b, h, n] (float32, from the query side's kernel: the output itself is not read here), k and
    v [b, J padded to :data:`KEY_BLOCK`, h, d] with ``keys`` real (``bias``: their logit bias
    [b, J padded], or None)."""
    b, n, h, d = q.shape
    block_n = tiling.bwd_block_n
    rows = min(tiling.bwd_rows, pl.next_power_of_2(round_up(n, block_n)))
    chunks, key_blocks = pl.cdiv(n, rows), k.shape[1] // KEY_BLOCK
    chunk = pl.BlockSpec((pl.squeezed, rows, pl.squeezed, d),
                         lambda i, j, t: (i, t // key_blocks, j, 0))
    key_block = pl.BlockSpec((pl.squeezed, KEY_BLOCK, pl.squeezed, d),
                             lambda i, j, t: (i, t % key_blocks, j, 0))
    bias_block = pl.BlockSpec((pl.squeezed, KEY_BLOCK), lambda i, j, t: (i, t % key_blocks))
    partial = pl.BlockSpec((pl.squeezed,) * 3 + (KEY_BLOCK, d),
                           lambda i, j, t: (i, j, t // key_blocks, t % key_blocks, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_softmax_dkv_kernel, n=n, keys=keys, key_blocks=key_blocks,
                          scale=scale, block_n=block_n, biased=bias is not None),
        out_shape=[jax.ShapeDtypeStruct((b, h, chunks, k.shape[1], d), F32)] * 2,
        grid=(b, h, chunks * key_blocks),
        in_specs=[chunk, key_block, key_block, chunk, *[pl.BlockSpec(
            (pl.squeezed, pl.squeezed, rows), lambda i, j, t: (i, j, t // key_blocks))] * 2,
            *([bias_block] if bias is not None else [])],
        out_specs=[partial, partial],
        compiler_params=_compiler_params(d, KEY_BLOCK, tiling.bwd_num_warps, tiling.num_stages),
        interpret=interpret, name="flurka_softmax_query_side_dkv")(
            q, k, v, g, lse, delta, *_optional(bias))
    return tuple(t.sum(axis=2).transpose(0, 2, 1, 3).astype(k.dtype) for t in (dk, dv))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _fused_softmax(q, k, v, bias, keys, scale, tiling, out_dtype, with_lse, interpret):
    return on_gpu_or_interpreted(functools.partial(
        _pallas_softmax, q, k, v, bias, keys, scale, tiling, out_dtype, with_lse), interpret)


def _fused_softmax_fwd(q, k, v, bias, keys, scale, tiling, out_dtype, with_lse, interpret):
    """Up to one block wide: the forward kernel, keeping each row's lse for the backward
    kernels. Wider: the XLA path, its residuals serving the gradient (a backward program's
    [64, d] float32 dK and dV would spill)."""
    if q.shape[-1] > BLOCK:
        reference = functools.partial(
            reference_softmax_attention, scale=scale, with_lse=with_lse,
            bias=None if bias is None else bias[:, :keys])
        outs, vjp = jax.vjp(reference, q, k[:, :keys], v[:, :keys])
        if with_lse:
            return (outs[0].astype(out_dtype), outs[1]), (vjp, bias)
        return outs.astype(out_dtype), (vjp, bias)
    out, lse = on_gpu_or_interpreted(functools.partial(
        _pallas_softmax, q, k, v, bias, keys, scale, tiling, out_dtype, True), interpret)
    return (out, lse) if with_lse else out, (q, k, v, out, lse, bias)


def _fused_softmax_bwd(keys, scale, tiling, out_dtype, with_lse, interpret, saved, g):
    """``saved``: (the XLA path's vjp, bias) where wide, else the kernels' residuals, bias last."""
    *saved, bias = saved
    g, g_lse = g if with_lse else (g, None)
    d_bias = None if bias is None else jnp.zeros_like(bias)   # a mask: never trained
    if len(saved) == 1:
        (vjp,) = saved
        dq, dk, dv = vjp((g.astype(F32), g_lse) if with_lse else g.astype(F32))
        padded = round_up(keys, KEY_BLOCK)
        return dq, pad_to(dk, padded, axis=1), pad_to(dv, padded, axis=1), d_bias
    q, k, v, out, lse = saved
    return (*on_gpu_or_interpreted(functools.partial(
        _pallas_softmax_bwd, q, k, v, bias, out, lse, g, g_lse, keys, scale, tiling),
        interpret), d_bias)


_fused_softmax.defvjp(_fused_softmax_fwd, _fused_softmax_bwd)


def fused_softmax_attention(q: Array, k: Array, v: Array, *, scale: float, bias=None,
                            with_lse: bool = False, interpret: bool = False,
                            tiling: Tiling | bool | None = None, out_dtype=F32):
    """softmax(q·kᵀ·scale + bias)·v over a short key set every query sees (the EVAs' chunk
    summaries) in one kernel that reads q and writes the
    output once: the [N, J] logits never reach memory. q [b, n, h, d], k and v [b, J, h, d], in
    the compute dtype; ``bias`` [b, J] float32 (a mask: NEG_INF on keys a batch element lacks,
    never differentiated) or None. Result [b, n, h, d] in ``out_dtype``; with ``with_lse`` also
    each row's log Σ exp(logits) [b, h, n] float32, differentiable — what a caller needs to join
    this softmax with another exactly (EVA's windows). Its gradient is two more kernels (flash
    attention's backward: dq per block of query rows; per key block dK and dV partials over
    chunks of rows) from each row's lse, which a differentiated forward keeps; past one block of
    head dim the gradient is the XLA path's (:func:`reference_softmax_attention`, its forward run
    instead of the kernel)."""
    d, keys = q.shape[-1], k.shape[1]
    td, tk = tile_size(d), round_up(keys, KEY_BLOCK)
    k, v = (_pad(_pad(t.astype(q.dtype), tk, 1), td, 3) for t in (k, v))
    if bias is not None:
        bias = _pad(bias.astype(F32), tk, 1)
    outs = _fused_softmax(_pad(q, td, 3), k, v, bias, keys, scale,
                          tiling if isinstance(tiling, Tiling) else current_tiling(),
                          jnp.dtype(out_dtype), bool(with_lse), interpret)
    out, lse = outs if with_lse else (outs, None)
    out = out if td == d else out[..., :d]
    return (out, lse) if with_lse else out


def _pad(x, n, axis):
    return x if x.shape[axis] == n else pad_to(x, n, axis=axis)
