"""Shared pieces of every attention layer: projections, head split, input checks, masks.

Every mechanism is a subclass of :class:`AttentionLayer` with the same four projections
(``query``, ``key``, ``value``, ``out``: W_Q, W_K, W_V, W_O, all ``nnx.Linear(d_model, d_model)``)
so that up-training (paper §4.2) can copy every parameter whose path exists in both the base
model and the FLuRKA model. A subclass implements :meth:`AttentionLayer.core` on projected heads
(q, k, v, key mask); :meth:`AttentionLayer.attend` projects the input (low-rank layers compress K/V
there first) and the base class merges the heads and applies W_O.

Precision policy (bf16 operands, fp32 maths): projections run in ``dtype`` (``None`` = flax's
promotion of input and float32 parameters, i.e. float32); softmax, feature maps, normalisers and
sums run in float32; every contraction takes its operands in that compute dtype (softmax weights
and features rounded to it, as flash attention rounds P before P·V) and accumulates in float32
(``preferred_element_type``); the layer returns the input dtype. So a bf16 layer runs every
N-sized product on bf16 tensor cores (a float32 operand would make it a float32 GEMM: TF32 at
best, half the bf16 rate, and twice the bytes). All shape checks run in Python on static shapes
before any tracing work.

Aligned execution (``align=128``): the layer computes the same function on GEMM shapes padded to
multiples of ``align``, for GPU speed (cuBLAS runs the paper's N-sweep sizes — d_h 325, d_k 1500,
N 55 500, d_model 2600 — far slower than the same GEMMs padded to multiples of 128;
benchmarks/results/h200/NOTES.md). Inside the layer only:
  * the input's sequence N and width d_model get zero rows/columns; padded rows are masked as keys
    and sliced off the output;
  * the head dim d_h: zero columns of W_Q/W_K/W_V and zero rows of W_O, per head;
  * d_k (low-rank): zero rows appended to the compressed input E·X (not to E, which would copy
    E every call), the compressed rows they give masked as keys;
  * the random-feature count m: zero rows of ω, and their features are exact zeros.
Scales (1/√d_h, d_h^-1/4, m^-1/2) use the true sizes, so the output equals the unaligned layer's
up to float rounding, the parameters (and checkpoints) are unchanged, and the FLOP model still
counts the true shapes: the padding is extra work spent for speed, and is reported as such.
The EVAs' proposal (a Linear + LayerNorm over d_h) sees the true columns only. cuDNN flash tiles
itself and refuses ``align`` at construction (``align_unsupported``).
"""

from __future__ import annotations

from typing import Any

import functools

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


