"""The encoder block's second half — residual, LayerNorm, FFN, residual — as Pallas kernels.

After the attention a pre-LN block computes y = x + a, then z = y + W2·GELU(W1·LN(y) + b1) + b2.
XLA runs that as six or seven passes over [N, d_model]: in the flash comparison's plan (d_model =
FFN = 512, bf16) the LayerNorm's statistics (one reduction per moment, each reading y), its
normalisation (read y, write LN(y)), fc1 (read, write), the GELU (read, write: not in fc1's
epilogue), fc2 (read, write), and the residual folded into the next block's statistics and
normalisation, which then read y and the FFN's output twice each — about 20 tensor-passes of a
block's 34. Two ways to do it here (:class:`FfnTiling`, ``kernels``), which one is faster is
the card's to say:

* two kernels (the default): LN + fc1 + GELU — the LayerNorm as the GEMM's prologue, its
  statistics from a first loop over y's column blocks — writing the hidden layer h, then
  fc2 + bias + residual; each a GEMM tile [rows, 128] with a software-pipelined loop over the
  contraction. Seven passes: x, a read twice, h written and read, z written.
* one kernel: per block of rows, a loop over the hidden layer's 128-wide blocks, each computed
  (LN(y)·W1, GELU) and multiplied into all of z's column blocks at once (their float32
  accumulators carried by the loop): h never reaches memory. Three passes; the [rows, d_model]
  accumulators must fit the registers (d_model ≤ :data:`ONE_KERNEL_WIDTH`).

Same maths and precision policy as the XLA path (:func:`reference_ffn_block`, what flax's
LayerNorm and Linear compute: statistics in float32 with flax's E[y²] − E[y]², products on
compute-dtype operands with float32 accumulation). The gradient is one more kernel
(:func:`_backward_kernel`), the hidden layer recomputed from x and a per block of rows (flash
attention's recipe): it writes ∂y (x's and a's gradient), LN(y), h and ∂p (the pre-activation's
gradient) once each, and XLA's GEMMs take fc1's and fc2's weight gradients from them (the
planned bytes: benchmarks/results/h100/NOTES.md); d_model past 2048 takes the XLA path's
gradient, recomputed. Sizes: d_model
and the FFN width multiples of 128; elsewhere the encoder's XLA path is the only one
(:func:`check_fusable`). Pallas's Triton backend on GPU, its interpreter elsewhere (CPU tests).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flurka.attention.base import F32
from flurka.kernels.query_side import (
    BLOCK, TilingScope, block_slice, column_blocks, dot, masked_load, on_gpu_or_interpreted,
    program_rows, row_vector)
from flurka.kernels.compress import (
    layer_norm, layer_norm_backward, moments, normalise, row_moments)

ONE_KERNEL_WIDTH = 512   # the one-kernel form's widest d_model: 4 [rows, 128] accumulators live


@dataclasses.dataclass(frozen=True)
class FfnTiling:
    """How the block runs (none of it changes the result): ``kernels`` 2 or 1 (module
    docstring), ``block_n`` rows per program (two kernels: × 128 columns), ``num_warps``, and
    ``num_stages`` of software pipelining on the loops over 128-wide blocks. The defaults compile
    without a spill on sm_90 at the flash comparison's d_model = FFN = 512 and fit a card's
    227 KiB of shared memory; ptxas's numbers for these and the neighbouring options are in
    benchmarks/results/h100/NOTES.md."""

    kernels: int = 2
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 2

    def __post_init__(self):
        if self.kernels not in (1, 2):
            raise ValueError(f"FfnTiling.kernels must be 1 or 2, got {self.kernels!r}")
        rows = self.block_n
        if not isinstance(rows, int) or rows < 16 or rows & (rows - 1):
            raise ValueError(f"FfnTiling.block_n must be a power of two >= 16, got {rows!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"FfnTiling.num_warps must be 1, 2, 4, 8 or 16, "
                             f"got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"FfnTiling.num_stages must be an int >= 1, got {self.num_stages!r}")

    def for_dtype(self, dtype) -> FfnTiling:
        """The launch for operands of ``dtype``: the tiling as given for 2-byte ones (bf16, what
        it is tuned at); 4-byte ones (float32) take half the rows and one stage, since their
        tiles take twice the shared memory, and at the default the two kernels would ask more
        than a card's 227 KiB."""
        if jnp.dtype(dtype).itemsize <= 2:
            return self
        return dataclasses.replace(self, block_n=max(16, self.block_n // 2), num_stages=1)


ONE_KERNEL = FfnTiling(kernels=1, block_n=64, num_warps=8, num_stages=1)
# Encoders built inside ``use_ffn_tiling(t)`` with ``fused_ffn=True`` run their blocks with t (a
# GPU session's tuned choice: flurka.speed.tuning.tune_ffn).
_SCOPE = TilingScope(FfnTiling())
use_ffn_tiling, current_ffn_tiling = _SCOPE.use, _SCOPE.current


def check_fusable(d_model: int, d_ff: int, tiling: FfnTiling | None = None) -> None:
    """Clear error (at construction, before any compute) for sizes the kernels do not take."""
    for name, size in (("d_model", d_model), ("FFN width", d_ff)):
        if size % BLOCK:
            raise ValueError(f"fused_ffn takes a {name} that is a multiple of {BLOCK} (the "
                             f"kernels' column blocks), got {size}; use the XLA path "
                             f"(fused_ffn=False)")
    if tiling is not None and tiling.kernels == 1 and d_model > ONE_KERNEL_WIDTH:
        raise ValueError(f"fused_ffn in one kernel takes a d_model up to {ONE_KERNEL_WIDTH} (its "
                         f"rows' output accumulators live in registers), got {d_model}; use "
                         f"FfnTiling(kernels=2)")


def reference_ffn_block(x, a, scale, bias, w1, b1, w2, b2, *, eps: float):
    """The XLA path: z = y + fc2(GELU(fc1(LN(y)))), y = x + a (a None: y = x), as flax's
    LayerNorm and Linear compute it (each result in the compute dtype, x's)."""
    y = x if a is None else x + a
    normed = layer_norm(y, scale, bias, eps=eps).astype(x.dtype)
    h = jax.nn.gelu(jnp.dot(normed, w1.astype(x.dtype)) + b1.astype(x.dtype))
    return y + (jnp.dot(h, w2.astype(x.dtype)) + b2.astype(x.dtype))


def _residual(x_ref, a_ref, cols, real):
    """y = x + a on ``cols``, rounded to the compute dtype as the XLA path's sum is (a_ref None:
    x is y); float32."""
    y = masked_load(x_ref.at[:, cols], real)
    if a_ref is not None:
        y = y + masked_load(a_ref.at[:, cols], real)
    return y.astype(F32)


def _taking(kernel, a, at: int = 1):
    """``kernel`` as Pallas calls it: with ``a`` None (y handed over whole, a kernel's write
    ahead of this block — :meth:`~flurka.attention.base.AttentionLayer.__call__`'s
    ``residual``) no ref for it comes, and the kernel sees None at position ``at``."""
    if a is not None:
        return kernel
    return lambda *refs: kernel(*refs[:at], None, *refs[at:])


def _summands(x, a):
    """The kernels' y operands: [x, a], or [x] where x is y."""
    return [x] if a is None else [x, a]


def _moments(x_ref, a_ref, real, eps):
    """(mean, 1/σ) of y's rows, [rows, 1] float32, from a loop over its column blocks."""
    rows, d_model = x_ref.shape
    return row_moments(lambda cols: _residual(x_ref, a_ref, cols, real), d_model, rows, eps)


def _ln_fc1(x_ref, a_ref, scale_ref, bias_ref, w1_ref, b1_ref, hidden, mean, inv, real,
            activation=jax.nn.gelu):
    """GELU(LN(y)·W1 + b1) on the hidden columns ``hidden``, in the compute dtype (activation
    None: the float32 pre-activation): a loop over y's column blocks, each normalised (the
    LayerNorm as the GEMM's prologue) and multiplied."""
    def product(k, acc):
        cols = block_slice(k)
        normed = normalise(_residual(x_ref, a_ref, cols, real), mean, inv, None,
                           scale_ref[:, cols].astype(F32), bias_ref[:, cols].astype(F32))
        return acc + dot(normed.astype(x_ref.dtype), w1_ref[cols, hidden])

    rows, d_model = x_ref.shape
    width = w1_ref.at[:, hidden].shape[1]          # the hidden block's (static) width
    acc = jax.lax.fori_loop(0, d_model // BLOCK, product, jnp.zeros((rows, width), F32))
    pre = acc + b1_ref[:, hidden].astype(F32)
    return pre if activation is None else activation(pre).astype(x_ref.dtype)


def _ln_fc1_kernel(x_ref, a_ref, scale_ref, bias_ref, w1_ref, b1_ref, h_ref, *, eps, n):
    """One program: GELU(LN(y)·W1 + b1) for a block of rows and one 128-wide hidden block."""
    rows = x_ref.shape[0]
    real = program_rows(rows, n, axis=1)
    mean, inv = _moments(x_ref, a_ref, real, eps)
    h = _ln_fc1(x_ref, a_ref, scale_ref, bias_ref, w1_ref, b1_ref, slice(None), mean, inv, real)
    plgpu.store(h_ref, h, mask=real)


def _fc2_kernel(h_ref, x_ref, a_ref, w2_ref, b2_ref, z_ref, *, n):
    """One program: z = y + h·W2 + b2 for a block of rows and one 128-wide output block."""
    rows, d_ff = h_ref.shape
    real = program_rows(rows, n, axis=1)

    def product(k, acc):
        cols = block_slice(k)
        return acc + dot(masked_load(h_ref.at[:, cols], real), w2_ref[cols, :])

    acc = jax.lax.fori_loop(0, d_ff // BLOCK, product, jnp.zeros((rows, BLOCK), F32))
    y = _residual(x_ref, a_ref, slice(None), real)
    plgpu.store(z_ref, (y + acc + b2_ref[...].astype(F32)).astype(z_ref.dtype), mask=real)


def _pallas_two_kernels(x, a, scale, bias, w1, b1, w2, b2, eps, tiling, *, interpret):
    """The two kernels: h = GELU(LN(x + a)·W1 + b1) to memory (the compute dtype), then
    z = x + a + h·W2 + b2. Grid axis 0 walks the 128-wide column blocks, so the programs that
    share a block of rows run side by side and re-read its x and a from L2, not memory."""
    n, d = x.shape
    f = w1.shape[1]
    rows = pl.cdiv(n, tiling.block_n)
    row_block = lambda width: pl.BlockSpec((tiling.block_n, width),          # noqa: E731
                                           lambda j, i: (i, 0))
    tile = pl.BlockSpec((tiling.block_n, BLOCK), lambda j, i: (i, j))
    whole = lambda *shape: pl.BlockSpec(shape, lambda j, i: (0, 0))          # noqa: E731
    column = lambda height: pl.BlockSpec((height, BLOCK), lambda j, i: (0, j))  # noqa: E731
    params = plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    y = _summands(x, a)
    h = pl.pallas_call(
        _taking(functools.partial(_ln_fc1_kernel, eps=eps, n=n), a),
        out_shape=jax.ShapeDtypeStruct((n, f), x.dtype), grid=(f // BLOCK, rows),
        in_specs=[*[row_block(d)] * len(y), whole(1, d), whole(1, d), column(d), column(1)],
        out_specs=tile, compiler_params=params, interpret=interpret, name="flurka_ln_fc1",
    )(*y, row_vector(scale, x.dtype), row_vector(bias, x.dtype), w1.astype(x.dtype),
      row_vector(b1, x.dtype))
    return pl.pallas_call(
        _taking(functools.partial(_fc2_kernel, n=n), a, at=2),
        out_shape=jax.ShapeDtypeStruct((n, d), x.dtype), grid=(d // BLOCK, rows),
        in_specs=[row_block(f), *[tile] * len(y), column(f), column(1)],
        out_specs=tile, compiler_params=params, interpret=interpret, name="flurka_fc2_residual",
    )(h, *y, w2.astype(x.dtype), row_vector(b2, x.dtype))


def _one_kernel(x_ref, a_ref, scale_ref, bias_ref, w1_ref, b1_ref, w2_ref, b2_ref, z_ref,
                *statistics_refs, eps, n, next_eps):
    """One program: z for a block of rows — a loop over the hidden layer's blocks, each
    multiplied into every output block's float32 accumulator as soon as it is computed. With
    ``next_eps``: also z's row statistics (mean, 1/σ) for the next LayerNorm, from z as stored,
    while its rows are in registers."""
    rows = x_ref.shape[0]
    real = program_rows(rows, n, axis=0)
    mean, inv = _moments(x_ref, a_ref, real, eps)
    cols = column_blocks(x_ref.shape[1])

    def hidden_block(j, accs):
        h = _ln_fc1(x_ref, a_ref, scale_ref, bias_ref, w1_ref, b1_ref, block_slice(j), mean, inv,
                    real)
        return tuple(acc + dot(h, w2_ref[block_slice(j), c]) for acc, c in zip(accs, cols))

    accs = jax.lax.fori_loop(0, w1_ref.shape[1] // BLOCK, hidden_block,
                             tuple(jnp.zeros((rows, BLOCK), F32) for _ in cols))
    sums = (0.0, 0.0)
    for acc, c in zip(accs, cols):
        out = (_residual(x_ref, a_ref, c, real) + acc + b2_ref[:, c].astype(F32)
               ).astype(z_ref.dtype)
        plgpu.store(z_ref.at[:, c], out, mask=real)
        if next_eps is not None:   # z's rows as stored
            out = out.astype(F32)
            sums = (sums[0] + jnp.sum(out, axis=1, keepdims=True),
                    sums[1] + jnp.sum(out * out, axis=1, keepdims=True))
    if next_eps is not None:
        mask = None if real is None else real[:, 0]
        for ref, value in zip(statistics_refs, moments(*sums, x_ref.shape[1], next_eps)):
            plgpu.store(ref, value[:, 0], mask=mask)


def _pallas_one_kernel(x, a, scale, bias, w1, b1, w2, b2, eps, tiling, next_eps=None, *,
                       interpret):
    """The one kernel over blocks of ``tiling.block_n`` rows: z, or with ``next_eps`` [z, its
    rows' mean, 1/σ (float32 [n])]."""
    n, d = x.shape
    f = w1.shape[1]
    rows = pl.BlockSpec((tiling.block_n, d), lambda i: (i, 0))
    whole = lambda *shape: pl.BlockSpec(shape, lambda i: (0, 0))          # noqa: E731
    out_shape, out_specs = jax.ShapeDtypeStruct((n, d), x.dtype), rows
    if next_eps is not None:
        out_shape = [out_shape] + [jax.ShapeDtypeStruct((n,), F32)] * 2
        out_specs = [rows] + [pl.BlockSpec((tiling.block_n,), lambda i: (i,))] * 2
    y = _summands(x, a)
    return pl.pallas_call(
        _taking(functools.partial(_one_kernel, eps=eps, n=n, next_eps=next_eps), a),
        out_shape=out_shape, grid=(pl.cdiv(n, tiling.block_n),),
        in_specs=[*[rows] * len(y), whole(1, d), whole(1, d), whole(d, f), whole(1, f),
                  whole(f, d), whole(1, d)],
        out_specs=out_specs,
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps,
                                             num_stages=tiling.num_stages),
        interpret=interpret, name="flurka_ffn_block",
    )(*y, row_vector(scale, x.dtype), row_vector(bias, x.dtype), w1.astype(x.dtype),
      row_vector(b1, x.dtype), w2.astype(x.dtype), row_vector(b2, x.dtype))


# The gradient kernel's launch: rows per program such that its [rows, d_model] float32
# accumulator (∂LN(y)) takes 128 registers a thread over 8 warps; past d_model 2048 (fewer than
# 16 rows) the gradient is the XLA path's, recomputed.
BWD_WARPS = 8
# Hidden columns per loop step: the widest that ptxas compiles without a spill at 64 rows × 8
# warps on the warpgroup MMA (Hopper's takes 64 rows; fewer fall back to mma.sync), at the flash
# comparison's d_model = FFN = 512 in bf16 (its numbers: benchmarks/results/h100/NOTES.md).
BWD_HIDDEN = 32
BWD_ACCUMULATOR = 128 * 32 * BWD_WARPS    # float32 elements: 128 registers × 256 threads


def backward_rows(d_model: int) -> int | None:
    """Rows per program of the gradient kernel at this width (None: too wide for it)."""
    rows = min(64, BWD_ACCUMULATOR // d_model)
    return rows if rows >= 16 else None


def _backward_kernel(x_ref, a_ref, dz_ref, scale_ref, bias_ref, w1_ref, b1_ref, w2_ref, dy_ref,
                     normed_ref, h_ref, dh_ref, dscale_ref, dbias_ref, db1_ref, db2_ref, *, eps,
                     n):
    """One program, a block of rows: the block's gradient with its hidden layer recomputed
    block by block (flash attention's recipe). Per 128-wide hidden block j: the pre-activation
    p_j = LN(y)·W1[:, j] + b1_j, h_j = GELU(p_j) (written: fc2's weight gradient takes it),
    ∂h_j = ∂z·W2[j, :]ᵀ, ∂p_j = GELU'(p_j)·∂h_j (written: fc1's takes it) multiplied into every
    column block of ∂LN(y) at once (float32 accumulators carried by the loop). Then the
    LayerNorm's backward per row — ∂y = r·(u − mean(u) − ŝ·mean(u·ŝ)) + ∂z with u = γ·∂LN(y),
    ŝ = (y − μ)·r — and this block's shares of the column sums ∂γ = Σ ∂LN(y)·ŝ, ∂β = Σ ∂LN(y),
    ∂b1 = Σ ∂p and ∂b2 = Σ ∂z. LN(y) is written for fc1's weight gradient. Rows past n load as
    zeros: their ∂z is zero, so they add nothing."""
    rows, d_model = x_ref.shape
    real = program_rows(rows, n, axis=0)
    mean, inv = _moments(x_ref, a_ref, real, eps)
    cols = column_blocks(d_model)
    for c in cols:
        normed = normalise(_residual(x_ref, a_ref, c, real), mean, inv, None,
                           scale_ref[:, c].astype(F32), bias_ref[:, c].astype(F32))
        plgpu.store(normed_ref.at[:, c], normed.astype(normed_ref.dtype), mask=real)

    def hidden_block(j, accs):
        hidden = block_slice(j, BWD_HIDDEN)
        pre = _ln_fc1(x_ref, a_ref, scale_ref, bias_ref, w1_ref, b1_ref, hidden, mean, inv, real,
                      activation=None)
        dh = jax.lax.fori_loop(
            0, d_model // BLOCK,
            lambda k, acc: acc + dot(masked_load(dz_ref.at[:, block_slice(k)], real),
                                     w2_ref[hidden, block_slice(k)], ((1,), (1,))),
            jnp.zeros((rows, BWD_HIDDEN), F32))
        h, gelu_vjp = jax.vjp(jax.nn.gelu, pre)
        (dpre,) = gelu_vjp(dh)
        plgpu.store(h_ref.at[:, hidden], h.astype(h_ref.dtype), mask=real)
        dpre = dpre.astype(dh_ref.dtype)
        plgpu.store(dh_ref.at[:, hidden], dpre, mask=real)
        db1_ref[:, hidden] = jnp.sum(dpre.astype(F32), axis=0, keepdims=True)
        return tuple(acc + dot(dpre, w1_ref[c, hidden], ((1,), (1,)))
                     for acc, c in zip(accs, cols))

    dnormed = jax.lax.fori_loop(0, w1_ref.shape[1] // BWD_HIDDEN, hidden_block,
                                tuple(jnp.zeros((rows, BLOCK), F32) for _ in cols))

    def emit(c, dy):               # the residual's gradient joins the LayerNorm's
        dz = masked_load(dz_ref.at[:, c], real).astype(F32)
        plgpu.store(dy_ref.at[:, c], (dy + dz).astype(dy_ref.dtype), mask=real)
        db2_ref[:, c] = jnp.sum(dz, axis=0, keepdims=True)

    layer_norm_backward(dnormed, cols, lambda c: (_residual(x_ref, a_ref, c, real) - mean) * inv,
                        scale_ref, inv, dscale_ref, dbias_ref, emit)


def _pallas_backward(x, a, dz, scale, bias, w1, b1, w2, eps, *, interpret):
    """(∂y, LN(y), h, ∂p) [n, ·] in the compute dtype and the programs' float32 shares of ∂γ,
    ∂β, ∂b1 and ∂b2 [programs, 1, ·]."""
    n, d = x.shape
    f = w1.shape[1]
    block_n = backward_rows(d)
    programs = pl.cdiv(n, block_n)
    rows = lambda width: pl.BlockSpec((block_n, width), lambda i: (i, 0))   # noqa: E731
    whole = lambda *shape: pl.BlockSpec(shape, lambda i: (0, 0))          # noqa: E731
    share = lambda width: pl.BlockSpec((pl.squeezed, 1, width), lambda i: (i, 0, 0))  # noqa: E731
    shares = lambda width: jax.ShapeDtypeStruct((programs, 1, width), F32)     # noqa: E731
    y = _summands(x, a)
    return pl.pallas_call(
        _taking(functools.partial(_backward_kernel, eps=eps, n=n), a),
        out_shape=[jax.ShapeDtypeStruct((n, d), x.dtype), jax.ShapeDtypeStruct((n, d), x.dtype),
                   jax.ShapeDtypeStruct((n, f), x.dtype), jax.ShapeDtypeStruct((n, f), x.dtype),
                   shares(d), shares(d), shares(f), shares(d)],
        grid=(programs,),
        in_specs=[*[rows(d)] * len(y), rows(d), whole(1, d), whole(1, d), whole(d, f),
                  whole(1, f), whole(f, d)],
        out_specs=[rows(d), rows(d), rows(f), rows(f), share(d), share(d), share(f), share(d)],
        compiler_params=plgpu.CompilerParams(num_warps=BWD_WARPS, num_stages=1),
        interpret=interpret, name="flurka_ffn_block_bwd",
    )(*y, dz.astype(x.dtype), row_vector(scale, x.dtype), row_vector(bias, x.dtype),
      w1.astype(x.dtype), row_vector(b1, x.dtype), w2.astype(x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11))
def _fused(x, a, scale, bias, w1, b1, w2, b2, eps, tiling, interpret, next_eps):
    """z, or with ``next_eps`` (the one kernel only) (z, its rows' mean, 1/σ)."""
    if tiling.kernels == 2:
        call = functools.partial(_pallas_two_kernels, x, a, scale, bias, w1, b1, w2, b2, eps,
                                 tiling)
    else:
        call = functools.partial(_pallas_one_kernel, x, a, scale, bias, w1, b1, w2, b2, eps,
                                 tiling, next_eps)
    out = on_gpu_or_interpreted(call, interpret)
    return out if next_eps is None else tuple(out)


def _fused_fwd(x, a, scale, bias, w1, b1, w2, b2, eps, tiling, interpret, next_eps):
    return (_fused(x, a, scale, bias, w1, b1, w2, b2, eps, tiling, interpret, next_eps),
            (x, a, scale, bias, w1, b1, w2, b2))


def _fused_bwd(eps, tiling, interpret, next_eps, saved, g):
    """The gradient kernel (:func:`_backward_kernel`), then the weights' gradients as XLA GEMMs
    over the rows it wrote (a [d, f] sum over N belongs to a GEMM, not to per-program shares);
    too wide for it: the XLA path's, recomputed. z's statistics take no gradient (constants to
    their consumers, whose LayerNorm backward differentiates through z itself)."""
    if next_eps is not None:
        g = g[0]
    x, a, scale, bias, w1, b1, w2, b2 = saved
    if backward_rows(x.shape[1]) is None:
        _, vjp = jax.vjp(functools.partial(reference_ffn_block, eps=eps), *saved)
        return vjp(g)
    dy, normed, h, dpre, *shares = on_gpu_or_interpreted(functools.partial(
        _pallas_backward, x, a, g, scale, bias, w1, b1, w2, eps), interpret)
    dscale, dbias, db1, db2 = (s.sum(axis=(0, 1)).astype(p.dtype)
                               for s, p in zip(shares, (scale, bias, b1, b2)))
    return (dy, None if a is None else dy, dscale, dbias,
            dot(normed, dpre, ((0,), (0,))).astype(w1.dtype), db1,
            dot(h, g.astype(x.dtype), ((0,), (0,))).astype(w2.dtype), db2)


_fused.defvjp(_fused_fwd, _fused_bwd)


def ffn_tiling(fused_ffn, d_model: int, d_ff: int) -> FfnTiling | None:
    """An encoder block's ``fused_ffn`` option, resolved at construction (True: the tiling
    :func:`use_ffn_tiling` sets now) and its sizes checked."""
    if not fused_ffn:
        return None
    tiling = fused_ffn if isinstance(fused_ffn, FfnTiling) else current_ffn_tiling()
    check_fusable(d_model, d_ff, tiling)
    return tiling


def fused_ffn_block(x, a, scale, bias, w1, b1, w2, b2, *, eps: float,
                    tiling: FfnTiling | None = None, interpret: bool = False,
                    next_eps: float | None = None):
    """z = y + W2·GELU(W1·LN(y) + b1) + b2 with y = x + a, for x, a [..., d_model] in the compute
    dtype — or y = x where ``a`` is None (the attention's kernel wrote x + a: one operand less
    read, here and in the gradient kernel); the LayerNorm's ``scale``/``bias`` [d_model],
    W1 [d_model, d_ff], W2 [d_ff, d_model]. ``tiling``: how (default:
    :func:`current_ffn_tiling`); ``interpret``: Pallas's interpreter even on a GPU (tests).
    ``next_eps``: (z, z's row statistics for the next block's LayerNorm
    with that eps — (mean, 1/σ) float32 [...], constants to autodiff — or None): the one-kernel
    form has z's rows in registers as it writes them, so the next layer's kernels need no pass
    over z for them (:meth:`~flurka.kernels.compress.PreNorm.of`); the two kernels
    have no whole row in one program."""
    tiling = (tiling or current_ffn_tiling()).for_dtype(x.dtype)
    check_fusable(x.shape[-1], w1.shape[1], tiling)
    lead = x.shape[:-1]
    flat = lambda v: v.reshape(-1, v.shape[-1])   # noqa: E731 - a bitcast, no pass
    with_statistics = next_eps is not None and tiling.kernels == 1
    a = None if a is None else flat(a.astype(x.dtype))
    out = _fused(flat(x), a, scale, bias, w1, b1, w2, b2, float(eps), tiling, interpret,
                 float(next_eps) if with_statistics else None)
    z, statistics = (out[0], out[1:]) if with_statistics else (out, None)
    z = z.reshape(*lead, x.shape[-1])
    if next_eps is None:
        return z
    return z, None if statistics is None else tuple(
        jax.lax.stop_gradient(s.reshape(lead)) for s in statistics)
