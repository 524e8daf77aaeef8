"""Fused query side of kernel attention — the N-sized half of FLuRKA's core — as a Pallas kernel.

After the key side (φ(K')ᵀV' and φ(K')ᵀ1: d_k rows for FLuRKA, cheap) every query row needs
  φ(q) → φ(q)·KV [f×d] and φ(q)·Σφ(K) → their quotient.
XLA runs that as separate passes over [N, f] tensors (ωᵀq logits in float32, their row max, the
features, then two products reading the features again); this kernel does it per block of query
rows in one pass, so the logits and features never reach memory: it reads q and writes the output.

Same maths as the XLA path (``feature_maps.favor_features``/``elu_features`` and
``query_side``), same precision policy (products on compute-dtype operands,
float32 accumulation, features rounded to the compute dtype), so that path is the reference the
kernel is tested against — and the gradient: the backward pass is the reference's, recomputed by
XLA (the fused kernel speeds the forward; training keeps XLA's backward).

Pallas's Triton backend on GPU; elsewhere (CPU tests) Pallas's interpreter runs the same kernel.
Triton's blocks are powers of two, and its dots need sides ≥ 16: the (padded) head dim and the
(padded) feature count must be powers of two ≥ 16 — checked at layer construction
(:func:`check_fusable`). The appendix-C flash comparison (d_h = m = 128) qualifies; the N-sweep's
d_h = m = 325 does not (aligned execution is its fix).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flurka.attention.base import F32, pad_to, round_up
from flurka.attention.feature_maps import (
    FAVOR_EPS, elu_features, favor_denominator, favor_features, query_side, rnn_denominator)

Array = jax.Array
FEATURES = ("favor", "elu")
BLOCK_N = 128  # query rows per program


def check_fusable(mechanism: str, head_dim: int, num_features: int | None = None) -> None:
    """Clear error (at construction, before any compute) when the kernel's sizes cannot tile."""
    for name, size in (("head dim", head_dim), ("num_features", num_features)):
        if size is not None and (size < 16 or size & (size - 1)):
            raise ValueError(f"{mechanism}: fused=True needs the {name} (after any align padding) "
                             f"to be a power of two >= 16 (Triton blocks), got {size}")


def reference_query_side(q, kv, k_sum, omega, *, feature: str, head_dim: int,
                         num_features: int | None):
    """The XLA path's query half (what the kernel computes); float32 [b, n, h, d]."""
    if feature == "favor":
        feat = favor_features(q, omega, is_query=True, head_dim=head_dim,
                              num_features=num_features)
        return query_side(feat, kv, k_sum, favor_denominator, q.dtype)
    return query_side(elu_features(q, head_dim=head_dim), kv, k_sum, rnn_denominator, q.dtype)


def _kernel(*refs, feature, head_dim, num_features):
    if feature == "favor":
        q_ref, omega_t_ref, kv_ref, k_sum_ref, o_ref = refs
    else:
        q_ref, kv_ref, k_sum_ref, o_ref = refs
    q = q_ref[...]                                                       # [bn, d] compute dtype
    qf = q.astype(F32)
    f = kv_ref.shape[0]
    real = jax.lax.broadcasted_iota(jnp.int32, (1, f), 1) < (num_features or head_dim)
    if feature == "favor":
        dash = head_dim ** -0.25 * jnp.dot(q, omega_t_ref[...], preferred_element_type=F32)
        logit = dash - 0.5 * head_dim ** -0.5 * jnp.sum(qf * qf, axis=1, keepdims=True)
        logit = jnp.where(real, logit, -jnp.inf)
        feat = num_features ** -0.5 * (jnp.exp(logit - jnp.max(logit, axis=1, keepdims=True))
                                       + FAVOR_EPS)
        denominator = favor_denominator
    else:
        feat = jnp.where(qf > 0, qf + 1.0, jnp.exp(qf))                  # elu(q) + 1
        denominator = rnn_denominator
    feat = jnp.where(real, feat, 0.0).astype(q.dtype)
    num = jnp.dot(feat, kv_ref[...], preferred_element_type=F32)         # [bn, d]
    den = jnp.sum(feat.astype(F32) * k_sum_ref[...].astype(F32), axis=1, keepdims=True)
    o_ref[...] = num / denominator(den)


