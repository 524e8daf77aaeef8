"""Aligned execution (``align=``): the same function on padded GEMM shapes.

align=12 on the test sizes pads every dimension the option touches: d_model 16 → 24, d_h 8 → 12,
N 19 → 24, d_k 7 → 12, m 5 → 12.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import build, inputs, reference, sin_loss_grads
from flax import nnx

from flurka.attention import make_attention

ALIGNABLE = ["full", "linformer", "performer", "rnn", "flurka-performer", "flurka-rnn",
             "eva", "flurka-eva"]
CASES = [(m, None) for m in ALIGNABLE] + [(m, s) for m in ("linformer", "flurka-rnn")
                                           for s in ("kv", "none")]
OPTIONS = dict(d_k=7, num_features=5)


def pair(mechanism, sharing, align=12):
    opts = dict(OPTIONS, **({"sharing": sharing} if sharing else {}))
    return build(mechanism, 3, **opts), build(mechanism, 3, align=align, **opts)


@pytest.mark.parametrize("mechanism,sharing", CASES)
def test_aligned_layer_matches_float64_reference(mechanism, sharing, rng_seed):
    plain, aligned = pair(mechanism, sharing)
    for padded in (True, False):
        x, mask = inputs(rng_seed + padded, seq=19, padded=padded)
        got = aligned(x, mask if padded else None)
        assert got.shape == x.shape and got.dtype == x.dtype
        ref = reference(plain, x, mask)      # the unaligned layer's parameters, from the formulas
        real = np.asarray(mask)
        np.testing.assert_allclose(np.asarray(got)[real], ref[real], rtol=1e-5,
                                   atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("mechanism,sharing", CASES)
def test_aligned_layer_has_the_same_parameters_and_gradients(mechanism, sharing, rng_seed):
    plain, aligned = pair(mechanism, sharing)
    shapes = lambda m: jax.tree.map(jnp.shape, nnx.state(m))  # noqa: E731
    assert shapes(plain) == shapes(aligned)
    x, mask = inputs(rng_seed, seq=19)
    g_plain, g_aligned = (jax.tree.leaves(sin_loss_grads(m, x, mask)) for m in (plain, aligned))
    scale = max(float(jnp.max(jnp.abs(g))) for g in g_plain)  # some are 0 in exact arithmetic
    for gp, ga in zip(g_plain, g_aligned):                   # (softmax ignores W_K's bias)
        np.testing.assert_allclose(ga, gp, atol=1e-5 * scale, rtol=0)


def dot_operand_shapes(hlo: str):
    """Shapes of both operands of every dot in StableHLO text."""
    for line in hlo.splitlines():
        if "stablehlo.dot_general" in line:
            sig = line.rsplit(":", 1)[1]
            yield [tuple(int(d) for d in t.split("x")[:-1])
                   for t in re.findall(r"tensor<([0-9x]+x[a-z0-9]+)>", sig)[:2]]


def test_every_gemm_dimension_is_aligned():
    """With align=128 at unaligned sizes, every dot operand dimension is a multiple of 128, except
    batch (1) and heads (2): the point of the option — and E's d_k rows (100), which stay as
    stored: padding E would copy it on every call, and E·X's GEMM needs its row pitch (N, here
    padded to 256) aligned, not its row count; the compressed rows are padded after it."""
    layer = make_attention("flurka-performer", d_model=2 * 130, num_heads=2, max_len=200,
                           d_k=100, num_features=70, align=128, rngs=nnx.Rngs(0))
    x = jnp.ones((1, 150, 260), jnp.float32)
    graphdef, state = nnx.split(layer)
    hlo = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, x).as_text()
    operands = list(dot_operand_shapes(hlo))
    assert len(operands) >= 8                           # Q, E·X, K', V', Qω, K'ω, KV, num, out
    e_operands = {(100, 256), (256, 100)}   # E as stored, or as a CPU's E·X takes it (X first)
    assert any(e_operands & set(shapes) for shapes in operands)
    for shapes in operands:
        for shape in shapes:
            if shape not in e_operands:
                assert all(d % 128 == 0 or d in (1, 2) for d in shape), (shapes, hlo[:2000])


@pytest.mark.parametrize("mechanism,reason", [("flash", "tiles")])
def test_align_refused_where_it_cannot_be_exact(mechanism, reason):
    with pytest.raises(ValueError, match=f"{mechanism}: align is not supported: .*{reason}"):
        make_attention(mechanism, d_model=16, num_heads=2, max_len=24, d_k=8, align=8,
                       rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="hand-over layers"):
        make_attention("flurka-rnn", d_model=16, num_heads=2, max_len=24, d_k=8, align=8,
                       handover_from="linformer", rngs=nnx.Rngs(0))
    for bad in (0, -128, 12.5, True):
        with pytest.raises(ValueError, match="align must be a positive int"):
            make_attention("full", d_model=16, num_heads=2, max_len=24, align=bad,
                           rngs=nnx.Rngs(0))


def test_aligned_eva_past_max_len_keeps_its_noise(rng_seed):
    """Aligned, an input of max_len rows can run past the noise buffer's chunks (24 rows → 32 →
    36 in chunks of 3: 12 chunks against the buffer's 8): the extra chunks are all padding, so
    empty, and the real ones keep the unaligned layer's noise — the float64 formulas' output."""
    plain, aligned = pair("eva", None, align=16)
    assert aligned.noise[...].shape == plain.noise[...].shape and aligned.noise[...].shape[0] == 8
    x, mask = inputs(rng_seed, seq=24)
    got, ref = np.asarray(aligned(x, mask)), reference(plain, x, mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(got[real], ref[real], rtol=1e-5, atol=1e-5 * np.abs(ref).max())
