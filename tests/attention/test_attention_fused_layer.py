"""W_Q, the fused query side and W_O as one kernel (``fused_projections``; Pallas's interpreter on
CPU) against the float64 formulas and the fused layer without it."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import randomize, reference
from testsupport import triton_calls
from flax import nnx

from flurka.attention import PROJECTABLE, handover_class, make_attention
from flurka.attention.fused import Tiling
from flurka.speed.configs import Point, points

TILING = Tiling(block_n=16, bwd_block_n=16, bwd_rows=32)   # the gradient's query-side kernels
N = 150                                 # three 64-row programs per sequence, the last ragged


def _layer(mechanism, seed=0, *, d_model=128, heads=2, **options):
    layer = make_attention(mechanism, d_model=d_model, num_heads=heads, max_len=N, d_k=8,
                           num_features=64, rngs=nnx.Rngs(seed), **options)
    return randomize(layer, seed + 1000)


def _inputs(seed, d_model=128):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(2, N, d_model)), jnp.float32)
    mask = np.arange(N)[None, :] < np.array([[N], [117]])
    mask[0, 5] = False                                   # a hole: masks need not be right-padded
    return x, jnp.asarray(mask)


def test_projectable_mechanisms_are_the_kernel_layers_and_flurka_eva():
    assert set(PROJECTABLE) == {"performer", "rnn", "flurka-performer", "flurka-rnn",
                                "flurka-eva"}


@pytest.mark.parametrize("mechanism", PROJECTABLE)
def test_projected_layer_matches_float64_reference(mechanism, rng_seed):
    layer = _layer(mechanism, 5, fused=TILING, fused_projections=True)
    assert layer.fused_projections
    x, mask = _inputs(rng_seed)
    got = np.asarray(layer(x, mask))
    want = reference(_layer(mechanism, 5), x, mask)     # same parameters, unfused
    real = np.asarray(mask)
    # flurka-eva's proposal LayerNorms amplify float32 rounding: its XLA path lands 7e-6 of the
    # output's largest value from the formulas here, the kernel (q̄ from x̄ W_Q) 8e-6.
    tolerance = 2e-5 if mechanism == "flurka-eva" else 1e-5
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5,
                               atol=tolerance * np.abs(want).max())


@pytest.mark.parametrize("mechanism", PROJECTABLE)
def test_projected_layer_bf16_and_gradient_match_the_fused_layer(mechanism, rng_seed):
    """bf16 within 1 % of the fused layer without projections in the kernel; in float32 every
    parameter's gradient (the fused layer's, recomputed: XLA's projections around the query-side
    kernels) equals that layer's — flurka-eva's to 1e-4 of the largest: its q̄ is x̄ W_Q there,
    not the mean of Q, and the fused and XLA layers' own gradients differ by 1.4e-4 of a leaf's
    largest here (the proposal LayerNorms amplify float32 rounding)."""
    x, mask = _inputs(rng_seed)
    real = np.asarray(mask)
    fused, projected = (_layer(mechanism, 3, fused=TILING, fused_projections=p,
                               dtype=jnp.bfloat16) for p in (False, True))
    a, b = (np.asarray(m(x.astype(jnp.bfloat16), mask).astype(jnp.float32))
            for m in (fused, projected))
    assert np.linalg.norm(b[real] - a[real]) < 1e-2 * np.linalg.norm(a[real])

    def loss(m):
        return jnp.sum(jnp.sin(m(x, mask)) * mask[..., None])

    fused, projected = (_layer(mechanism, 3, fused=TILING, fused_projections=p)
                        for p in (False, True))
    g_fused, g_projected = (jax.tree.leaves(nnx.grad(loss)(m)) for m in (fused, projected))
    scale = max(float(jnp.max(jnp.abs(g))) for g in g_fused)
    for gf, gp in zip(g_fused, g_projected):
        np.testing.assert_allclose(gp, gf, rtol=0,
                                   atol=(1e-4 if mechanism == "flurka-eva" else 2e-5) * scale)


def test_projections_are_refused_where_the_kernel_does_not_fit():
    for options, message in (
            ({"fused_projections": True}, "fused_projections needs fused=True"),
            ({"fused": True, "fused_projections": True, "d_model": 192},
             r"d_model=192 \(a multiple of 128 up to 512\)"),
            ({"fused": True, "fused_projections": True, "d_model": 640, "heads": 5},
             "d_model=640"),
            ({"fused": True, "fused_projections": True, "d_model": 384, "heads": 4},
             r"head dim 96 \(a power of two from 16 to 128\)"),
            ({"fused": True, "fused_projections": True, "align": 128}, r"aligned execution")):
        with pytest.raises(ValueError, match=message):
            _layer("flurka-rnn", **options)
    with pytest.raises(ValueError, match=r"num_features=256 \(up to 128\)"):
        make_attention("performer", d_model=128, num_heads=2, max_len=24, num_features=256,
                       fused=True, fused_projections=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="fused_projections .* not supported by hand-over"):
        handover_class(make_attention("flurka-rnn", d_model=128, num_heads=2, max_len=24, d_k=8,
                                      rngs=nnx.Rngs(0)).__class__)(
            handover_from="rnn", d_model=128, num_heads=2, max_len=24, d_k=8, fused=True,
            fused_projections=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="fused_projections needs fused=True"):
        Point("flurka-rnn", "forward", "layer", 1024, 512, 4, d_k=128, fused_projections=True)
    with pytest.raises(ValueError, match="num_features=325"):
        Point("flurka-rnn", "forward", "layer", 1024, 1300, 4, d_k=128, num_features=325,
              fused=True, fused_projections=True)


def test_points_take_projections_where_the_layer_fits():
    flash = [p for p in points("flash-compare", fused=True, fused_projections=True)]
    assert {p.mechanism for p in flash if p.fused_projections} == {
        "flurka-performer", "flurka-rnn", "flurka-eva"}
    assert not any(p.fused_projections for p in points("n-sweep", fused=True,
                                                       fused_projections=True))   # d_h 325


def test_projected_layer_lowers_to_one_triton_kernel_for_the_gpu():
    """At the flash comparison's layer (d_model 512, 4 heads of 128, m = 128, bf16) the forward is
    one Triton call over 64-row programs on 8 warps, one stage; the gradient adds one more — per
    head (grid x) and chunk of 1024 rows (grid y) — q and the context's cotangent recomputed
    inside it, not through the query-side kernels around XLA's projections."""
    layer = nnx.eval_shape(lambda: make_attention(
        "flurka-rnn", d_model=512, num_heads=4, max_len=1024, d_k=128, dtype=jnp.bfloat16,
        fused=True, fused_projections=True, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(layer)
    x = jax.ShapeDtypeStruct((1, 1024, 512), jnp.bfloat16)

    def forward(s, x):
        return nnx.merge(graphdef, s)(x)

    def grad(s, x):
        return jax.grad(lambda s: jnp.sum(forward(s, x).astype(jnp.float32) ** 2))(s)

    for fn, names in ((forward, ["flurka_elu_projected_query_side"]),
                      (grad, ["flurka_elu_projected_query_side",
                              "flurka_elu_projected_query_side_bwd"])):
        calls = triton_calls(fn, state, x)
        assert sorted(c["name"] for c in calls) == sorted(names), calls
        launches = {c["name"]: (c["grid_x"], c["grid_y"], c["num_warps"], c["num_stages"])
                    for c in calls}
        assert launches[names[0]] == (str(1024 // 64), "1", "8", "1")
        if fn is grad:
            assert launches[names[1]] == ("4", "1", "8", "1")


LOW_RANK_PROJECTABLE = ("flurka-performer", "flurka-rnn", "flurka-eva")


def _norm(seed, d_model=128):
    norm = nnx.LayerNorm(d_model, rngs=nnx.Rngs(0))
    return randomize(norm, seed, scale=0.5)


@pytest.mark.parametrize("mechanism", LOW_RANK_PROJECTABLE)
def test_a_handed_over_layer_norm_runs_inside_the_kernels(mechanism):
    """layer(x, norm=LN) where the layer fuses the LayerNorm (the compression kernel and the
    projected query side normalise x as they load it) computes layer(LN(x)): every row (padded
    ones too) in float32, and in float32 the gradients of x, the LayerNorm's and the layer's
    parameters; in bf16 as close to the float32 layer as the XLA layer in bf16 is (the LayerNorm's
    scale folded into W_Q rounds differently; flurka-eva's bf16 error is 2.5 % either way)."""
    layer = _layer(mechanism, 7, fused=TILING, fused_projections=True)
    assert layer.fuses_norm
    norm = _norm(8)
    x, mask = _inputs(9)
    x = 3.0 + 2.0 * x                       # a mean and a spread the LayerNorm must remove
    got, want = layer(x, mask, norm=norm), layer(norm(x), mask)
    assert _rel(got, want) < 2e-6

    weights = jax.random.normal(jax.random.key(10), x.shape) * mask[..., None]

    def loss(x, layer, norm, fused):
        out = layer(x, mask, norm=norm) if fused else layer(norm(x), mask)
        return jnp.sum(out * weights)

    def grads(fused):
        gx, gl, gn = nnx.grad(loss, argnums=(0, 1, 2))(x, layer, norm, fused)
        return [gx, *jax.tree.leaves(gl), *jax.tree.leaves(gn)]

    for g_fused, g_xla in zip(grads(True), grads(False)):   # (EVA's μ_q gets none: both 0)
        g_fused, g_xla = np.asarray(g_fused, np.float64), np.asarray(g_xla, np.float64)
        assert np.linalg.norm(g_fused - g_xla) <= 2e-5 * np.linalg.norm(g_xla)
    real = np.asarray(mask)
    exact = np.asarray(layer(norm(x), mask))[real]
    bf16 = _layer(mechanism, 7, fused=TILING, fused_projections=True, dtype=jnp.bfloat16)
    xla = _layer(mechanism, 7, dtype=jnp.bfloat16)
    xb = x.astype(jnp.bfloat16)
    got, want = bf16(xb, mask, norm=norm), xla(norm(xb), mask)
    assert got.dtype == want.dtype == jnp.float32          # the LayerNorm's (float32 params)
    assert _rel(np.asarray(got)[real], exact) <= 1.5 * _rel(np.asarray(want)[real], exact)


def test_only_the_projected_low_rank_layers_with_one_e_fuse_the_norm():
    """Elsewhere the layer applies the handed-over LayerNorm itself (the same function)."""
    assert not _layer("flurka-rnn", fused=TILING).fuses_norm
    assert not _layer("rnn", fused=TILING, fused_projections=True).fuses_norm
    per_head = _layer("flurka-rnn", 2, fused=TILING, fused_projections=True, sharing="none")
    assert not per_head.fuses_norm
    x, mask = _inputs(3)
    norm = _norm(4)
    assert _rel(per_head(x, mask, norm=norm), per_head(norm(x), mask)) == 0.0


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)
