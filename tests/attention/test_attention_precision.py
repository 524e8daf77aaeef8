"""bf16 layers: every product on bf16 operands (float32 accumulation), accurate to bf16's level.

A float32 operand in a bf16 layer turns that product into a float32 GEMM — TF32 at best on a GPU,
half the bf16 rate and twice the bytes. The feature maps, softmax weights and chunk summaries are
computed in float32 and rounded to the compute dtype for their products (flash attention's P·V).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import build, inputs, reference
from flax import nnx

from flurka.attention import ALIGNABLE, MECHANISMS, make_attention
from flurka.attention.base import contract
from flurka import hlo

BF16 = jnp.bfloat16
EXACT = [m for m in MECHANISMS if m != "flash"]  # flash: cuDNN's own kernel on GPU
# ~6 roundings to bf16 (2^-8 each: input, weights, Q/K/V, features or weights, context); measured
# on the test sizes over 24 seeds: at most 1.5e-2 (flurka-performer), medians 5e-3 … 1e-2.
BF16_TOLERANCE = 2.5e-2


def dot_flops_by_type(mechanism, align, grad):
    """Dot FLOPs of the layer's unoptimised HLO by operand type, at sizes where the N-sized
    products dominate; abstract parameters (nothing is materialised or run)."""
    layer = nnx.eval_shape(lambda: make_attention(
        mechanism, d_model=256, num_heads=4, max_len=2048, d_k=256, num_features=64, dtype=BF16,
        align=align, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(layer)

    def forward(state, x):
        return nnx.merge(graphdef, state)(x)

    fn = jax.grad(lambda s, x: jnp.sum(forward(s, x).astype(jnp.float32))) if grad else forward
    x = jax.ShapeDtypeStruct((1, 2048, 256), BF16)
    return hlo.dot_flops_by_type(jax.jit(fn).lower(state, x).as_text(dialect="hlo"))


@pytest.mark.parametrize("mechanism,align",
                         [(m, None) for m in EXACT] + [(m, 128) for m in ALIGNABLE])
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "gradient"])
def test_bf16_layer_multiplies_bf16_operands(mechanism, align, grad):
    flops = dot_flops_by_type(mechanism, align, grad)
    total = sum(flops.values())
    assert total > 0
    # what stays float32: EVA's adaptive proposal (d_h × d_h Linear on per-chunk means, float32
    # parameters by design) — a fraction of a percent of the layer
    assert flops.get("bf16", 0) >= 0.99 * total, flops


@pytest.mark.parametrize("mechanism,align", [(m, None) for m in EXACT] + [(m, 12) for m in ALIGNABLE])
def test_bf16_layer_matches_float64_reference(mechanism, align, rng_seed):
    layer = build(mechanism, rng_seed % 1000, dtype=BF16, align=align)
    x, mask = inputs(rng_seed)
    y = layer(x.astype(BF16), mask)
    assert y.dtype == BF16
    real = np.asarray(mask)
    ref = reference(layer, x, mask)[real]
    err = np.asarray(y.astype(jnp.float32))[real] - ref
    assert np.linalg.norm(err) < BF16_TOLERANCE * np.linalg.norm(ref)


def test_contract_gradient():
    """``contract``: float32 operands → exactly einsum's gradient; bf16 operands → the float64
    gradient to bf16's level, from products whose operands are all bf16."""
    rng = np.random.default_rng(0)
    a, b, g = (rng.normal(size=s) for s in ((2, 5, 3), (2, 3, 4), (2, 5, 4)))
    spec = "bij,bjk->bik"

    def grads(fn, dtype):
        _, vjp = jax.vjp(fn, jnp.asarray(a, dtype), jnp.asarray(b, dtype))
        return vjp(jnp.asarray(g, jnp.float32))

    exact = grads(lambda x, y: jnp.einsum(spec, x, y, preferred_element_type=jnp.float32),
                  jnp.float32)
    for got, want in zip(grads(lambda x, y: contract(spec, x, y, jnp.float32), jnp.float32), exact):
        np.testing.assert_allclose(got, want, rtol=1e-6)

    da, db = grads(lambda x, y: contract(spec, x, y, BF16), BF16)
    assert da.dtype == db.dtype == BF16
    for got, want in ((da, np.einsum("bik,bjk->bij", g, b)), (db, np.einsum("bij,bik->bjk", a, g))):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0,
                                   atol=2e-2 * np.abs(want).max())
    text = jax.jit(jax.grad(lambda x, y: jnp.sum(contract(spec, x, y, BF16)), argnums=(0, 1))).lower(
        jnp.asarray(a, BF16), jnp.asarray(b, BF16)).as_text(dialect="hlo")
    assert set(hlo.dot_flops_by_type(text)) == {"bf16"}


@pytest.mark.parametrize("mechanism", EXACT)
def test_bf16_layer_gradient_close_to_float32(mechanism, rng_seed):
    """The bf16 layer's gradient (x and every parameter) against the float32 layer's, same
    parameters. Measured over 7 seeds, before and after products took bf16 operands alike:
    linformer ≤ 0.12, flurka-eva ≤ 0.10, flurka-performer ≤ 0.06 (the gradient of E through bf16
    projections), the others ≤ 0.02 — but flurka-performer's has a tail: over seeds 0–39 median
    0.044, two at 0.14 and 0.17, and one seed drawn in a CI run past 0.2 (the seeds are fixed
    per test since: tests/attention/conftest.py)."""
    x, mask = inputs(rng_seed)

    def gradient(dtype):
        layer = build(mechanism, rng_seed % 1000, dtype=dtype)

        def loss(m, x):
            return jnp.sum(jnp.sin(m(x, mask).astype(jnp.float32)) * mask[..., None])

        g = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(layer, x.astype(dtype or jnp.float32))
        return np.concatenate([np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(g)])

    g32, g16 = gradient(None), gradient(BF16)
    assert np.all(np.isfinite(g16))
    assert np.linalg.norm(g16 - g32) < 0.2 * np.linalg.norm(g32)
