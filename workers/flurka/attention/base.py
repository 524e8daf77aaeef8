"""Shared pieces of every attention layer: projections, head split, input checks, masks.

Every mechanism is a subclass of :class:`AttentionLayer` with the same four projections
(``query``, ``key``, ``value``, ``out``: W_Q, W_K, W_V, W_O, all ``nnx.Linear(d_model, d_model)``)
so that up-training (paper §4.2) can copy every parameter whose path exists in both the base
model and the FLuRKA model. A subclass implements :meth:`AttentionLayer.core` on projected heads
(q, k, v, key mask); :meth:`AttentionLayer.attend` projects the input (low-rank layers compress K/V
there first) and the base class merges the heads and applies W_O.

Precision policy (bf16 inputs, fp32 maths): projections run in ``dtype`` (``None`` = flax's
promotion of input and float32 parameters, i.e. float32); softmax, feature maps, normalisers and
every contraction accumulate in float32 (``preferred_element_type``); the layer returns the input
dtype. All shape checks run in Python on static shapes before any tracing work.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Array = jax.Array

# Logit for masked keys: finite (a fully padded row gives a uniform softmax, never NaN) and so
# negative that exp(NEG - max) is exactly 0 in float32 when any real key exists.
NEG_INF = -1e30
F32 = jnp.float32


class RandomFeatures(nnx.Variable):
    """Non-trainable random projection (FAVOR+/EVA ω). Not an ``nnx.Param``: optimizers built
    with ``wrt=nnx.Param`` skip it, and checkpoints still carry it."""


def split_heads(x: Array, num_heads: int) -> Array:
    """[b, n, d_model] -> [b, n, h, d_h]."""
    b, n, d = x.shape
    return x.reshape(b, n, num_heads, d // num_heads)


def merge_heads(x: Array) -> Array:
    """[b, n, h, d_h] -> [b, n, h*d_h]."""
    b, n, h, d = x.shape
    return x.reshape(b, n, h * d)


def zero_padding(x: Array, mask: Array | None) -> Array:
    """mask ⊙ x over the sequence axis (axis 1); padded rows become exact zeros."""
    if mask is None:
        return x
    return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x, jnp.zeros((), x.dtype))


def check_positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class AttentionLayer(nnx.Module):
    """Multi-head self-attention skeleton; subclasses define :meth:`core`.

    Call: ``layer(x, mask=None, *, rng=None)`` with ``x: [batch, seq, d_model]``, ``mask:
    [batch, seq]`` bool (True = real token), ``seq <= max_len``; returns ``[batch, seq, d_model]``
    in ``x.dtype``. ``rng`` is only used by layers that redraw random features; others ignore it.
    """

    mechanism: str = "base"

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        max_len: int,
        rngs: nnx.Rngs,
        use_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
    ):
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("max_len", max_len)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.max_len = max_len
        self.dtype = dtype

        def linear() -> nnx.Linear:
            return nnx.Linear(d_model, d_model, use_bias=use_bias, dtype=dtype,
                              param_dtype=param_dtype, rngs=rngs)

        self.query = linear()
        self.key = linear()
        self.value = linear()
        self.out = linear()

    # -- checks -------------------------------------------------------------------------------
    def check_inputs(self, x: Array, mask: Array | None) -> None:
        """Clear errors on static shapes, before any compute."""
        if getattr(x, "ndim", None) != 3:
            raise ValueError(f"{self.mechanism}: x must be [batch, seq, d_model], got shape "
                             f"{getattr(x, 'shape', None)}")
        b, n, d = x.shape
        if d != self.d_model:
            raise ValueError(f"{self.mechanism}: x has d_model={d}, layer expects {self.d_model}")
        if n > self.max_len:
            raise ValueError(f"{self.mechanism}: seq={n} exceeds max_len={self.max_len}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{self.mechanism}: x must be floating point, got {x.dtype}")
        if mask is not None:
            shape = getattr(mask, "shape", None)
            if shape != (b, n):
                raise ValueError(f"{self.mechanism}: mask must have shape [batch, seq] = {(b, n)}, "
                                 f"got {shape}")
            if mask.dtype != jnp.bool_:
                raise ValueError(f"{self.mechanism}: mask must be bool (True = real token), "
                                 f"got {mask.dtype}")

    # -- pieces subclasses use ----------------------------------------------------------------
    def heads(self, proj: nnx.Linear, x: Array) -> Array:
        """Project and split: [b, n, d_model] -> [b, n, h, d_h]."""
        return split_heads(proj(x), self.num_heads)

    def attend(self, x: Array, mask: Array | None, rng: Array | None) -> Array:
        """Per-head context [b, n, h, d_h]: project Q, K, V from x and run :meth:`core`.
        Low-rank layers (``lowrank.LowRankKV``) override this to compress K and V first."""
        q, k, v = (self.heads(p, x) for p in (self.query, self.key, self.value))
        return self.core(q, k, v, mask, rng)

    def core(self, q: Array, k: Array, v: Array, key_mask: Array | None,
             rng: Array | None) -> Array:
        """The mechanism on projected heads q [b, n, h, d_h], k/v [b, m, h, d_h]; key_mask
        [b, m] bool or None. Returns float32 [b, n, h, d_h]."""
        raise NotImplementedError

    def __call__(self, x: Array, mask: Array | None = None, *, rng: Array | None = None) -> Array:
        self.check_inputs(x, mask)
        ctx = self.attend(x, mask, rng)
        return self.out(merge_heads(ctx)).astype(x.dtype)
