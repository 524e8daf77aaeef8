"""The fused query side with the layer's own projections: out = concat_h(query side(x W_Q,h +
b_Q,h)) W_O + b_O as one Pallas kernel, for a kernel mechanism's layer (``fused_projections``).

:func:`flurka.attention.fused.fused_query_side` reads q and writes the per-head context once, but
Q = x W_Q is still a GEMM writing [N, d_model] and W_O another reading it back: four passes over
[N, d_model] around a kernel that makes two. Per block of rows this kernel loops over the heads —
q_h = x·W_Q[:, h] + b (a loop over x's 128-wide column blocks), its features, φ(q_h)·KV_h over
its denominator, in the compute dtype as the unfused layer rounds them — and multiplies each
head's context straight into every output block's float32 accumulator (W_O's rows of that head),
so q and the context never reach memory: x read once, the output written once. The FFN block's
one-kernel form (:mod:`flurka.models.fused_ffn`) with the query side in place of the GELU.

Sizes: one block per head (d_h a power of two from 16 to 128), d_model a multiple of 128 up to
512 (the output accumulators live in registers), m ≤ 128; no aligned execution. The gradient is
the unfused fused layer's (XLA's projections around the query-side kernels and their backward),
recomputed from x. Pallas's Triton backend on GPU, its interpreter elsewhere.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flurka.attention.base import F32, merge_heads, split_heads, zero_padding
from flurka.attention.feature_maps import favor_denominator, rnn_denominator
from flurka.attention.fused import (
    BLOCK, Tiling, block_slice, column_blocks, current_tiling, dot, fused_query_side,
    masked_load, on_gpu_or_interpreted, program_rows, row_features, row_vector, tile_size)

MAX_D_MODEL = 512   # four [rows, 128] output accumulators live beside a head's query side
# Its launch: 64 rows (the fewest for Hopper's warpgroup MMA) on 8 warps, one stage — by ptxas for
# sm_90 at the flash comparison's layer, 104 B (elu) / 172 B (FAVOR+) spilled; 4 warps or 128
# rows spill 1.5-2 KB. Not the tiling's (whose wide launch the tuner sets for another kernel).
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


def reference_projected(x, wq, bq, kv, k_sum, omega, wo, bo, *, feature, head_dim,
                        num_features, tiling):
    """What the kernel computes, the unfused way: XLA's projections around
    :func:`~flurka.attention.fused.fused_query_side` (its kernels, forward and backward)."""
    heads = kv.shape[1]
    q = split_heads(jnp.dot(x, wq.astype(x.dtype)) + bq.astype(x.dtype), heads)
    ctx = fused_query_side(q, kv, k_sum, omega, feature=feature, head_dim=head_dim,
                           num_features=num_features, tiling=tiling, out_dtype=x.dtype)
    return jnp.dot(merge_heads(ctx), wo.astype(x.dtype)) + bo.astype(x.dtype)


def _kernel(*refs, feature, head_dim, num_features, n):
    """One program: a block of rows through every head and W_O."""
    if feature == "favor":
        x_ref, wq_ref, bq_ref, omega_t_ref, kv_ref, k_sum_ref, wo_ref, bo_ref, o_ref = refs
    else:
        x_ref, wq_ref, bq_ref, kv_ref, k_sum_ref, wo_ref, bo_ref, o_ref = refs
        omega_t_ref = None
    rows, d_model = x_ref.shape
    heads, f, d = kv_ref.shape
    real = program_rows(rows, n, axis=0)
    cols = column_blocks(d_model)
    denominator = favor_denominator if feature == "favor" else rnn_denominator

    def head(h, accs):
        hc = block_slice(h, d)

        def product(k, acc):
            c = block_slice(k)
            return acc + dot(masked_load(x_ref.at[:, c], real), wq_ref[c, hc])

        q = jax.lax.fori_loop(0, d_model // BLOCK, product, jnp.zeros((rows, d), F32))
        q = (q + bq_ref[:, hc].astype(F32)).astype(x_ref.dtype)          # as XLA's Q is rounded
        (feat,), _ = row_features([q], lambda c, j: omega_t_ref[...], column_blocks(f),
                                  feature, head_dim, num_features)
        feat = feat.astype(x_ref.dtype)
        den = denominator(jnp.sum(feat.astype(F32) * k_sum_ref[h].astype(F32), axis=1,
                                  keepdims=True))
        ctx = (dot(feat, kv_ref[h]) / den).astype(x_ref.dtype)             # W_O's operand
        return tuple(acc + dot(ctx, wo_ref[hc, c]) for acc, c in zip(accs, cols))

    accs = jax.lax.fori_loop(0, heads, head, tuple(jnp.zeros((rows, BLOCK), F32) for _ in cols))
    for acc, c in zip(accs, cols):
        plgpu.store(o_ref.at[:, c], (acc + bo_ref[:, c].astype(F32)).astype(o_ref.dtype),
                    mask=real)


def _pallas_projected(x, wq, bq, kv, k_sum, omega, wo, bo, feature, head_dim, num_features, *,
                      interpret):
    """Grid (row blocks, batch): a sequence's key side is its own."""
    b, n, d_model = x.shape
    heads, f, d = kv.shape[1:]
    block_n = ROWS
    dtype = x.dtype
    whole = lambda *shape: pl.BlockSpec(shape, lambda i, s: (0,) * len(shape))   # noqa: E731
    per_sequence = lambda *shape: pl.BlockSpec((pl.squeezed, *shape),           # noqa: E731
                                               lambda i, s: (s,) + (0,) * len(shape))
    operands = [wq.astype(dtype), row_vector(bq, dtype)]
    specs = [whole(d_model, d_model), whole(1, d_model)]
    if feature == "favor":
        operands.append(omega.astype(dtype).T)
        specs.append(whole(d, f))
    operands += [kv.astype(dtype), k_sum.astype(dtype)[:, :, None, :], wo.astype(dtype),
                 row_vector(bo, dtype)]
    specs += [per_sequence(heads, f, d), per_sequence(heads, 1, f), whole(d_model, d_model),
              whole(1, d_model)]
    rows = pl.BlockSpec((pl.squeezed, block_n, d_model), lambda i, s: (s, i, 0))
    return pl.pallas_call(
        functools.partial(_kernel, feature=feature, head_dim=head_dim,
                          num_features=num_features, n=n),
        out_shape=jax.ShapeDtypeStruct((b, n, d_model), dtype), grid=(pl.cdiv(n, block_n), b),
        in_specs=[rows, *specs], out_specs=rows,
        compiler_params=plgpu.CompilerParams(num_warps=WARPS, num_stages=1),
        interpret=interpret, name=f"flurka_{feature}_projected_query_side",
    )(x, *operands)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11, 12))
