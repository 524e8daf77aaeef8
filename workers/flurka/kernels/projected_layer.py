"""The fused query side with the layer's own projections: out = concat_h(query side(x W_Q,h +
b_Q,h)) W_O + b_O as one Pallas kernel (``fused_projections``), for a kernel mechanism's layer
(performer, rnn and their FLuRKA variants).

:func:`flurka.kernels.query_side.fused_query_side` reads q and writes the per-head context once, but
Q = x W_Q is still a GEMM writing [N, d_model] and W_O another reading it back: four passes over
[N, d_model] around a kernel that makes two. Per block of rows this kernel loops over the heads —
q_h = x·W_Q[:, h] + b (a loop over x's 128-wide column blocks), then its context in the compute
dtype as the unfused layer rounds it, φ(q_h)·KV_h over its denominator — and multiplies each
head's context straight into every output block's float32 accumulator (W_O's rows of that head),
so q and the context never reach memory: x read once, the output written once. The FFN block's
one-kernel form (:mod:`flurka.kernels.ffn`) with the query side in place of the GELU.

Sizes: one block per head (d_h a power of two from 16 to 128), d_model a multiple of 128 up to
512 (the output accumulators live in registers), m ≤ 128; no aligned execution. The gradient is
one more kernel per head and chunk of rows (:func:`_bwd_kernel`): q_h and the context's
cotangent recomputed from x and ∂out as the forward computes q, then the query side's gradient;
it writes ∂q and the context, from which XLA's GEMMs take x̂'s gradient and W_Q's and W_O's, and
its shares of the biases' gradients. Pallas's Triton backend on GPU, its interpreter elsewhere.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flurka.attention.base import F32, round_up
from flurka.kernels.query_side import (
    BLOCK, FEATURES, block_slice, column_blocks, dot, feature_denominator, masked_load,
    on_gpu_or_interpreted, program_rows, query_side_gradient, real_rows, row_columns,
    row_features, row_vector, tile_size)
from flurka.kernels.compress import PreNorm, normalised_input_gradient

MAX_D_MODEL = 512   # four [rows, 128] output accumulators live beside a head's query side
# Its launch: 64 rows (the fewest for Hopper's warpgroup MMA) on 8 warps, one stage — the one
# that spills least on sm_90 (benchmarks/results/h100/NOTES.md). Not the tiling's (whose wide launch the
# tuner sets for another kernel).
ROWS, WARPS = 64, 8


def check_projectable(mechanism: str, d_model: int, head_dim: int, num_features: int | None,
                      align) -> None:
    """Clear error (at construction) for layers the kernel does not take."""
    problems = []
    if align:
        problems.append("aligned execution (align)")
    if d_model % BLOCK or d_model > MAX_D_MODEL:
        problems.append(f"d_model={d_model} (a multiple of {BLOCK} up to {MAX_D_MODEL})")
    if head_dim != tile_size(head_dim) or head_dim > BLOCK:
        problems.append(f"head dim {head_dim} (a power of two from 16 to {BLOCK})")
    if num_features is not None and num_features > BLOCK:
        problems.append(f"num_features={num_features} (up to {BLOCK})")
    if problems:
        raise ValueError(f"{mechanism}: fused_projections does not take {', '.join(problems)}; "
                         f"use fused=True alone")


def _kernel_context(side_refs, feature, head_dim, num_features):
    """A head's context from its rows' q: φ(q)·KV_h over the denominator φ(q)·Σφ(K)_h."""
    omega_t_ref, kv_ref, k_sum_ref = (None, *side_refs) if feature == "elu" else side_refs
    f = kv_ref.shape[1]
    denominator = feature_denominator(feature)

    def context(h, q):
        (feat,), _ = row_features([q], lambda c, j: omega_t_ref[...], column_blocks(f),
                                  feature, head_dim, num_features)
        feat = feat.astype(q.dtype)
        den = denominator(jnp.sum(feat.astype(F32) * k_sum_ref[h].astype(F32), axis=1,
                                  keepdims=True))
        return dot(feat, kv_ref[h]) / den

    return context


def _input(x_ref, norm_refs, real, rows=slice(None)):
    """(``load(c)``: column block c of x's ``rows``, ``shift``: what the LayerNorm adds to q).
    Given the LayerNorm's refs (statistics, keep or None, β·W_Q), x̂ = keep ⊙ LN(x) enters as
    its standardised rows keep·(x − mean)·rstd — the LayerNorm's scale is in W_Q's rows, its
    bias in ``shift(hc)`` = keep·(β·W_Q)[hc] (:func:`_norm_operands`): with the affine part
    applied per block as x is loaded, the kernel spilled."""
    if not norm_refs:
        return (lambda c: masked_load(x_ref.at[rows, c], real)), (lambda hc: 0.0)
    mean_ref, rstd_ref, keep_ref, shift_ref = norm_refs
    mean, rstd, keep = row_columns((mean_ref, rstd_ref, keep_ref), rows, real)
    if keep is not None:
        rstd = rstd * keep

    def load(c):
        return ((masked_load(x_ref.at[rows, c], real).astype(F32) - mean)
                * rstd).astype(x_ref.dtype)

    def shift(hc):
        return shift_ref[:, hc] if keep is None else keep * shift_ref[:, hc]

    return load, shift


def _split_norm(refs, norm):
    """(x's ref, the LayerNorm's refs — statistics, keep or None, β·W_Q — or [] where ``norm``
    is None, the rest); ``norm``: whether there is a LayerNorm and whether it has a keep."""
    x_ref, *refs = refs
    if norm is None:
        return x_ref, [], refs
    has_keep = norm == "keep"
    stats, refs = refs[:3 + has_keep], refs[3 + has_keep:]
    return x_ref, stats if has_keep else [*stats[:2], None, stats[2]], refs


def _kernel(*refs, feature, head_dim, num_features, n, norm, residual):
    """One program: a block of rows through every head and W_O. ``norm``: None (x is already
    x̂), "keep" or "all" (x's LayerNorm refs follow it, with a keep or every row real);
    ``residual``: x + the output written, summed as the FFN block sums them."""
    x_ref, norm_refs, refs = _split_norm(refs, norm)
    wq_ref, bq_ref, *side_refs, wo_ref, bo_ref, o_ref = refs
    rows, d_model = x_ref.shape
    d = head_dim
    real = program_rows(rows, n, axis=0)
    load, shift = _input(x_ref, norm_refs, real)
    cols = column_blocks(d_model)
    context = _kernel_context(side_refs, feature, head_dim, num_features)

    def head(h, accs):
        hc = block_slice(h, d)

        def product(k, acc):
            c = block_slice(k)
            return acc + dot(load(c), wq_ref[c, hc])

        q = jax.lax.fori_loop(0, d_model // BLOCK, product, jnp.zeros((rows, d), F32))
        q = (q + shift(hc) + bq_ref[:, hc].astype(F32)).astype(x_ref.dtype)   # as XLA rounds Q
        ctx = context(h, q).astype(x_ref.dtype)                            # W_O's operand
        return tuple(acc + dot(ctx, wo_ref[hc, c]) for acc, c in zip(accs, cols))

    heads = d_model // d
    accs = jax.lax.fori_loop(0, heads, head, tuple(jnp.zeros((rows, BLOCK), F32) for _ in cols))
    for acc, c in zip(accs, cols):
        out = (acc + bo_ref[:, c].astype(F32)).astype(o_ref.dtype)
        if residual:
            out = masked_load(x_ref.at[:, c], real) + out
        plgpu.store(o_ref.at[:, c], out, mask=real)


def _side_operands(side, feature, dtype):
    """The key side as the kernel reads it: per sequence KV [h, f, d] and Σφ(K) [h, 1, f], and
    for all of them ωᵀ [d, f] (FAVOR+)."""
    kv, k_sum, omega = side
    whole = [omega.astype(dtype).T] if feature == "favor" else []
    return [kv.astype(dtype), k_sum.astype(dtype)[:, :, None, :]], whole


def _norm_kind(norm):
    return None if norm is None else ("all" if norm[4] is None else "keep")


def _norm_operands(norm, wq, row_spec, shift_spec):
    """(operands, specs, W_Q as the kernels read it) for the LayerNorm the kernels apply as x is
    loaded (:func:`_input`): statistics (and keep) per row, β·W_Q; γ folded into W_Q's rows —
    LN(x)·W_Q = std(x)·(γ ⊙ W_Q) + β·W_Q."""
    if norm is None:
        return [], [], wq
    ln_scale, ln_bias, mean, rstd, keep = norm
    per_row = [t for t in (mean, rstd, keep) if t is not None]
    return ([*per_row, (ln_bias.astype(F32) @ wq.astype(F32))[None, :]],
            [*[row_spec] * len(per_row), shift_spec],
            ln_scale.astype(F32)[:, None] * wq.astype(F32))


def _pallas_projected(x, wq, bq, wo, bo, side, norm, feature, head_dim, num_features, residual,
                      *, interpret):
    """Grid (row blocks, batch): a sequence's key side is its own."""
    b, n, d_model = x.shape
    block_n = ROWS
    dtype = x.dtype
    whole = lambda *shape: pl.BlockSpec(shape, lambda i, s: (0,) * len(shape))   # noqa: E731
    per_sequence = lambda *shape: pl.BlockSpec((pl.squeezed, *shape),           # noqa: E731
                                               lambda i, s: (s,) + (0,) * len(shape))
    sequence_side, whole_side = _side_operands(side, feature, dtype)
    norm_operands, norm_specs, wq = _norm_operands(
        norm, wq, pl.BlockSpec((pl.squeezed, block_n), lambda i, s: (s, i)), whole(1, d_model))
    operands = [*norm_operands, wq.astype(dtype), row_vector(bq, dtype), *whole_side,
                *sequence_side, wo.astype(dtype), row_vector(bo, dtype)]
    specs = [*norm_specs, whole(d_model, d_model), whole(1, d_model),
             *(whole(*t.shape) for t in whole_side),
             *(per_sequence(*t.shape[1:]) for t in sequence_side), whole(d_model, d_model),
             whole(1, d_model)]
    rows = pl.BlockSpec((pl.squeezed, block_n, d_model), lambda i, s: (s, i, 0))
    return pl.pallas_call(
        functools.partial(_kernel, feature=feature, head_dim=head_dim,
                          num_features=num_features, n=n, norm=_norm_kind(norm),
                          residual=residual),
        out_shape=jax.ShapeDtypeStruct((b, n, d_model), dtype), grid=(pl.cdiv(n, block_n), b),
        in_specs=[rows, *specs], out_specs=rows,
        compiler_params=plgpu.CompilerParams(num_warps=WARPS, num_stages=1),
        interpret=interpret, name=f"flurka_{feature}_projected_query_side",
    )(x, *operands)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11))