def pad_to(x: Array, n: int, axis: int = 1) -> Array:
    """Zero-pad (False for bool) ``axis`` of x up to length n."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n - x.shape[axis])
    return jnp.pad(x, pad)


def round_up(n: int, align: int | None) -> int:
    return n if not align else -(-n // align) * align


def zero_padding(x: Array, mask: Array | None) -> Array:
    """mask ⊙ x over the sequence axis (axis 1); padded rows become exact zeros."""
    if mask is None:
        return x
    return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x, jnp.zeros((), x.dtype))


def contract(spec: str, a: Array, b: Array, dtype: Any) -> Array:
    """``einsum(spec, a, b)`` on operands rounded to ``dtype`` (the compute dtype), accumulated and
    returned in float32. Its gradient's products also take ``dtype`` operands — the float32
    cotangent rounded to it, as flash attention's backward rounds dS — where plain autodiff of a
    float32-result einsum would run them as float32 GEMMs (in a bf16 layer: 10–57 % of the
    gradient's dot FLOPs, measured on the attention tests' sizes)."""
    dtype = jnp.dtype(dtype)
    return _contract(spec, dtype, a.astype(dtype), b.astype(dtype))


def _plain_terms(spec: str) -> tuple[str, str, str] | None:
    """(lhs, rhs, out) of a two-operand spec that is one ``dot_general``: every letter named once
    per term, each operand's letters in the other operand or the output; None for anything else
    (ellipses, traces, sums within one operand)."""
    inputs, out = spec.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    if ("." in lhs + rhs + out or any(len(set(t)) < len(t) for t in (lhs, rhs, out))
            or any(c not in rhs + out for c in lhs) or any(c not in lhs + out for c in rhs)
            or any(c not in lhs + rhs for c in out)):
        return None
    return lhs, rhs, out


def batched_dot(spec: str, a: Array, b: Array, preferred_element_type: Any = None) -> Array:
    """``einsum(spec, a, b)`` for a two-operand spec, written as the dot XLA computes fastest:
    each operand transposed to [batch, free, contracted] / [batch, contracted, free] (batch dims
    in the output's order), one ``dot_general``, the result transposed to the spec's output.
    Left to ``jnp.einsum``, a batch dim that is not leading (the heads of [b, n, h, d]) lets XLA's
    CPU layout assignment transpose the *large* operand (softmax's [N, N] weights in A·V), and
    runs the kernels' products on [b, n, h, f] features in strided layouts. A CPU choice:
    :func:`contract` takes it on CPU only (XLA's GPU layouts need no help, and there the forced
    moves add memory traffic to EVA's chunk sums)."""
    terms = _plain_terms(spec)
    if terms is None:
        return jnp.einsum(spec, a, b, preferred_element_type=preferred_element_type)
    lhs, rhs, out = terms
    batch = [c for c in out if c in lhs and c in rhs]
    summed = [c for c in lhs if c in rhs and c not in out]
    lhs_free = [c for c in lhs if c not in rhs]
    rhs_free = [c for c in rhs if c not in lhs]
    lhs_order = [lhs.index(c) for c in batch + lhs_free + summed]
    rhs_order = [rhs.index(c) for c in batch + summed + rhs_free]
    a, b = a.transpose(lhs_order), b.transpose(rhs_order)
    nb, ns = len(batch), len(summed)
    dims = ((tuple(range(nb + len(lhs_free), a.ndim)), tuple(range(nb, nb + ns))),
            (tuple(range(nb)), tuple(range(nb))))
    y = jax.lax.dot_general(a, b, dims, preferred_element_type=preferred_element_type)
    got = batch + lhs_free + rhs_free
    return y.transpose([got.index(c) for c in out])


def _dot(spec: str, a: Array, b: Array, preferred_element_type: Any = None) -> Array:
    """``einsum(spec, a, b)``: :func:`batched_dot` where the program is lowered for a CPU, plain
    ``jnp.einsum`` elsewhere (one branch is emitted per platform)."""
    return jax.lax.platform_dependent(
        a, b, cpu=functools.partial(batched_dot, spec, preferred_element_type=preferred_element_type),
        default=functools.partial(jnp.einsum, spec, preferred_element_type=preferred_element_type))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _contract(spec, dtype, a, b):
    return _dot(spec, a, b, preferred_element_type=F32)


def _contract_fwd(spec, dtype, a, b):
    return _contract(spec, dtype, a, b), (a, b)


def _contract_bwd(spec, dtype, operands, g):
    _, vjp = jax.vjp(functools.partial(_dot, spec), *operands)
    return vjp(g.astype(dtype))


_contract.defvjp(_contract_fwd, _contract_bwd)


def compress(e: Array, x: Array) -> Array:
    """E·X over the sequence: [d_k, n]·[b, n, d] → [b, d_k, d] (or per-head [h, d_k, n] →
    [b, h, d_k, d]); float32 accumulation, result in x's dtype."""
    def x_first(e, x):
        # on a CPU, X as the product's left operand: [b·d, n]·[n, d_k], the long side as its
        # rows, which XLA:CPU runs faster than E first ([d_k, n]·[n, b·d];
        # benchmarks/results/cpu/NOTES.md)
        spec = "bnd,hkn->bhkd" if e.ndim == 3 else "bnd,kn->bkd"
        return contract(spec, x, e, x.dtype)

    def e_first(e, x):
        spec = "hkn,bnd->bhkd" if e.ndim == 3 else "kn,bnd->bkd"
        return contract(spec, e, x, x.dtype)

    return jax.lax.platform_dependent(e, x, cpu=x_first, default=e_first).astype(x.dtype)


def cast_floating(tree: Any, dtype: Any) -> Any:
    """The floating leaves of a pytree cast to ``dtype`` (integer, bool and key leaves untouched):
    the bf16 compute copies of float32 master parameters (speed harness, mixed-precision training)."""
    def cast(x):
        floating = hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
        return x.astype(dtype) if floating else x
    return jax.tree_util.tree_map(cast, tree)


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
    align_unsupported: str | None = None  # why ``align`` cannot be exact here (None: it can)
    # Execution flags an encoder block reads (the kernels' layers, flurka.kernels.projected_layer,
    # set them): W_Q + query side + W_O as one kernel; the block's pre-attention LayerNorm run
    # inside the kernels (the block then calls the layer's ``fused_block``, not the layer).
    fused_projections: bool = False
    fuses_norm: bool = False

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
        align: int | None = None,
    ):
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("max_len", max_len)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        if align is not None:
            check_positive_int("align", align)
            if self.align_unsupported:
                raise ValueError(f"{self.mechanism}: align is not supported: "
                                 f"{self.align_unsupported}")
        self.align = align
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.padded_head_dim = round_up(self.head_dim, align)
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
        """Project and split: [b, n, d_model] -> [b, n, h, d_h] (aligned: [b, n, h, padded d_h]
        from the zero-padded width)."""
        if not self.align:
            return split_heads(proj(x), self.num_heads)
        return project_heads(proj, x, *self.head_weights(proj, x.shape[-1]))

    def head_weights(self, proj: nnx.Linear, d_in: int) -> tuple[Array, Array | None]:
        """``proj``'s kernel per head [d_in, h, e] and bias [h, e], zero-padded from d_model to
        d_in rows and from d_h to e = ``padded_head_dim`` columns."""
        kernel = proj.kernel[...].reshape(self.d_model, self.num_heads, self.head_dim)
        kernel = pad_to(pad_to(kernel, d_in, axis=0), self.padded_head_dim, axis=2)
        bias = proj.bias
        if bias is not None:
            bias = pad_to(bias[...].reshape(self.num_heads, self.head_dim), self.padded_head_dim)
        return kernel, bias

    def project_out(self, ctx: Array) -> Array:
        """W_O on the per-head context [b, n, h, e] -> [b, n, d_model]; aligned: W_O zero-padded
        per head from d_h to e rows (padded context columns cannot contribute) and to
        round_up(d_model) columns (sliced off by the caller)."""
        if not self.align:
            return self.out(merge_heads(ctx))
        d_out = round_up(self.d_model, self.align)
        kernel = self.out.kernel[...].reshape(self.num_heads, self.head_dim, self.d_model)
        kernel = pad_to(pad_to(kernel, self.padded_head_dim, axis=1), d_out, axis=2)
        dtype = self.out.dtype or jnp.promote_types(ctx.dtype, kernel.dtype)
        y = jnp.einsum("bnhe,hem->bnm", ctx.astype(dtype), kernel.astype(dtype))
        if self.out.bias is None:
            return y
        return y + pad_to(self.out.bias[...], d_out, axis=0).astype(dtype)

    def pad_input(self, x: Array, mask: Array | None) -> tuple[Array, Array | None]:
        """Aligned execution: x zero-padded to [b, round_up(N), round_up(d_model)], the mask
        extended with False (created if padding adds rows)."""
        b, n, d = x.shape
        n_pad = round_up(n, self.align)
        x = pad_to(pad_to(x, n_pad, axis=1), round_up(d, self.align), axis=2)
        if mask is None and n_pad > n:
            mask = jnp.ones((b, n), bool)
        return x, None if mask is None else pad_to(mask, n_pad)

    def keys_values(self, x: Array, mask: Array | None) -> tuple[Array, Array, Array | None]:
        """(K, V, their key mask) as :meth:`core` takes them; low-rank layers compress them."""
        return self.heads(self.key, x), self.heads(self.value, x), mask

    def attend(self, x: Array, mask: Array | None, rng: Array | None) -> Array:
        """Per-head context [b, n, h, d_h]: project Q, K, V from x and run :meth:`core`.
        Low-rank layers (``lowrank.LowRankKV``) override this to compress K and V first."""
        q, k, v = (self.heads(p, x) for p in (self.query, self.key, self.value))
        return self.core(q, k, v, mask, rng)

    def core(self, q: Array, k: Array, v: Array, key_mask: Array | None,
             rng: Array | None) -> Array:
        """The mechanism on projected heads q [b, n, h, d_h], k/v [b, m, h, d_h]; key_mask
        [b, m] bool or None. Returns float32 [b, n, h, d_h] (a fused query side: the compute
        dtype, which :meth:`project_out` casts to anyway)."""
        raise NotImplementedError

    def __call__(self, x: Array, mask: Array | None = None, *,
                 rng: Array | None = None) -> Array:
        self.check_inputs(x, mask)
        n, dtype = x.shape[1], x.dtype
        if self.align:
            x, mask = self.pad_input(x, mask)
        ctx = self.attend(x, mask, rng)
        return self.project_out(ctx)[:, :n, :self.d_model].astype(dtype)


def project_heads(proj: nnx.Linear, x: Array, kernel: Array, bias: Array | None,
                  spec: str = "...d,dhe->...he") -> Array:
    """x [..., d_in] through per-head weights (kernel [d_in, h, e], bias [h, e]) -> [..., h, e],
    in ``proj``'s compute dtype (flax's promotion when it has none). ``spec`` maps other layouts
    (per-head compressed inputs: "bhkd,dhe->bkhe", head h's input through head h's weights)."""
    dtype = proj.dtype or jnp.promote_types(x.dtype, kernel.dtype)
    out = jnp.einsum(spec, x.astype(dtype), kernel.astype(dtype))
    return out if bias is None else out + bias.astype(dtype)