def _fused(x, wq, bq, kv, k_sum, omega, wo, bo, feature, head_dim, num_features, tiling,
           interpret):
    return on_gpu_or_interpreted(functools.partial(
        _pallas_projected, x, wq, bq, kv, k_sum, omega, wo, bo, feature, head_dim, num_features),
        interpret)


def _fused_fwd(x, wq, bq, kv, k_sum, omega, wo, bo, feature, head_dim, num_features, tiling,
               interpret):
    out = _fused(x, wq, bq, kv, k_sum, omega, wo, bo, feature, head_dim, num_features, tiling,
                 interpret)
    return out, (x, wq, bq, kv, k_sum, omega, wo, bo)


def _fused_bwd(feature, head_dim, num_features, tiling, interpret, saved, g):
    x, wq, bq, kv, k_sum, omega, wo, bo = saved
    reference = functools.partial(reference_projected, feature=feature, head_dim=head_dim,
                                  num_features=num_features, tiling=tiling)
    _, vjp = jax.vjp(lambda *a: reference(*a[:5], omega, *a[5:]), x, wq, bq, kv, k_sum, wo, bo)
    dx, dwq, dbq, dkv, dk_sum, dwo, dbo = vjp(g)
    return dx, dwq, dbq, dkv, dk_sum, jnp.zeros_like(omega), dwo, dbo


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_projected_query_side(x, wq, bq, kv, k_sum, omega=None, wo=None, bo=None, *,
                               feature: str, head_dim: int, num_features: int | None = None,
                               tiling: Tiling | None = None, interpret: bool = False):
    """[b, n, d_model] in x's dtype (the compute dtype): concat_h(query side of x W_Q,h + b_Q,h)
    W_O + b_O. x [b, n, d_model] (padded rows zeroed by the caller); W_Q, W_O [d_model, d_model],
    biases [d_model]; kv [b, h, f, d_h] and k_sum [b, h, f] from the key side; ω [f, d_h] for
    FAVOR+. ``tiling``: the query-side kernels' the gradient runs (their launch, not this
    kernel's: :data:`ROWS`, :data:`WARPS`)."""
    tiling = tiling if isinstance(tiling, Tiling) else current_tiling()
    if omega is None:
        omega = jnp.zeros((0,), x.dtype)
    return _fused(x, wq, bq, kv, k_sum, jax.lax.stop_gradient(omega), wo, bo, feature, head_dim,
                  num_features, tiling, interpret)


class ProjectedQuerySide:
    """Mixin for the kernel layers (performer, rnn and their FLuRKA variants): their
    ``fused_projections`` option. The layer gives ``feature``, ``fused`` (its
    :class:`~flurka.attention.fused.Tiling`), :meth:`keys_values` and ``kernel_key_side(k, v,
    key_mask, rng) -> (KV, Σφ(K), ω or None)``."""

    def init_projections(self, fused_projections: bool, num_features: int | None = None):
        if fused_projections:
            if not self.fused:
                raise ValueError(f"{self.mechanism}: fused_projections needs fused=True")
            check_projectable(self.mechanism, self.d_model, self.head_dim, num_features,
                              self.align)
        self.fused_projections = bool(fused_projections)

    def fused_layer(self, x, mask, rng):
        """The layer's output through :func:`fused_projected_query_side`, in the compute dtype;
        padded rows zeroed first (the low-rank path's order: their outputs are nobody's)."""
        x = zero_padding(x, mask).astype(self.dtype or x.dtype)
        k, v, key_mask = self.keys_values(x, mask)
        kv, k_sum, omega = self.kernel_key_side(k, v, key_mask, rng)

        def bias(proj):
            return jnp.zeros(self.d_model, x.dtype) if proj.bias is None else proj.bias[...]

        return fused_projected_query_side(
            x, self.query.kernel[...], bias(self.query), kv, k_sum, omega, self.out.kernel[...],
            bias(self.out), feature=self.feature, head_dim=self.head_dim,
            num_features=getattr(self, "num_features", None), tiling=self.fused)
