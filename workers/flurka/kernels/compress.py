"""The pre-attention LayerNorm fused into the Linformer sequence compression, as Pallas kernels.

A pre-LN FLuRKA layer computes X1 = E1·x̂ and X2 = E2·x̂ over the sequence with x̂ = keep ⊙ LN(x)
(padded rows zeroed, zero_padding). XLA's plan, per layer of the
flash comparison (N = 52 608, d_model 512, d_k 1024, bf16), spends about 3 tensor-passes on the
LayerNorm (one reduction per moment, each reading x, and the normalisation writing x̂) and 6.3
on E1·x̂ and E2·x̂ (E1, E2 [1024, N] bf16 = 2 passes each, x̂ read twice). Here:

* :func:`row_statistics`: each row's mean and 1/σ (flax's maths) in one kernel reading x once;
* :func:`normalised_compression`: a split-N GEMM whose B operand's prologue is the LayerNorm —
  each program loads a [step, 128] tile of x, normalises it (float32, rounded to x's dtype and
  masked as the XLA path's x̂ is) and multiplies it into E1's and E2's [rows_k, step] tiles, so
  x̂ never reaches memory: it reads x, E1 and E2 once and writes float32 partials
  [splits, b, d_k, d] that XLA sums (splits: enough programs for ~2 per SM of a 132-SM card).
  E is passed as stored ([d_k, max_len]): the kernel reads only its first n columns (a slice
  E[:, :n] would copy E on every call).

A layer gets there through :class:`PreNorm`: the encoder block hands its LayerNorm over
un-applied (``layer(x, mask, norm=...)``), and a low-rank layer with ``fused_projections``
(``fuses_norm``) takes the statistics once for both of its kernels — this one and the projected
query side (:mod:`flurka.kernels.projected_layer`, on the standardised rows with the LayerNorm's
scale folded into W_Q) — or takes them from the kernel that wrote x.

Grid (d's 128-wide column blocks, d_k's row blocks, splits, batch): axis 0 varies fastest on a
GPU, so the programs sharing one N-range of x and E run side by side and re-read its tiles from
L2, not memory. Same maths and precision policy as the XLA path
(:func:`reference_normalised_compression`: flax's LayerNorm statistics in float32, products on
compute-dtype operands with float32 accumulation). The gradient is two more kernels, x̂
recomputed from x and the statistics: ∂E = G·x̂ᵀ (x̂ normalised as loaded, as in the forward) and
∂x = the LayerNorm's backward of Σ E_iᵀ·G_i per block of rows (d_model past 512: the XLA path's
gradient, recomputed). The ∂x kernel is one input-gradient kernel, its ∂x̂ accumulation passed in: the
projected query side's ∂q·W_Qᵀ takes it too (:func:`normalised_input_gradient`). Pallas's
Triton backend on GPU, its interpreter elsewhere (CPU tests).

Launch: :class:`CompressTiling` and below. At the flash comparison's size XLA's plan for this
step (its LayerNorm as a two-moment reduction, a select writing x̂, two GEMMs each reading x̂ and
E) moves more than these kernels do (x, E1, E2, the statistics, keep, the LayerNorm's
parameters and the splits' float32 partials), forward and gradient; the planned bytes and
ptxas's registers per launch are in benchmarks/results/h100/NOTES.md.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flurka.attention.base import F32, compress, round_up, zero_padding
from flurka.kernels.query_side import (
    BLOCK, TilingScope, block_slice, column_blocks, dot, masked_load, on_gpu_or_interpreted, program_rows, real_rows,
    row_columns)

Array = jax.Array

# The compression's launch (none of it changes the result). The default (64, 32, 8, 4) lets a
# card's 64 K registers hold two programs of 256 threads per SM, 16 warps to hide latency; the
# other options ptxas compiled are in benchmarks/results/h100/NOTES.md. Which is fastest is the card's to say
# (none was timed): a GPU session's tuner times flurka.speed.tuning.COMPRESS_GRID at the flash
# comparison's size first (--tune-fused).


@dataclasses.dataclass(frozen=True)
class CompressTiling:
    """The compression's launch (none of it changes the result): ``rows_k`` rows of d_k per
    program (× 128 columns of d), ``step`` sequence rows per loop step, ``num_warps``,
    ``num_stages`` of software pipelining over the steps (the choice: above)."""

    rows_k: int = 64
    step: int = 32
    num_warps: int = 8
    num_stages: int = 4

    def __post_init__(self):
        for name in ("rows_k", "step"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 16 or value & (value - 1):
                raise ValueError(f"CompressTiling.{name} must be a power of two >= 16, "
                                 f"got {value!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"CompressTiling.num_warps must be 1, 2, 4, 8 or 16, "
                             f"got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"CompressTiling.num_stages must be an int >= 1, "
                             f"got {self.num_stages!r}")


# Layers built inside ``use_compress_tiling(t)`` compress with t (a GPU session's tuned choice).
_SCOPE = TilingScope(CompressTiling())
use_compress_tiling, current_compress_tiling = _SCOPE.use, _SCOPE.current
MIN_STEPS = 4         # fewest steps a split takes when the splits are chosen here
PROGRAMS = 2 * 132    # programs the default splits fill: two resident per SM of a 132-SM card
# The statistics kernel's launch: rows per program, warps, stages (a reduction, no MMA: small).
STAT_ROWS = 64
STAT_WARPS = 4
STAT_STAGES = 2


@dataclasses.dataclass(frozen=True)
class PreNorm:
    """A block's pre-attention LayerNorm handed to its layer un-applied (the layer's
    ``fuses_norm``): its parameters, x's row statistics (:func:`row_statistics`, one pass) and
    the keep mask, with which the kernels normalise x as they load it — the compression
    (:func:`normalised_compression`) and the projected query side
    (:mod:`flurka.kernels.projected_layer`) — so x̂ never reaches memory."""

    scale: Array
    bias: Array
    eps: float
    mean: Array
    rstd: Array
    keep: Array | None

    @classmethod
    def of(cls, norm, x: Array, mask: Array | None, *,
           statistics: tuple[Array, Array] | None = None,
           interpret: bool = False) -> "PreNorm":
        """``norm`` (an ``nnx.LayerNorm``) for x [b, n, d], mask [b, n] bool or None.
        ``statistics``: x's (mean, 1/σ) for ``norm``'s eps, float32 [b, n], where the kernel
        that wrote x computed them (:func:`~flurka.kernels.ffn.fused_ffn_block`): no pass
        of its own over x then."""
        d = x.shape[-1]
        scale = jnp.ones(d, F32) if norm.scale is None else norm.scale[...]
        bias = jnp.zeros(d, F32) if norm.bias is None else norm.bias[...]
        keep = None if mask is None else mask.astype(F32)
        if statistics is not None:
            stats = tuple(jax.lax.stop_gradient(s) for s in statistics)
        else:
            stats = row_statistics(x, eps=norm.epsilon, interpret=interpret)
        return cls(scale, bias, norm.epsilon, *stats, keep)

    @staticmethod
    def output_dtype(norm, x: Array):
        """The dtype ``norm(x)`` returns: its own, or x's promoted with its parameters'."""
        params = [p[...].dtype for p in (norm.scale, norm.bias) if p is not None]
        return norm.dtype or jnp.result_type(x.dtype, *params)

    def apply(self, x: Array) -> Array:
        """x̂ = keep ⊙ LN(x) the XLA way, in x's dtype (its statistics recomputed: their
        gradient too)."""
        return normalised(x, self.keep, self.scale, self.bias, eps=self.eps)


def layer_norm(x, scale, bias, *, eps):
    """flax LayerNorm's maths: statistics in float32 (E[x²] − E[x]², clamped at 0),
    (x − mean)·(rstd·scale) + bias in float32, result in x's dtype."""
    xf = x.astype(F32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.maximum(0.0, jnp.mean(jnp.square(xf), axis=-1, keepdims=True) - jnp.square(mean))
    return ((xf - mean) * (jax.lax.rsqrt(var + eps) * scale.astype(F32))
            + bias.astype(F32)).astype(x.dtype)


def normalised(x, keep, scale, bias, *, eps):
    """x̂ = keep ⊙ LN(x) the XLA way (:func:`layer_norm`, rows where ``keep`` [b, n] is 0
    zeroed; None: all real): what every kernel here computes x̂ as, and their gradients."""
    return zero_padding(layer_norm(x, scale, bias, eps=eps), None if keep is None else keep != 0)


def row_moments(load, d: int, rows: int, eps: float):
    """In a kernel: (mean, 1/σ) [rows, 1] float32 of the rows ``load(cols)`` gives block by
    block (float32 [rows, 128]), flax's E[y²] − E[y]², from one loop over the column blocks."""
    def add(k, sums):
        y = load(block_slice(k))
        return (sums[0] + jnp.sum(y, axis=1, keepdims=True),
                sums[1] + jnp.sum(y * y, axis=1, keepdims=True))

    zero = jnp.zeros((rows, 1), F32)
    return moments(*jax.lax.fori_loop(0, d // BLOCK, add, (zero, zero)), d, eps)


def moments(total, total_sq, d: int, eps: float):
    """(mean, 1/σ) from a row's Σy and Σy² over its ``d`` columns, flax's E[y²] − E[y]²."""
    mean = total / d
    return mean, jax.lax.rsqrt(jnp.maximum(0.0, total_sq / d - mean * mean) + eps)


def layer_norm_backward(dnormed, cols, standardised, scale_ref, rstd, dscale_ref, dbias_ref,
                        emit):
    """In a kernel: the LayerNorm's backward for a block of rows from ∂LN(y) (float32 [rows, 128]
    per column block of ``cols``, a loop's carried accumulators). With ŝ = (y − μ)·r
    (``standardised(c)``, recomputed per block: every block's ŝ and u live beside the
    accumulators spill at 64 rows) and u = γ·∂LN(y): ∂y = r·(u − mean(u) − ŝ·mean(u·ŝ)), handed
    to ``emit(c, ∂y_c)`` block by block; this block's shares of ∂γ = Σ ∂LN(y)·ŝ and
    ∂β = Σ ∂LN(y) stored in ``dscale_ref``/``dbias_ref`` [1, d]."""
    d = len(cols) * BLOCK

    def block(c, g):
        return standardised(c), g * scale_ref[:, c].astype(F32)

    sum_u = sum_us = jnp.zeros((dnormed[0].shape[0], 1), F32)
    for g, c in zip(dnormed, cols):
        standard, u = block(c, g)
        sum_u += jnp.sum(u, axis=1, keepdims=True)
        sum_us += jnp.sum(u * standard, axis=1, keepdims=True)
        dscale_ref[:, c] = jnp.sum(g * standard, axis=0, keepdims=True)
        dbias_ref[:, c] = jnp.sum(g, axis=0, keepdims=True)
    for g, c in zip(dnormed, cols):
        standard, u = block(c, g)
        emit(c, rstd * (u - (sum_u + standard * sum_us) / d))


def reference_normalised_compression(x, keep, scale, bias, e1, e2, *, eps):
    """The XLA path (what the kernels compute): x̂ = layer_norm(x) in x's dtype, zeroed where
    ``keep`` [b, n] is 0 (None: all rows real), then E·x̂ with E[:, :n] for e1 and e2 (e2 None:
    one E for both, sharing "kv" — (x1, x1)). (x1, x2) [b, d_k, d] in x's dtype."""
    n = x.shape[1]
    normed = normalised(x, keep, scale, bias, eps=eps)
    x1 = compress(e1[:, :n], normed)
    return x1, (x1 if e2 is None else compress(e2[:, :n], normed))


def _statistics_kernel(x_ref, mean_ref, rstd_ref, *, eps, n):
    """One program: mean and 1/σ of a block of rows, from a loop over x's column blocks."""
    rows, d = x_ref.shape
    real = program_rows(rows, n, axis=0)
    mean, rstd = row_moments(lambda c: masked_load(x_ref.at[:, c], real).astype(F32), d, rows,
                             eps)
    mask = None if real is None else real[:, 0]
    plgpu.store(mean_ref, mean[:, 0], mask=mask)
    plgpu.store(rstd_ref, rstd[:, 0], mask=mask)


def _pallas_statistics(x, eps, *, interpret):
    b, n, d = x.shape
    row = pl.BlockSpec((pl.squeezed, STAT_ROWS), lambda r, i: (i, r))
    return pl.pallas_call(
        functools.partial(_statistics_kernel, eps=eps, n=n),
        out_shape=[jax.ShapeDtypeStruct((b, n), F32)] * 2, grid=(pl.cdiv(n, STAT_ROWS), b),
        in_specs=[pl.BlockSpec((pl.squeezed, STAT_ROWS, d), lambda r, i: (i, r, 0))],
        out_specs=[row, row],
        compiler_params=plgpu.CompilerParams(num_warps=STAT_WARPS, num_stages=STAT_STAGES),
        interpret=interpret, name="flurka_row_statistics")(x)


def row_statistics(x, *, eps, interpret=False):
    """(mean, rstd), each float32 [b, n]: the LayerNorm statistics of x [b, n, d] (d a
    multiple of 128) as one Pallas kernel reading x once (XLA's plan runs one reduction per
    moment). Not differentiable (under stop_gradient): their consumers recompute the LayerNorm
    from x in their backward."""
    b, n, d = x.shape
    if d % BLOCK:
        raise ValueError(f"row_statistics takes rows whose width is a multiple of {BLOCK}, "
                         f"got {d}")
    out = on_gpu_or_interpreted(functools.partial(
        _pallas_statistics, jax.lax.stop_gradient(x), float(eps)), interpret)
    return tuple(jax.lax.stop_gradient(s) for s in out)


def normalise(x, mean, rstd, keep, scale, bias):
    """A kernel's block of x̂ = keep ⊙ LN(x) — :func:`layer_norm`'s maths on [rows, cols] with
    the rows' statistics and keep [rows, 1] (keep None: all real) and the columns' float32
    scale and bias [1, cols] — in x's dtype, as the XLA path rounds it."""
    normed = (x.astype(F32) - mean) * (rstd * scale) + bias
    if keep is not None:
        normed = jnp.where(keep != 0, normed, 0.0)
    return normed.astype(x.dtype)


def _compression_kernel(*refs, n, d_k, has_keep, pair, step):
    """One program: the [rows_k, 128] tile of E1·x̂ (and E2·x̂) over one split's rows of the
    sequence, in float32. Rows of x past n load as zeros (and, with their statistics and keep
    zero, normalise to the bias); E's columns past n and rows past d_k load as zeros, so those
    rows add nothing."""
    refs = list(refs)
    x_ref, mean_ref, rstd_ref = refs[:3]
    keep_ref = refs[3] if has_keep else None
    scale_ref, bias_ref, *rest = refs[3 + has_keep:]
    e_refs, out_refs = rest[:1 + pair], rest[1 + pair:]
    rows_k, chunk = e_refs[0].shape
    # program ids read outside the loop: the interpreter cannot lower them inside it
    first = pl.program_id(2) * chunk
    real_k = real_rows(pl.program_id(1) * rows_k, rows_k, d_k) if d_k % rows_k else None
    scale, bias = scale_ref[...], bias_ref[...]                      # [1, 128] float32

    def accumulate(i, accs):
        rows = block_slice(i, step)
        start = first + i * step
        real = real_rows(start, step, n)                             # [step, 1]
        x = masked_load(x_ref.at[rows, :], real)
        mean, rstd, keep = row_columns((mean_ref, rstd_ref, keep_ref), rows, real)
        normed = normalise(x, mean, rstd, keep, scale, bias)
        columns = start + jax.lax.broadcasted_iota(jnp.int32, (1, step), 1) < n
        mask = columns if real_k is None else real_k & columns
        return tuple(acc + dot(plgpu.load(e_ref.at[:, rows], mask=mask, other=0)
                               .astype(x_ref.dtype), normed)
                     for acc, e_ref in zip(accs, e_refs))

    accs = jax.lax.fori_loop(0, chunk // step, accumulate,
                             tuple(jnp.zeros((rows_k, BLOCK), F32) for _ in e_refs))
    for acc, out_ref in zip(accs, out_refs):
        plgpu.store(out_ref, acc, mask=real_k)


def split_rows(n: int, d: int, d_k: int, batch: int, splits: int | None = None,
               tiling: CompressTiling = CompressTiling()) -> tuple[int, int]:
    """(rows per split, splits) of the compression: ``splits`` (default: as many as keep the
    programs within :data:`PROGRAMS`, each split at least :data:`MIN_STEPS` steps) of whole
    steps; the last split's rows past n are masked."""
    if splits is None:   # rounded down: all programs in one wave of two per SM
        programs = d // BLOCK * pl.cdiv(d_k, tiling.rows_k) * batch
        splits = min(max(1, PROGRAMS // programs), max(1, n // (MIN_STEPS * tiling.step)))
    rows = round_up(pl.cdiv(n, max(1, splits)), tiling.step)
    return rows, pl.cdiv(n, rows)


def _pallas_compression(x, keep, scale, bias, e1, e2, mean, rstd, splits, tiling, *, interpret):
    """Float32 partials [splits, b, d_k, d] of E1·x̂ (and of E2·x̂)."""
    b, n, d = x.shape
    d_k = e1.shape[0]
    rows_k = tiling.rows_k
    chunk, splits = split_rows(n, d, d_k, b, splits, tiling)
    e_refs = [e1] if e2 is None else [e1, e2]
    rows = pl.BlockSpec((pl.squeezed, chunk), lambda j, k, s, i: (i, s))
    column = pl.BlockSpec((1, BLOCK), lambda j, k, s, i: (0, j))
    specs = [pl.BlockSpec((pl.squeezed, chunk, BLOCK), lambda j, k, s, i: (i, s, j)), rows, rows,
             *([rows] if keep is not None else []), column, column,
             *[pl.BlockSpec((rows_k, chunk), lambda j, k, s, i: (k, s))] * len(e_refs)]
    operands = [x, mean, rstd, *([keep] if keep is not None else []),
                scale.astype(F32)[None, :], bias.astype(F32)[None, :], *e_refs]
    out = pl.BlockSpec((pl.squeezed, pl.squeezed, rows_k, BLOCK), lambda j, k, s, i: (s, i, k, j))
    return pl.pallas_call(
        functools.partial(_compression_kernel, n=n, d_k=d_k, has_keep=keep is not None,
                          pair=e2 is not None, step=tiling.step),
        out_shape=[jax.ShapeDtypeStruct((splits, b, d_k, d), F32)] * len(e_refs),
        grid=(d // BLOCK, pl.cdiv(d_k, rows_k), splits, b), in_specs=specs,
        out_specs=[out] * len(e_refs),
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps,
                                             num_stages=tiling.num_stages),
        interpret=interpret, name="flurka_normalised_compression")(*operands)


# The gradient kernels' launch (ptxas's numbers for sm_90 at the flash comparison's size below):
# ∂E: [BWD_ROWS_K, BWD_COLUMNS] tiles of ∂E1 and ∂E2 per program, a loop over d's 128-wide
# blocks; ∂x: BWD_ROWS rows of x per program, a loop over d_k in BWD_STEP-row steps into their
# [rows, d] float32 accumulator (128 registers a thread over 8 warps at d = 512).
BWD_ROWS_K = 128
BWD_COLUMNS = 64
BWD_ROWS = 64
BWD_STEP = 64
BWD_WARPS = 8
BWD_ACCUMULATOR = 128 * 32 * BWD_WARPS    # float32 elements: 128 registers × 256 threads


def _e_gradient_kernel(*refs, n, d_k, max_len, batch, has_keep, pair):
    """One program: the [rows_k, columns] tile of ∂E1 = Σ_b G1·x̂ᵀ (and of ∂E2) — x̂'s rows
    normalised as they are loaded (the forward's prologue), zero past n (E's columns there get
    no gradient), G's from L2 — over d's column blocks and the batch."""
    refs = list(refs)
    x_ref, mean_ref, rstd_ref = refs[:3]
    keep_ref = refs[3] if has_keep else None
    scale_ref, bias_ref, *rest = refs[3 + has_keep:]
    g_refs, out_refs = rest[:1 + pair], rest[1 + pair:]
    rows_k = g_refs[0].shape[1]
    columns, d = x_ref.shape[1:]
    first = pl.program_id(1) * columns
    real = real_rows(first, columns, n)                                  # [columns, 1]
    real_k = real_rows(pl.program_id(0) * rows_k, rows_k, d_k)           # [rows_k, 1]

    def sequence(i, accs):
        stats = row_columns((mean_ref, rstd_ref, keep_ref), (i, slice(None)), real)

        def accumulate(c, accs):
            k = block_slice(c)
            normed = normalise(masked_load(x_ref.at[i, :, k], real), *stats, scale_ref[:, k],
                               bias_ref[:, k])
            normed = jnp.where(real, normed, 0)
            return tuple(acc + dot(masked_load(g_ref.at[i, :, k], real_k).astype(x_ref.dtype),
                                   normed, ((1,), (1,)))
                         for acc, g_ref in zip(accs, g_refs))

        return jax.lax.fori_loop(0, d // BLOCK, accumulate, accs)

    accs = jax.lax.fori_loop(0, batch, sequence,
                             tuple(jnp.zeros((rows_k, columns), F32) for _ in g_refs))
    stored = real_k & (first + jax.lax.broadcasted_iota(jnp.int32, (1, columns), 1) < max_len)
    for acc, out_ref in zip(accs, out_refs):
        plgpu.store(out_ref, acc.astype(out_ref.dtype), mask=stored)


def _input_gradient_kernel(*refs, n, has_keep, operands, accumulate, with_normed):
    """One program, a block of rows: ∂x̂ from ``accumulate`` (float32 accumulators for every
    column block, from the ``operands`` refs that follow γ (and β)), then the LayerNorm's
    backward per row — with u = γ·keep·∂x̂ and ŝ = (x − μ)·r,
    ∂x = r·(u − mean(u) − ŝ·mean(u·ŝ)) — and this block's shares of ∂γ = Σ keep·∂x̂·ŝ and
    ∂β = Σ keep·∂x̂ (:func:`layer_norm_backward`). ``with_normed``: x̂ = keep ⊙ LN(x) written
    too, for a weight gradient downstream."""
    refs = list(refs)
    x_ref, mean_ref, rstd_ref = refs[:3]
    keep_ref = refs[3] if has_keep else None
    scale_ref, *rest = refs[3 + has_keep:]
    bias_ref, rest = (rest[0], rest[1:]) if with_normed else (None, rest)
    operand_refs, (dx_ref, dscale_ref, dbias_ref, *normed_ref) = rest[:operands], rest[operands:]
    rows, d = x_ref.shape
    first = pl.program_id(0) * rows      # outside any loop: the interpreter needs it there
    real = real_rows(first, rows, n)
    mean, rstd, keep = row_columns((mean_ref, rstd_ref, keep_ref), slice(None), real)
    cols = column_blocks(d)
    dnormed = accumulate(operand_refs, cols, rows, first, real, x_ref.dtype)
    if keep is not None:
        dnormed = tuple(jnp.where(keep != 0, g, 0.0) for g in dnormed)

    def standardised(c):
        return (masked_load(x_ref.at[:, c], real).astype(F32) - mean) * rstd

    def store(c, dx):
        plgpu.store(dx_ref.at[:, c], dx.astype(dx_ref.dtype), mask=real)

    layer_norm_backward(dnormed, cols, standardised, scale_ref, rstd, dscale_ref, dbias_ref,
                        store)
    for c in cols if normed_ref else ():   # after the accumulators die: beside them it spilled
        plgpu.store(normed_ref[0].at[:, c],
                    normalise(masked_load(x_ref.at[:, c], real), mean, rstd, keep,
                              scale_ref[:, c], bias_ref[:, c]), mask=real)


def _compressed_cotangents(refs, cols, rows, first, real, dtype, *, n, d_k, step):
    """∂x̂ = Σ_i E_i[:, rows]ᵀ·G_i over d_k (refs: the E's, then the G's), one E at a time: both
    in one loop spill."""
    pair = len(refs) // 2

    def accumulate(e_ref, g_ref):
        def step_k(i, accs):
            k_rows = block_slice(i, step)
            real_k = real_rows(i * step, step, d_k)                      # [step, 1]
            mask = real_k & (first + jax.lax.broadcasted_iota(jnp.int32, (1, rows), 1) < n)
            e = plgpu.load(e_ref.at[k_rows, :], mask=mask, other=0).astype(dtype)
            return tuple(acc + dot(e, masked_load(g_ref.at[k_rows, c], real_k).astype(dtype),
                                   ((0,), (0,)))
                         for acc, c in zip(accs, cols))
        return step_k

    dnormed = tuple(jnp.zeros((rows, BLOCK), F32) for _ in cols)
    for e_ref, g_ref in zip(refs[:pair], refs[pair:]):
        dnormed = jax.lax.fori_loop(0, pl.cdiv(d_k, step), accumulate(e_ref, g_ref), dnormed)
    return dnormed


def _projected_cotangents(refs, cols, rows, first, real, dtype):
    """∂x̂ = ∂y·Wᵀ for a downstream y = x̂·W (refs: ∂y's rows, W): a loop over ∂y's column
    blocks."""
    dy_ref, w_ref = refs

    def step_k(k, accs):
        kc = block_slice(k)
        dy = masked_load(dy_ref.at[:, kc], real)
        return tuple(acc + dot(dy, w_ref[c, kc], ((1,), (1,))) for acc, c in zip(accs, cols))

    return jax.lax.fori_loop(0, dy_ref.shape[1] // BLOCK, step_k,
                             tuple(jnp.zeros((rows, BLOCK), F32) for _ in cols))


def _pallas_input_gradient(x, keep, scale, mean, rstd, operands, specs, accumulate, name,
                           bias=None, *, interpret):
    """(∂x, the programs' float32 shares of ∂γ and ∂β [b, programs, 1, d], and with ``bias``
    x̂) through x̂ = keep ⊙ LN(x), ∂x̂ from ``accumulate`` over ``operands`` (with their block
    ``specs`` on the (row blocks, batch) grid)."""
    b, n, d = x.shape
    programs = pl.cdiv(n, BWD_ROWS)
    stats = [mean, rstd, *([] if keep is None else [keep])]
    rows = pl.BlockSpec((pl.squeezed, BWD_ROWS), lambda r, i: (i, r))
    block = pl.BlockSpec((pl.squeezed, BWD_ROWS, d), lambda r, i: (i, r, 0))
    share = pl.BlockSpec((pl.squeezed, pl.squeezed, 1, d), lambda r, i: (i, r, 0, 0))
    column = pl.BlockSpec((1, d), lambda r, i: (0, 0))
    params = [p.astype(F32)[None, :] for p in ([scale] if bias is None else [scale, bias])]
    return pl.pallas_call(
        functools.partial(_input_gradient_kernel, n=n, has_keep=keep is not None,
                          operands=len(operands), accumulate=accumulate,
                          with_normed=bias is not None),
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                   *[jax.ShapeDtypeStruct((b, programs, 1, d), F32)] * 2,
                   *([] if bias is None else [jax.ShapeDtypeStruct(x.shape, x.dtype)])],
        grid=(programs, b),
        in_specs=[block, *[rows] * len(stats), *[column] * len(params), *specs],
        out_specs=[block, share, share, *([] if bias is None else [block])],
        compiler_params=plgpu.CompilerParams(num_warps=BWD_WARPS, num_stages=1),
        interpret=interpret, name=name,
    )(x, *stats, *params, *operands)


def normalised_input_gradient(x, keep, scale, bias, mean, rstd, dy, w, *, interpret=False):
    """(∂x, ∂γ, ∂β, x̂) of a downstream y = x̂·W with x̂ = keep ⊙ LN(x), given ∂y [b, n, e]:
    ∂x̂ = ∂y·Wᵀ and the LayerNorm's backward as one kernel per block of rows (∂x̂ never reaches
    memory), x's statistics as the forward took them; x̂ (x's dtype) written beside ∂x for W's
    own gradient x̂ᵀ·∂y. The projected query side's gradient
    (:mod:`flurka.kernels.projected_layer`); d_model within :func:`backward_fits`. ∂γ, ∂β
    float32."""
    b, n, d = x.shape
    e = dy.shape[-1]
    keep = None if keep is None else (keep != 0).astype(F32)
    dx, dscale, dbias, normed = on_gpu_or_interpreted(functools.partial(
        _pallas_input_gradient, x, keep, scale, mean, rstd, [dy.astype(x.dtype), w.astype(x.dtype)],
        [pl.BlockSpec((pl.squeezed, BWD_ROWS, e), lambda r, i: (i, r, 0)),
         pl.BlockSpec((d, e), lambda r, i: (0, 0))],
        _projected_cotangents, "flurka_normalised_input_bwd", bias), interpret)
    return dx, dscale.sum(axis=(0, 1, 2)), dbias.sum(axis=(0, 1, 2)), normed


def _pallas_compression_bwd(x, keep, scale, bias, e1, e2, mean, rstd, grads, *, interpret):
    """(∂x, ∂E1, ∂E2 or None, the programs' float32 shares of ∂γ and ∂β [b, programs, 1, d]).
    ∂E has E's stored shape (zero past n); grads: the cotangents [b, d_k, d], one per E."""
    b, n, d = x.shape
    d_k, max_len = e1.shape
    pair = e2 is not None
    e_refs = [e1, e2] if pair else [e1]
    has_keep = keep is not None
    stats = [mean, rstd, *([keep] if has_keep else [])]
    params = plgpu.CompilerParams(num_warps=BWD_WARPS, num_stages=1)
    # ∂E: grid (d_k blocks, E's column blocks), axis 0 fastest so the programs that share x's
    # rows run side by side and re-read them from L2.
    per_row = pl.BlockSpec((b, BWD_COLUMNS), lambda k, j: (0, j))
    de = pl.pallas_call(
        functools.partial(_e_gradient_kernel, n=n, d_k=d_k, max_len=max_len, batch=b,
                          has_keep=has_keep, pair=pair),
        out_shape=[jax.ShapeDtypeStruct(e.shape, e.dtype) for e in e_refs],
        grid=(pl.cdiv(d_k, BWD_ROWS_K), pl.cdiv(max_len, BWD_COLUMNS)),
        in_specs=[pl.BlockSpec((b, BWD_COLUMNS, d), lambda k, j: (0, j, 0)),
                  *[per_row] * len(stats), pl.BlockSpec((1, d), lambda k, j: (0, 0)),
                  pl.BlockSpec((1, d), lambda k, j: (0, 0)),
                  *[pl.BlockSpec((b, BWD_ROWS_K, d), lambda k, j: (0, k, 0))] * len(e_refs)],
        out_specs=[pl.BlockSpec((BWD_ROWS_K, BWD_COLUMNS), lambda k, j: (k, j))] * len(e_refs),
        compiler_params=params, interpret=interpret, name="flurka_compression_e_bwd",
    )(x, *stats, scale.astype(F32)[None, :], bias.astype(F32)[None, :], *grads)
    # ∂x: grid (row blocks, batch).
    dx, dscale, dbias = _pallas_input_gradient(
        x, keep, scale, mean, rstd, [*e_refs, *grads],
        [*[pl.BlockSpec((d_k, BWD_ROWS), lambda r, i: (0, r))] * len(e_refs),
         *[pl.BlockSpec((pl.squeezed, d_k, d), lambda r, i: (i, 0, 0))] * len(e_refs)],
        functools.partial(_compressed_cotangents, n=n, d_k=d_k, step=BWD_STEP),
        "flurka_compression_x_bwd", interpret=interpret)
    return dx, de[0], de[1] if pair else None, dscale, dbias


def backward_fits(d: int) -> bool:
    """Whether the ∂x kernel's [rows, d] float32 accumulator fits its registers."""
    return BWD_ROWS * d <= BWD_ACCUMULATOR


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11))
def _fused(x, keep, scale, bias, e1, e2, mean, rstd, eps, splits, tiling, interpret):
    """(E1·x̂[, E2·x̂]) in x's dtype."""
    partials = on_gpu_or_interpreted(functools.partial(
        _pallas_compression, x, keep, scale, bias, e1, e2, mean, rstd, splits, tiling),
        interpret)
    return tuple(p.sum(axis=0).astype(x.dtype) for p in partials)


def _fused_fwd(x, keep, scale, bias, e1, e2, mean, rstd, eps, splits, tiling, interpret):
    return (_fused(x, keep, scale, bias, e1, e2, mean, rstd, eps, splits, tiling, interpret),
            (x, keep, scale, bias, e1, e2, mean, rstd))


def _fused_bwd(eps, splits, tiling, interpret, saved, g):
    """Two kernels (:func:`_e_gradient_kernel`, :func:`_input_gradient_kernel`) reading x, E and
    the statistics once each; too wide a d_model: the XLA path's gradient, recomputed from x.
    Statistics and keep are constants (their cotangents zero): the kernels differentiate through
    the statistics themselves."""
    x, keep, scale, bias, e1, e2, mean, rstd = saved
    if backward_fits(x.shape[-1]):
        dx, de1, de2, dscale, dbias = on_gpu_or_interpreted(functools.partial(
            _pallas_compression_bwd, x, keep, scale, bias, e1, e2, mean, rstd, tuple(g)),
            interpret)
        dscale, dbias = (s.sum(axis=(0, 1, 2)).astype(p.dtype)
                         for s, p in ((dscale, scale), (dbias, bias)))
    else:
        def reference(x, scale, bias, e1, e2):
            out = reference_normalised_compression(x, keep, scale, bias, e1, e2, eps=eps)
            return out[:1] if e2 is None else out

        _, vjp = jax.vjp(reference, x, scale, bias, e1, e2)
        dx, dscale, dbias, de1, de2 = vjp(tuple(g))
    return (dx, None if keep is None else jnp.zeros_like(keep), dscale, dbias, de1, de2,
            jnp.zeros_like(mean), jnp.zeros_like(rstd))


_fused.defvjp(_fused_fwd, _fused_bwd)


def normalised_compression(x, keep, scale, bias, e1, e2=None, *, eps, stats=None, splits=None,
                           tiling: CompressTiling | None = None, interpret=False):
    """(E1·x̂, E2·x̂) with x̂ = keep ⊙ LN(x), as one Pallas kernel (x̂ never reaches memory).
    x [b, n, d] in the compute dtype (d a multiple of 128); ``keep`` [b, n] (bool or float: rows
    where it is 0 are padding) or None (all real); ``scale``/``bias`` [d]; e1, e2 [d_k, ≥ n] as
    stored (the kernel reads their first n columns; e2 None: one E for both, returned twice);
    ``stats``: (mean, rstd) from :func:`row_statistics` where the caller has them, else computed
    here; ``splits``: how many ranges of the sequence the programs split (default: enough
    programs for the card); ``tiling``: the launch (default: :func:`current_compress_tiling`,
    when traced). Differentiable in x, scale, bias, e1 and e2 (the gradient kernels). (x1, x2)
    [b, d_k, d] in x's dtype."""
    b, n, d = x.shape
    if d % BLOCK:
        raise ValueError(f"normalised_compression takes a d_model that is a multiple of {BLOCK}, "
                         f"got {d}")
    for e in (e1, e2):
        if e is not None and (e.ndim != 2 or e.shape[1] < n):
            raise ValueError(f"normalised_compression takes E [d_k, >= n={n}], got "
                             f"{e.shape}")
    if stats is None:
        stats = row_statistics(x, eps=eps, interpret=interpret)
    mean, rstd = (jax.lax.stop_gradient(s.astype(F32)) for s in stats)
    if keep is not None:
        keep = jax.lax.stop_gradient((keep != 0).astype(F32))
    out = _fused(x, keep, scale, bias, e1, e2, mean, rstd, float(eps), splits,
                 tiling or current_compress_tiling(), interpret)
    return out[0], out[-1]
