"""EVA's joint softmax with its chunk half in the Pallas softmax kernel (``fused=True`` on eva and
flurka-eva): :func:`fused_joint_softmax`, the same function as
:func:`flurka.attention.eva.joint_softmax`'s XLA path, which is its reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from flurka.attention.base import F32
from flurka.attention.eva import window_sum, xla_joint_softmax
from flurka.kernels.query_side import BLOCK, fused_softmax_attention


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def fused_joint_softmax(local, q, k_tilde, beta, chunk_bias, vw, scale, tiling):
    return _kernel_joint_softmax(local, q, k_tilde, beta, chunk_bias, vw, scale, tiling)


def _fused_joint_softmax_fwd(local, q, k_tilde, beta, chunk_bias, vw, scale, tiling):
    """Differentiated, past one block of head dim the chunk half's gradient would be the XLA
    path's anyway (the backward kernels' float32 dK, dV spill there): the whole joint softmax
    then runs as XLA's, whose normaliser rides on the A·β product, rather than the join through
    the lse, whose gradient passes over [N, C] once more."""
    if q.shape[-1] > BLOCK:
        def joint(*args):
            return xla_joint_softmax(*args, scale).astype(vw.dtype)
    else:
        def joint(*args):
            return _kernel_joint_softmax(*args, scale, tiling)
    return jax.vjp(joint, local, q, k_tilde, beta, chunk_bias, vw)


def _fused_joint_softmax_bwd(scale, tiling, vjp, g):
    return vjp(g)


fused_joint_softmax.defvjp(_fused_joint_softmax_fwd, _fused_joint_softmax_bwd)


def _kernel_joint_softmax(local, q, k_tilde, beta, chunk_bias, vw, scale, tiling):
    """The joint softmax of :func:`_joint_softmax` with its chunk half — the [N, C] part, C =
    N / chunk_size — in the Pallas softmax kernel
    (:func:`~flurka.kernels.query_side.fused_softmax_attention`: flash attention's online softmax
    over the chunk summaries k̃, β, empty chunks masked by a key bias), so its logits and
    weights never reach memory (``chunk_bias`` [b, C]: 0, or NEG_INF on empty chunks). The
    window half [N, w] stays in XLA. The two softmaxes join
    exactly through their log-normalisers: with Z_c = e^lse_c, Z_w = e^lse_w,
    out = (Z_c·out_c + Z_w·out_w) / (Z_c + Z_w) = s·out_c + (1 − s)·out_w, s = σ(lse_c − lse_w).
    Returns [b, n, h, d] in vw's dtype."""
    dtype = vw.dtype
    chunked, lse_c = fused_softmax_attention(
        q, k_tilde.astype(q.dtype), beta.astype(dtype), scale=scale, with_lse=True,
        bias=chunk_bias, tiling=tiling, out_dtype=dtype)
    lse_w = jax.nn.logsumexp(local, axis=-1, keepdims=True)                     # [b, h, n, 1]
    windowed = window_sum(jnp.exp(local - lse_w), vw, dtype)
    share = jax.nn.sigmoid(lse_c - lse_w[..., 0]).transpose(0, 2, 1)[..., None]   # [b, n, h, 1]
    return (share * chunked.astype(F32) + (1.0 - share) * windowed).astype(dtype)
