"""The fused query side (Pallas kernel; Pallas's interpreter on CPU) against the XLA path.

align=16 makes the test sizes tile (d_h 8 → 16, m 64, N 20 → 32, d_k 8 → 16): the kernel needs
power-of-two head dims and feature counts of at least 16.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import build, inputs, reference
from flax import nnx

from flurka.attention import make_attention

FUSABLE = ["performer", "rnn", "flurka-performer", "flurka-rnn"]


@pytest.mark.parametrize("mechanism", FUSABLE)
def test_fused_layer_matches_float64_reference(mechanism, rng_seed):
    layer = build(mechanism, 5, align=16, fused=True)
    x, mask = inputs(rng_seed)
    got = np.asarray(layer(x, mask))
    ref = reference(build(mechanism, 5), x, mask)   # same parameters, unaligned, unfused
    real = np.asarray(mask)
    np.testing.assert_allclose(got[real], ref[real], rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("mechanism", FUSABLE)
def test_fused_layer_bf16_and_gradient_match_the_xla_path(mechanism, rng_seed):
    xla, fused = (build(mechanism, 5, align=16, fused=f, dtype=jnp.bfloat16) for f in (False, True))
    x, mask = inputs(rng_seed)
    a, b = (np.asarray(m(x.astype(jnp.bfloat16), mask).astype(jnp.float32)) for m in (xla, fused))
    real = np.asarray(mask)
    assert np.linalg.norm(b[real] - a[real]) < 1e-2 * np.linalg.norm(a[real])

    def loss(m):
        return jnp.sum(jnp.sin(m(x, mask)) * mask[..., None])

    xla, fused = (build(mechanism, 5, align=16, fused=f) for f in (False, True))
    g_xla, g_fused = (jax.tree.leaves(nnx.grad(loss)(m)) for m in (xla, fused))
    scale = max(float(jnp.max(jnp.abs(g))) for g in g_xla)
    for gx, gf in zip(g_xla, g_fused):
        np.testing.assert_allclose(gf, gx, atol=1e-5 * scale, rtol=0)


def test_fused_needs_tileable_sizes_and_a_kernel_mechanism():
    with pytest.raises(ValueError, match="power of two >= 16"):
        build("rnn", fused=True)                       # d_h = 8
    with pytest.raises(ValueError, match="power of two >= 16"):
        build("performer", align=16, fused=True, num_features=100)
    with pytest.raises(ValueError, match="unknown option"):
        build("linformer", fused=True)


@pytest.mark.parametrize("mechanism", ["flurka-performer", "flurka-rnn"])
def test_fused_layer_lowers_to_a_triton_kernel_for_the_gpu(mechanism):
    """Pallas's Triton lowering runs here, without a GPU: block shapes, dots and the feature maths
    of the appendix-C size (d_h = m = 128, bf16) are accepted, and the layer's query side is one
    Triton custom call. (Compiling it to PTX and timing it need the card.)"""
    layer = nnx.eval_shape(lambda: make_attention(
        mechanism, d_model=512, num_heads=4, max_len=1024, d_k=128, num_features=128,
        dtype=jnp.bfloat16, fused=True, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(layer)
    x = jax.ShapeDtypeStruct((1, 1024, 512), jnp.bfloat16)
    lowered = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).trace(state, x).lower(
        lowering_platforms=("cuda",))
    calls = re.findall(r"custom_call @([\w$.]+)", lowered.as_text())
    assert calls.count("__gpu$xla.gpu.triton") == 1, calls