def _pallas_query_side(q, kv, k_sum, omega, feature, head_dim, num_features, *, interpret):
    b, n, h, d = q.shape
    f = kv.shape[2]
    n_pad = round_up(n, BLOCK_N)
    q_in = pad_to(q, n_pad)
    rows = pl.BlockSpec((pl.squeezed, BLOCK_N, pl.squeezed, d), lambda i, j, k: (i, k, j, 0))
    per_head = pl.BlockSpec((pl.squeezed, pl.squeezed, f, d), lambda i, j, k: (i, j, 0, 0))
    sums = pl.BlockSpec((pl.squeezed, pl.squeezed, 1, f), lambda i, j, k: (i, j, 0, 0))
    operands = [q_in, kv.astype(q.dtype), k_sum.astype(q.dtype)[:, :, None, :]]
    specs = [rows, per_head, sums]
    if feature == "favor":
        operands.insert(1, omega.astype(q.dtype).T)                     # [d, f]
        specs.insert(1, pl.BlockSpec((d, f), lambda i, j, k: (0, 0)))
    out = pl.pallas_call(
        functools.partial(_kernel, feature=feature, head_dim=head_dim, num_features=num_features),
        out_shape=jax.ShapeDtypeStruct((b, n_pad, h, d), F32),
        grid=(b, h, n_pad // BLOCK_N), in_specs=specs, out_specs=rows,
        # 8 warps once a [BLOCK_N, 128] float32 tile is live (Triton flash attention's choice at
        # head dim 128), else 4 — a starting point to tune on the card, not a measured optimum
        compiler_params=plgpu.CompilerParams(num_warps=8 if max(d, f) >= 128 else 4,
                                             num_stages=2),
        interpret=interpret, name=f"flurka_{feature}_query_side")(*operands)
    return out[:, :n]


def _query_side_kernel(q, kv, k_sum, omega, feature, head_dim, num_features, interpret):
    """The Triton kernel when lowered for a GPU, Pallas's interpreter elsewhere (chosen at
    lowering, so a CPU host can lower the GPU program); ``interpret=True`` forces the latter."""
    args = (q, kv, k_sum, omega, feature, head_dim, num_features)
    if interpret:
        return _pallas_query_side(*args, interpret=True)
    return jax.lax.platform_dependent(
        cuda=lambda: _pallas_query_side(*args, interpret=False),
        default=lambda: _pallas_query_side(*args, interpret=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _fused(q, kv, k_sum, omega, feature, head_dim, num_features, interpret):
    return _query_side_kernel(q, kv, k_sum, omega, feature, head_dim, num_features, interpret)


def _fused_fwd(q, kv, k_sum, omega, feature, head_dim, num_features, interpret):
    out = _query_side_kernel(q, kv, k_sum, omega, feature, head_dim, num_features, interpret)
    return out, (q, kv, k_sum, omega)


def _fused_bwd(feature, head_dim, num_features, interpret, saved, g):
    ref = functools.partial(reference_query_side, feature=feature, head_dim=head_dim,
                            num_features=num_features)
    _, vjp = jax.vjp(ref, *saved)
    return vjp(g)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_query_side(q: Array, kv: Array, k_sum: Array, omega: Array | None = None, *,
                     feature: str, head_dim: int, num_features: int | None = None,
                     interpret: bool = False) -> Array:
    """φ(q)·KV / denominator(φ(q)·Σφ(K)) in one kernel; float32 [b, n, h, d].

    q [b, n, h, d] (compute dtype; d may be zero-padded past ``head_dim``); kv [b, h, f, d] and
    k_sum [b, h, f] from the key side; omega [f, d] for ``feature="favor"`` (rows past
    ``num_features`` zero). Off the GPU (or with ``interpret=True``) Pallas's interpreter runs
    the kernel.
    """
    if feature not in FEATURES:
        raise ValueError(f"feature must be one of {FEATURES}, got {feature!r}")
    if omega is None:
        omega = jnp.zeros((0,), q.dtype)  # unused by the elu kernel; a leaf for the custom VJP
    return _fused(q, kv, k_sum, omega, feature, head_dim, num_features, interpret)