def _fused(x, wq, bq, wo, bo, side, norm, feature, head_dim, num_features, residual, interpret):
    return on_gpu_or_interpreted(functools.partial(
        _pallas_projected, x, wq, bq, wo, bo, side, norm, feature, head_dim, num_features,
        residual), interpret)


def _fused_fwd(x, wq, bq, wo, bo, side, norm, feature, head_dim, num_features, residual,
               interpret):
    out = _fused(x, wq, bq, wo, bo, side, norm, feature, head_dim, num_features, residual,
                 interpret)
    return out, (x, wq, bq, wo, bo, side, norm)


# The gradient kernel's launch: a program per (head, BWD_CHUNK rows, sequence), in steps of
# BWD_STEP rows, its dKV and dΣφ(K) partials summed over the chunk.
BWD_STEP, BWD_CHUNK, BWD_WARPS = 32, 1024, 8


def _recomputed(x_ref, norm_refs, wq_ref, bq_ref, wo_ref, g_ref, rows, real, head_dim):
    """A step's q_h = x̂·W_Q[:, h] + b_h and the context's cotangent ∂c_h = ∂out·W_O[h, :]ᵀ,
    recomputed from x and ∂out (loops over their 128-wide column blocks) and rounded to x's
    dtype as XLA rounds Q and ∂c. Rows past n load as zeros (a zero ∂out adds nothing)."""
    load, shift = _input(x_ref, norm_refs, real, rows)

    def products(k, accs):
        c = block_slice(k)
        return (accs[0] + dot(load(c), wq_ref[c, :]),
                accs[1] + dot(masked_load(g_ref.at[rows, c], real), wo_ref[:, c], ((1,), (1,))))

    zero = jnp.zeros((real.shape[0], head_dim), F32)
    q, g = jax.lax.fori_loop(0, x_ref.shape[1] // BLOCK, products, (zero, zero))
    dtype = x_ref.dtype
    return (q + shift(slice(None)) + bq_ref[...].astype(F32)).astype(dtype), g.astype(dtype)


def _column_sum(t):
    """A block's share of a bias's gradient, float32 [1, columns]: Σ over its rows (the kernels
    write these shares of b_Q's — Σ ∂q_h as stored — and b_O's — Σ ∂out on head h's columns:
    XLA's reductions would read ∂q and ∂out once more for them)."""
    return jnp.sum(t.astype(F32), axis=0, keepdims=True)


def _bwd_kernel(*refs, feature, head_dim, num_features, step, n, norm):
    """One program: one head over a chunk of rows, step by step — q_h and ∂c_h recomputed
    (:func:`_recomputed`), then the query side's gradient
    (:func:`~flurka.kernels.query_side.query_side_gradient`). Writes ∂q_h and the context c_h (W_Q's
    and W_O's weight gradients take them), the chunk's partial dKV_h, dΣφ(K)_h and its shares of
    the biases' gradients (:func:`_column_sum`); rows past n store nothing."""
    x_ref, norm_refs, refs = _split_norm(refs, norm)
    (wq_ref, bq_ref, *side_refs, wo_ref, g_ref, dq_ref, ctx_ref, dkv_ref, dk_sum_ref, dbq_ref,
     dbo_ref) = refs
    omega_t_ref, kv_ref, k_sum_ref = (None, *side_refs) if feature == "elu" else side_refs
    chunk = x_ref.shape[0]
    first = pl.program_id(1) * chunk       # outside the loop: the interpreter needs it there
    head_columns = block_slice(pl.program_id(0), head_dim)
    kv, k_sum = kv_ref[...], k_sum_ref[...]
    omega_t = None if omega_t_ref is None else omega_t_ref[...]

    def rows_step(i, partials):
        rows = block_slice(i, step)
        real = real_rows(first + i * step, step, n)
        q, g = _recomputed(x_ref, norm_refs, wq_ref, bq_ref, wo_ref, g_ref, rows, real,
                           head_dim)
        dq, dkv, dk_sum, ctx = query_side_gradient(
            q, g.astype(F32), None, kv, k_sum, omega_t, feature=feature, head_dim=head_dim,
            num_features=num_features, denominator=feature_denominator(feature))
        dq = dq.astype(dq_ref.dtype)
        plgpu.store(dq_ref.at[rows, :], dq, mask=real)
        plgpu.store(ctx_ref.at[rows, :], ctx, mask=real)
        return partials[0] + dkv, partials[1] + dk_sum, partials[2] + _column_sum(dq)

    def g_step(i, total):          # b_O's share after the accumulators die (beside them: spills)
        rows = block_slice(i, step)
        real = real_rows(first + i * step, step, n)
        return total + _column_sum(masked_load(g_ref.at[rows, head_columns], real))

    f = kv_ref.shape[0]
    row = jnp.zeros((1, head_dim), F32)
    dkv, dk_sum, dbq = jax.lax.fori_loop(
        0, chunk // step, rows_step, (jnp.zeros((f, head_dim), F32), jnp.zeros((1, f), F32), row))
    dkv_ref[...] = dkv
    dk_sum_ref[...] = dk_sum
    dbq_ref[...] = dbq
    dbo_ref[...] = jax.lax.fori_loop(0, chunk // step, g_step, row)


def _pallas_projected_bwd(x, wq, bq, wo, side, norm, g, feature, head_dim, num_features, *,
                          interpret):
    """(∂q, the context c) [b, n, d_model] (heads side by side) in x's dtype, dKV [b, h, f, d_h],
    dΣφ(K) [b, h, f] and the biases' gradients [d_model] (float32: the chunks' partials summed).
    Grid (heads, chunks, sequences): a chunk's heads side by side re-read its x and ∂out from
    L2."""
    b, n, d_model = x.shape
    heads, f = side[0].shape[1], side[0].shape[2]
    dtype = x.dtype
    chunk = min(BWD_CHUNK, pl.next_power_of_2(round_up(n, BWD_STEP)))
    chunks = pl.cdiv(n, chunk)
    rows, head_rows, head_columns, (norm_operands, norm_specs, wq) = _bwd_specs(
        chunk, d_model, head_dim, norm, wq)
    per_head = lambda *shape: pl.BlockSpec((pl.squeezed, pl.squeezed, *shape),  # noqa: E731
                                           lambda h, r, s: (s, h, 0, 0))
    partial = lambda *shape: pl.BlockSpec((pl.squeezed,) * 3 + shape,       # noqa: E731
                                          lambda h, r, s: (s, h, r, 0, 0))
    sequence_side, whole_side = _side_operands(side, feature, dtype)
    dq, ctx, dkv, dk_sum, dbq, dbo = pl.pallas_call(
        functools.partial(_bwd_kernel, feature=feature, head_dim=head_dim,
                          num_features=num_features, step=BWD_STEP, n=n, norm=_norm_kind(norm)),
        out_shape=[jax.ShapeDtypeStruct((b, n, d_model), dtype)] * 2
        + [jax.ShapeDtypeStruct((b, heads, chunks, f, head_dim), F32),
           jax.ShapeDtypeStruct((b, heads, chunks, 1, f), F32)]
        + _shares_shape(b, chunks, d_model),
        grid=(heads, chunks, b),
        in_specs=[rows, *norm_specs, head_columns(d_model), head_columns(1),
                  *(pl.BlockSpec(t.shape, lambda h, r, s: (0, 0)) for t in whole_side),
                  *(per_head(*t.shape[2:]) for t in sequence_side),
                  pl.BlockSpec((head_dim, d_model), lambda h, r, s: (h, 0)), rows],
        out_specs=[head_rows, head_rows, partial(f, head_dim), partial(1, f),
                   *_shares_specs(head_dim)],
        compiler_params=plgpu.CompilerParams(num_warps=BWD_WARPS, num_stages=1),
        interpret=interpret, name=f"flurka_{feature}_projected_query_side_bwd",
    )(x, *norm_operands, wq.astype(dtype), row_vector(bq, dtype), *whole_side, *sequence_side,
      wo.astype(dtype), g.astype(dtype))
    return dq, ctx, dkv.sum(axis=2), dk_sum.sum(axis=(2, 3)), *_summed(dbq, dbo)


def _bwd_specs(rows, d_model, head_dim, norm, wq):
    """A (heads, row blocks, sequences) grid's specs: its ``rows`` of x or ∂out, of a head's
    columns, a head's columns of a weight (``head_columns(height)``) — and the LayerNorm's
    operands (:func:`_norm_operands`)."""
    head_columns = lambda height: pl.BlockSpec((height, head_dim),          # noqa: E731
                                               lambda h, r, s: (0, h))
    return (pl.BlockSpec((pl.squeezed, rows, d_model), lambda h, r, s: (s, r, 0)),
            pl.BlockSpec((pl.squeezed, rows, head_dim), lambda h, r, s: (s, r, h)), head_columns,
            _norm_operands(norm, wq, pl.BlockSpec((pl.squeezed, rows), lambda h, r, s: (s, r)),
                           head_columns(1)))


def _shares_shape(b, programs, d_model):
    """The gradient kernels' float32 shares of b_Q's and b_O's gradients, per (sequence, block
    of rows), heads side by side."""
    return [jax.ShapeDtypeStruct((b, programs, 1, d_model), F32)] * 2


def _shares_specs(head_dim):
    return [pl.BlockSpec((pl.squeezed, pl.squeezed, 1, head_dim),
                         lambda h, r, s: (s, r, 0, h))] * 2


def _summed(*shares):
    return tuple(t.sum(axis=(0, 1, 2)) for t in shares)


def _side_gradient(x, wq, bq, wo, side, norm, g, feature, head_dim, num_features, interpret):
    """(∂q, the context c) [b, n, d_model], the key side's gradient and b_Q's and b_O's
    (float32), from the gradient kernel (:func:`_bwd_kernel`; ω, a fixed draw, gets none)."""
    dq, ctx, dkv, dk_sum, dbq, dbo = on_gpu_or_interpreted(functools.partial(
        _pallas_projected_bwd, x, wq, bq, wo, side, norm, g, feature, head_dim, num_features),
        interpret)
    kv, k_sum, omega = side
    return dq, ctx, (dkv.astype(kv.dtype), dk_sum.astype(k_sum.dtype), jnp.zeros_like(omega)), \
        dbq, dbo


def _fused_bwd(feature, head_dim, num_features, residual, interpret, saved, g):
    """The gradient kernel (:func:`_side_gradient`: ∂q, the context, the key side's and the
    biases' gradients), then x̂'s gradient ∂q·W_Qᵀ — through the LayerNorm's backward in one more
    kernel where the LayerNorm is fused
    (:func:`~flurka.kernels.compress.normalised_input_gradient`) — and XLA's GEMMs for
    the weights' (x̂ᵀ·∂q, cᵀ·∂out); with ``residual``, ∂out reaches x as well (XLA adds it
    where it sums x's other cotangents). x's statistics and keep (constants) get none."""
    x, wq, bq, wo, bo, side, norm = saved
    dq, ctx, dside, dbq, dbo = _side_gradient(x, wq, bq, wo, side, norm, g, feature, head_dim,
                                              num_features, interpret)
    dtype = x.dtype
    g = g.astype(dtype)
    if norm is None:
        normed, dx = x, jnp.dot(dq, wq.astype(dtype).T).astype(dtype)
    else:                          # ∂x̂ = ∂q·W_Qᵀ and the LayerNorm's backward, x̂ written too
        ln_scale, ln_bias, mean, rstd, keep = norm
        dx, dscale, dbias, normed = normalised_input_gradient(
            x, keep, ln_scale, ln_bias, mean, rstd, dq, wq, interpret=interpret)
    if residual:
        dx = dx + g
    rows = lambda t: t.reshape(-1, t.shape[-1])                      # noqa: E731
    grads = [jnp.dot(rows(normed).T, rows(dq), preferred_element_type=F32).astype(wq.dtype),
             dbq.astype(bq.dtype),
             jnp.dot(rows(ctx).T, rows(g), preferred_element_type=F32).astype(wo.dtype),
             dbo.astype(bo.dtype)]
    if norm is None:
        return (dx, *grads, dside, None)
    return (dx, *grads, dside, (dscale.astype(ln_scale.dtype), dbias.astype(ln_bias.dtype),
                                jnp.zeros_like(mean), jnp.zeros_like(rstd),
                                None if keep is None else jnp.zeros_like(keep)))


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_projected_query_side(x, wq, bq, wo, bo, side, *, feature: str, head_dim: int,
                               num_features: int | None = None, norm: PreNorm | None = None,
                               residual: bool = False, interpret: bool = False):
    """[b, n, d_model] in x's dtype (the compute dtype): concat_h(query side of x W_Q,h + b_Q,h)
    W_O + b_O. x [b, n, d_model] (padded rows zeroed by the caller); W_Q, W_O [d_model, d_model],
    biases [d_model]. ``side``: the key side of the kernel ``feature`` ("favor", "elu"): KV
    [b, h, f, d_h], Σφ(K) [b, h, f], ω [f, d_h] or None. ``norm``: x is the block's input, its
    pre-attention LayerNorm applied in the kernel as x is loaded
    (:class:`~flurka.kernels.compress.PreNorm`: its statistics carry its eps); without
    it x is x̂. The kernels' launches are their own (:data:`ROWS`, :data:`WARPS`,
    :data:`BWD_STEP`, ...). ``residual`` (with ``norm``: x the block's input): x + the output,
    summed in x's dtype as the fused FFN block would sum them — the block's next kernel then
    reads one [n, d_model] operand, not two."""
    if feature not in FEATURES:
        raise ValueError(f"fused_projected_query_side: feature must be one of "
                         f"{', '.join(FEATURES)}, got {feature!r}")
    if residual and norm is None:
        raise ValueError("fused_projected_query_side: residual adds the block's input, so it "
                         "takes norm (x un-normalised)")
    kv, k_sum, omega = side
    omega = jnp.zeros((0,), x.dtype) if omega is None else jax.lax.stop_gradient(omega)
    ln = None if norm is None else (norm.scale, norm.bias, norm.mean, norm.rstd, norm.keep)
    return _fused(x, wq, bq, wo, bo, (kv, k_sum, omega), ln, feature, head_dim, num_features,
                  bool(residual), interpret)
