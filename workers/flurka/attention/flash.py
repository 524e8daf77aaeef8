"""Flash attention through ``jax.nn.dot_product_attention`` (cuDNN where it can run, else XLA).

Product order (same maths and FLOPs as ``full``; cuDNN fuses steps 2-4 and never materialises
the N×N matrix in HBM):
  1. Q, K, V = X W_Q, X W_K, X W_V            3 × [N, d_m] · [d_m, d_m]
  2. S = Q Kᵀ / √d_h                          [N, d_h] · [d_h, N]      (per head)
  3. softmax(S) (masked keys excluded)
  4. A V                                      [N, N] · [N, d_h]       (per head)
  5. out = concat_heads · W_O

``layer.implementation`` says which path runs: ``"cudnn"`` when the backend is a CUDA GPU, the
q/k/v compute dtype (``dtype``, else ``param_dtype``) is bf16/fp16 and the head dim is a multiple of
8 and ≤ 128 (≤ 256 on Hopper+ with cuDNN ≥ 9.5); ``"xla"`` otherwise. It is decided at
construction from static facts, so it is a plain attribute, stable under jit. Both paths accumulate
the softmax in float32.

Padding: by default the key mask goes in as ``mask=[b,1,1,N]`` (exact for any mask). cuDNN turns a
mask into an additive bias and accepts it only at full size (jax 0.11 / cuDNN 9.19 reject the
broadcast [b,1,1,N] form: "Bias must have same seq length as QKV"), so there it is
broadcast to [b,1,N,N] — exact, but O(N²) memory, and training needs an even sequence length.
``padding="right"`` passes ``key_value_seq_lengths = mask.sum(-1)`` instead (cuDNN's fast padding path), exact only for
right-padded masks (real tokens first).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from flurka.attention.base import AttentionLayer

IMPLEMENTATIONS = ("auto", "cudnn", "xla")
PADDINGS = ("any", "right")


def cudnn_unsupported_reason(dtype: Any, head_dim: int) -> str | None:
    """Why cuDNN flash attention cannot run here, or None if it can (DESIGN.md's rules)."""
    if jax.default_backend() != "gpu":
        return f"backend is {jax.default_backend()!r}, cuDNN needs a CUDA GPU"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"compute dtype is {jnp.dtype(dtype).name}, cuDNN flash needs bfloat16/float16"
    try:
        device = jax.devices("gpu")[0]
        capability = tuple(int(c) for c in str(device.compute_capability).split("."))
    except Exception:  # ROCm or unknown device: no cuDNN
        return "GPU has no CUDA compute capability (not an NVIDIA device)"
    h_max = 128
    if capability >= (9, 0):
        try:
            from jax._src.cudnn.fused_attention_stablehlo import check_cudnn_version
            if check_cudnn_version() >= 90500:
                h_max = 256
        except Exception:
            pass
    if head_dim % 8 or head_dim > h_max:
        return f"head dim {head_dim} must be a multiple of 8 and <= {h_max} for cuDNN flash"
    return None


def flash_attention(q, k, v, key_mask=None, *, implementation="xla", padding="any"):
    """Core on projected heads [b, n, h, d] via jax.nn.dot_product_attention; float32 out."""
    kwargs = {}
    if key_mask is not None:
        if padding == "right":
            kwargs["key_value_seq_lengths"] = key_mask.sum(-1, dtype=jnp.int32)
        elif implementation == "cudnn":  # cuDNN takes the bias only at full [b, 1, Nq, Nk] size
            b, n_q, n_k = q.shape[0], q.shape[1], key_mask.shape[-1]
            kwargs["mask"] = jnp.broadcast_to(key_mask[:, None, None, :], (b, 1, n_q, n_k))
        else:
            kwargs["mask"] = key_mask[:, None, None, :]
    out = jax.nn.dot_product_attention(q, k, v, implementation=implementation, **kwargs)
    return out.astype(jnp.float32)


class FlashAttention(AttentionLayer):
    """Exact softmax attention on the fused kernel; ``implementation`` reports the path."""

    mechanism = "flash"
    align_unsupported = "the fused kernel tiles the sequence itself and bounds the head dim"

    def __init__(self, *, d_model, num_heads, max_len, rngs, implementation: str = "auto",
                 padding: str = "any", **kwargs):
        super().__init__(d_model=d_model, num_heads=num_heads, max_len=max_len, rngs=rngs, **kwargs)
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"flash: implementation must be one of {IMPLEMENTATIONS}, "
                             f"got {implementation!r}")
        if padding not in PADDINGS:
            raise ValueError(f"flash: padding must be one of {PADDINGS}, got {padding!r}")
        self.compute_dtype = jnp.dtype(kwargs.get("dtype") or kwargs.get("param_dtype", jnp.float32))
        reason = cudnn_unsupported_reason(self.compute_dtype, self.head_dim)
        if implementation == "cudnn" and reason:
            raise ValueError(f"flash: implementation='cudnn' cannot run: {reason}")
        if implementation == "auto":
            implementation = "xla" if reason else "cudnn"
        self.implementation = implementation
        self.padding = padding

    def core(self, q, k, v, key_mask, rng):
        if self.implementation == "cudnn":  # cuDNN needs all three in bf16/fp16
            q, k, v = (t.astype(self.compute_dtype) for t in (q, k, v))
        return flash_attention(q, k, v, key_mask, implementation=self.implementation,
                               padding=self.padding)
