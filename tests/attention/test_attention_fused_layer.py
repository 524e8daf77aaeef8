"""W_Q, the fused query side and W_O as one kernel (``fused_projections``; Pallas's interpreter on
CPU) against the float64 formulas and the fused layer without it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import forward, randomize, reference, sin_loss_grads
from testsupport import cuda_compiler_script, triton_calls
from flax import nnx

from flurka.attention import PROJECTABLE, handover_class, make_attention
from flurka.mechanisms import COMPRESSED
from flurka.attention.fused import Tiling
from flurka.attention.fused_compress import PreNorm, row_statistics
from flurka.attention.fused_layer import fused_projected_query_side
from flurka.speed.configs import Point, points

TILING = Tiling(block_n=16, bwd_block_n=16, bwd_rows=32)   # the gradient's query-side kernels
N = 150                                 # three 64-row programs per sequence, the last ragged
# float32 gradients of the projected layer against the fused layer's, of the largest element
TOLERANCE = {"performer": 2e-5, "rnn": 2e-5, "flurka-rnn": 2e-5, "flurka-performer": 5e-5,
             "flurka-eva": 1e-4}


def _layer(mechanism, seed=0, *, d_model=128, heads=2, **options):
    # the paper's Gaussian E, as these tolerances were measured on (randomize makes any E dense;
    # with pooled E underneath, flurka-eva's fused and XLA gradients differ by 1.2e-4, not 2e-5)
    if mechanism in COMPRESSED:
        options.setdefault("e_init", "gaussian")
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
    got = np.asarray(forward(layer, x, mask))
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
    largest here (the proposal LayerNorms amplify float32 rounding); flurka-performer's to 5e-5:
    through FAVOR+'s exponentials the difference is 1.0e-5 to 3.0e-5 of the largest under XLA's
    equally exact CPU code generations (its default, level 0, the elemental emitter, one codegen
    split: measured), against 6e-6 for flurka-rnn."""
    x, mask = _inputs(rng_seed)
    real = np.asarray(mask)
    fused, projected = (_layer(mechanism, 3, fused=TILING, fused_projections=p,
                               dtype=jnp.bfloat16) for p in (False, True))
    a, b = (np.asarray(forward(m, x.astype(jnp.bfloat16), mask).astype(jnp.float32))
            for m in (fused, projected))
    assert np.linalg.norm(b[real] - a[real]) < 1e-2 * np.linalg.norm(a[real])

    fused, projected = (_layer(mechanism, 3, fused=TILING, fused_projections=p)
                        for p in (False, True))
    g_fused, g_projected = (jax.tree.leaves(sin_loss_grads(m, x, mask)) for m in (fused, projected))
    scale = max(float(jnp.max(jnp.abs(g))) for g in g_fused)
    for gf, gp in zip(g_fused, g_projected):
        np.testing.assert_allclose(gp, gf, rtol=0,
                                   atol=TOLERANCE[mechanism] * scale)


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


@nnx.jit(static_argnums=(4, 5))
def _normed(layer, norm, x, mask, handed_over=True, residual=False):
    """layer(x, norm=LN) (the LayerNorm handed over; ``residual``: x added in the kernel), else
    layer(LN(x)); one compiled program, as :func:`attention_reference.forward`."""
    if handed_over:
        return layer(x, mask, norm=norm, residual=residual)
    return layer(norm(x), mask)


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
    got, want = _normed(layer, norm, x, mask), _normed(layer, norm, x, mask, False)
    # Two float32 paths summing in different orders: 1–2e-6 apart, their gradients 1–2e-5, by
    # the host's vector unit (2.2e-6 and 2.2e-5 on an AMD EPYC without AVX-512); a wrong
    # kernel is off by O(1).
    assert _rel(got, want) < 1e-5

    weights = jax.random.normal(jax.random.key(10), x.shape) * mask[..., None]

    def loss(x, layer, norm, fused):
        out = layer(x, mask, norm=norm) if fused else layer(norm(x), mask)
        return jnp.sum(out * weights)

    def grads(fused):
        gx, gl, gn = nnx.jit(nnx.grad(loss, argnums=(0, 1, 2)), static_argnums=3)(
            x, layer, norm, fused)
        return [gx, *jax.tree.leaves(gl), *jax.tree.leaves(gn)]

    for g_fused, g_xla in zip(grads(True), grads(False)):   # (EVA's μ_q gets none: both 0)
        g_fused, g_xla = np.asarray(g_fused, np.float64), np.asarray(g_xla, np.float64)
        assert np.linalg.norm(g_fused - g_xla) <= 1e-4 * np.linalg.norm(g_xla)   # 2.2e-5 seen
    real = np.asarray(mask)
    exact = np.asarray(_normed(layer, norm, x, mask, False))[real]
    bf16 = _layer(mechanism, 7, fused=TILING, fused_projections=True, dtype=jnp.bfloat16)
    xla = _layer(mechanism, 7, dtype=jnp.bfloat16)
    xb = x.astype(jnp.bfloat16)
    got, want = _normed(bf16, norm, xb, mask), _normed(xla, norm, xb, mask, False)
    assert got.dtype == want.dtype == jnp.float32          # the LayerNorm's (float32 params)
    assert _rel(np.asarray(got)[real], exact) <= 1.5 * _rel(np.asarray(want)[real], exact)


@pytest.mark.parametrize("mechanism", ["flurka-rnn", "flurka-eva"])
def test_the_kernel_writes_the_residual_sum_where_asked(mechanism):
    """residual=True: x + layer(x, norm=LN) written by the kernel that writes the output —
    float32: exactly the sum (the same kernel output, the same float32 add); bf16: x + the
    output rounded to bf16, as the fused FFN block sums them; the gradient: the output's, plus
    the residual's identity (a stream in another dtype than the kernel's: XLA adds it). Asked
    of a layer that cannot add it in its kernel, or without the LayerNorm (x then is x̂, not
    the block's input): a ValueError before any compute."""
    layer = _layer(mechanism, 11, fused=TILING, fused_projections=True)
    norm = _norm(12)
    x, mask = _inputs(13)
    np.testing.assert_array_equal(_normed(layer, norm, x, mask, True, True),
                                  x + _normed(layer, norm, x, mask))
    bf16 = _layer(mechanism, 11, fused=TILING, fused_projections=True, dtype=jnp.bfloat16)
    xb = x.astype(jnp.bfloat16)
    got = _normed(bf16, norm, xb, mask, True, True)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got, xb + _normed(bf16, norm, xb, mask).astype(jnp.bfloat16))
    # a float32 stream into a bf16 kernel: the sum in XLA, in the stream's dtype
    np.testing.assert_array_equal(_normed(bf16, norm, x, mask, True, True),
                                  x + _normed(bf16, norm, x, mask))
    weights = jax.random.normal(jax.random.key(14), x.shape)

    def loss(x, residual):
        out = layer(x, mask, norm=norm, residual=residual)
        return jnp.sum((out if residual else x + out) * weights)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    assert _rel(grad(x, True), grad(x, False)) < 1e-6
    for other, kwargs in ((_layer("flurka-rnn", fused=TILING), dict(norm=norm)),
                          (layer, {})):
        with pytest.raises(ValueError, match="residual"):
            other(x, mask, residual=True, **kwargs)


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


def _softmax_layer_64(x, keep, ln_scale, ln_bias, wq, bq, wo, bo, k, v, *, heads):
    """flurka-eva's projected query side from the formulas, float64: x̂ = keep ⊙ LN(x),
    q = x̂·W_Q + b_Q, per head softmax(q·kᵀ/√d_h)·v over the shared keys, then W_O."""
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    x = ((x - mu) / jnp.sqrt(var + 1e-6) * ln_scale + ln_bias) * keep[..., None]
    b, n, d_model = x.shape
    q = (x @ wq + bq).reshape(b, n, heads, -1)
    logits = jnp.einsum("bnhd,bjhd->bhnj", q, k) * q.shape[-1] ** -0.5
    ctx = jnp.einsum("bhnj,bjhd->bnhd", jax.nn.softmax(logits, axis=-1), v)
    return ctx.reshape(b, n, d_model) @ wo + bo


def test_the_softmax_projected_gradient_matches_float64_autodiff():
    """flurka-eva's gradient kernels (q and ∂c recomputed per head and 64-row block, the
    context and lse by the online softmax, dq; then the key side's dK, dV) and the XLA GEMMs
    around them: every operand's gradient against float64 autodiff of the formulas — 150 rows
    (a ragged last block; the second sequence's last 40 rows padded out by the LayerNorm's
    keep), 70 keys (a ragged second key block), 2 heads of 64, the LayerNorm inside the kernels
    (without it, the layer's gradient equals the fused layer's:
    :func:`test_projected_layer_bf16_and_gradient_match_the_fused_layer`)."""
    rng = np.random.default_rng(21)
    b, d_model, heads, keys = 2, 128, 2, 70
    keep = (np.arange(N)[None, :] < np.array([[N], [110]])).astype(np.float64)
    values = [0.5 + 1.5 * rng.normal(size=(b, N, d_model)), keep,
              1 + 0.2 * rng.normal(size=d_model), 0.2 * rng.normal(size=d_model),
              rng.normal(size=(d_model, d_model)) / 11, 0.3 * rng.normal(size=d_model),
              rng.normal(size=(d_model, d_model)) / 11, 0.3 * rng.normal(size=d_model),
              rng.normal(size=(b, keys, heads, 64)), rng.normal(size=(b, keys, heads, 64))]
    weights = rng.normal(size=(b, N, d_model))
    x, keep32, ln_scale, ln_bias, wq, bq, wo, bo, k, v = (jnp.asarray(t, jnp.float32)
                                                         for t in values)

    def loss(x, ln_scale, ln_bias, wq, bq, wo, bo, k, v):
        mean, rstd = row_statistics(x, eps=1e-6)
        pre = PreNorm(ln_scale, ln_bias, 1e-6, mean, rstd, keep32)
        out = fused_projected_query_side(x, wq, bq, wo, bo, (k, v), feature="softmax",
                                         head_dim=64, scale=64 ** -0.5, norm=pre, tiling=TILING)
        return jnp.sum(out * weights)

    argnums = tuple(range(9))
    got = jax.grad(loss, argnums)(x, ln_scale, ln_bias, wq, bq, wo, bo, k, v)
    with jax.enable_x64():
        def loss_64(x, ln_scale, ln_bias, wq, bq, wo, bo, k, v):
            out = _softmax_layer_64(x, keep, ln_scale, ln_bias, wq, bq, wo, bo, k, v,
                                    heads=heads)
            return jnp.sum(out * weights)

        want = jax.grad(loss_64, argnums)(*(jnp.asarray(values[i], jnp.float64)
                                            for i in (0, 2, 3, 4, 5, 6, 7, 8, 9)))
    names = ("x", "ln_scale", "ln_bias", "wq", "bq", "wo", "bo", "k", "v")
    for name, g, w in zip(names, got, want):
        assert g.shape == w.shape, name
        assert _rel(g, w) < 5e-6, (name, _rel(g, w))


def test_the_softmax_projected_gradient_lowers_to_its_two_kernels_for_the_gpu():
    """At the flash comparison's layer (d_model 512, 4 heads of 128, 304 keys, bf16): the
    gradient is the forward kernel, one kernel per (head, 64-row block) for the query side,
    and the key side's kernel — not XLA's projections around the softmax's kernels."""
    x = jax.ShapeDtypeStruct((1, 1024, 512), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    bias = jax.ShapeDtypeStruct((512,), jnp.bfloat16)
    side = jax.ShapeDtypeStruct((1, 304, 4, 128), jnp.bfloat16)

    def loss(x, wq, bq, wo, bo, k, v):
        out = fused_projected_query_side(x, wq, bq, wo, bo, (k, v), feature="softmax",
                                         head_dim=128, scale=128 ** -0.5)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    calls = triton_calls(jax.grad(loss, argnums=tuple(range(7))), x, w, bias, w, bias, side,
                         side)
    launches = {c["name"]: (c["grid_x"], c["grid_y"], c["num_warps"]) for c in calls}
    assert sorted(launches) == ["flurka_softmax_projected_query_side",
                                "flurka_softmax_projected_query_side_bwd",
                                "flurka_softmax_query_side_dkv"], calls
    assert launches["flurka_softmax_projected_query_side_bwd"] == ("4", str(1024 // 64), "8")


def test_the_projected_gradient_kernels_are_spill_free_on_an_h100(tmp_path):
    """Compiled for the card at the flash comparison's layer (d_model 512, 4 heads of 128, bf16,
    the LayerNorm handed over with a keep; flurka-eva's 304 keys, elu's m = 128) over a length
    the blocks do not divide (N = 3000: elu's third 1024-row chunk ragged; at one chunk, N ≤ 1024,
    ptxas spills elu's 16-40 B): each query side's gradient kernel runs on Hopper's warpgroup MMA
    without spilling, and its traffic is exactly x, ∂out, the statistics, keep, β·W_Q, the
    weights and the key side in, and out ∂q, the context, the float32 shares of the biases'
    gradients and — the softmax's — q, ∂c, lse and δ for its key-side kernel (which does not
    spill either, and reads no context), or — elu's — the chunk's dKV, dΣφ(K) partials: q, ∂c and the context are
    recomputed from x and ∂out, not read back."""
    rows = cuda_compiler_script("""
        import json, sys, tempfile, jax, jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        from flurka.attention.fused_compress import PreNorm
        from flurka.attention.fused_layer import fused_projected_query_side
        from flurka.speed import aot, profile
        device = aot.target_device(aot.TARGETS["h100"])
        spec, bf, f32 = jax.ShapeDtypeStruct, jnp.bfloat16, jnp.float32
        n, d = 3000, 512
        args = [spec((1, n, d), bf), spec((d, d), bf), spec((d,), bf), spec((d, d), bf),
                spec((d,), bf), spec((d,), f32), spec((d,), f32), spec((1, n), f32),
                spec((1, n), f32), spec((1, n), f32), spec((1, n, d), bf)]
        sides = {"softmax": [spec((1, 304, 4, 128), bf)] * 2,
                 "elu": [spec((1, 4, 128, 128), bf), spec((1, 4, 128), bf)]}
        rows = {}
        for feature, side in sides.items():
            def gradient(x, wq, bq, wo, bo, scale, bias, mean, rstd, keep, g, *side,
                         feature=feature):
                def layer(x, wq, bq, wo, bo, scale, bias, *side):
                    return fused_projected_query_side(
                        x, wq, bq, wo, bo, (*side, None)[:2 if feature == "softmax" else 3],
                        feature=feature, head_dim=128, scale=128 ** -0.5,
                        norm=PreNorm(scale, bias, 1e-6, mean, rstd, keep))
                out, vjp = jax.vjp(layer, x, wq, bq, wo, bo, scale, bias, *side)
                return out, vjp(g)

            with tempfile.TemporaryDirectory() as dump:
                _, compiled = aot.compile_for(jax.jit(gradient), args + side, device, dump)
                rows[feature] = {"kernels": aot.kernel_report(dump),
                                 "traffic": profile.planned_traffic(compiled.as_text(), top=40)}
        json.dump(rows, open(sys.argv[1], "w"))
    """, tmp_path)
    n, d, heads = 3000, 512, 4
    x = n * d * 2                                                # bf16
    common_reads = (2 * x + 3 * n * 4 + d * 4                    # x, ∂out; mean, rstd, keep; β·W_Q
                    + 2 * (d * d * 2) + d * 2)                   # W_Q, W_O, b_Q
    blocks = {"softmax": -(-n // 64), "elu": -(-n // 1024)}      # 64-row blocks; 1024-row chunks
    reads = {"softmax": 2 * heads * 320 * 128 * 2,               # keys, values (padded to 320)
             "elu": heads * 128 * 128 * 2 + heads * 128 * 2}     # KV, Σφ(K)
    writes = {"softmax": 2 * x + 2 * heads * n * 4,              # q, ∂c; lse, δ
              "elu": 3 * heads * (128 * 128 + 128) * 4}          # the chunks' dKV, dΣφ(K)
    for feature, row in rows.items():
        kernels = {k["kernel"]: k for k in row["kernels"]}
        backward = kernels[f"flurka_{feature}_projected_query_side_bwd"]
        assert backward["grid"] == [heads, blocks[feature], 1], backward
        assert backward["mma"] == "wgmma", backward
        for kernel in [backward] + [k for k in row["kernels"] if k["kernel"].endswith("_dkv")]:
            assert kernel["spill_store_bytes"] == 0 and kernel["registers"] <= 255, kernel
        total = (common_reads + reads[feature] + 2 * x + writes[feature]
                 + 2 * blocks[feature] * d * 4)                  # ∂q, c; the biases' shares
        pallas = [k["bytes"] for k in row["traffic"]["largest"] if k["kind"] == "pallas"]
        assert total in pallas, (feature, total, pallas)
    # the softmax's key side: q, ∂c, the keys and values, lse and δ in (no context); its three
    # 1024-row chunks' float32 dK, dV partials out
    key_side = (2 * x + reads["softmax"] + 2 * heads * n * 4
                + 2 * heads * -(-n // 1024) * 320 * 128 * 4)
    assert key_side in [k["bytes"] for k in rows["softmax"]["traffic"]["largest"]
                        if "dkv" in (k["source"] or "")], rows["softmax"]["traffic"]["largest"]


@pytest.mark.parametrize("window_size", [None, 8])
@pytest.mark.parametrize("handed_over", [False, True])
def test_projected_flurka_eva_masks_rows_that_see_only_padding(window_size, handed_over):
    """Pooled E on a padded batch leaves compressed rows that weigh only padding: bias-only keys
    the XLA layer masks out of its key set, so the projected kernel must too (its logit bias),
    in the window (default window 2: rows 0, 1 of the second sequence) and in the chunks' summaries
    (row 7), forward and gradient, the LayerNorm handed over or not."""
    from flurka.attention.lowrank import pool_matrix

    def pooled(**options):
        layer = _layer("flurka-eva", 7, window_size=window_size, **options)
        for e in (layer.seq_proj.e1, layer.seq_proj.e2):
            e[...] = jnp.asarray(pool_matrix(8, N), jnp.float32)
        return layer

    projected, xla = pooled(fused=TILING, fused_projections=True), pooled()
    norm = _norm(8)
    x, _ = _inputs(21)
    x = 3.0 + 2.0 * x
    mask = np.ones((2, N), bool)
    mask[1, :40] = mask[1, 117:] = False              # positions 0-37 and 131-149: rows 0, 1, 7
    mask = jnp.asarray(mask)
    assert np.asarray(xla.real_rows(2, mask, N))[1].tolist() == [False] * 2 + [True] * 5 + [False]

    def run(layer, x, fused):
        if not handed_over:
            return layer(x, mask)
        return layer(x, mask, norm=norm) if fused else layer(norm(x), mask)

    real = np.asarray(mask)
    got = nnx.jit(run, static_argnums=2)(projected, x, True)
    want = nnx.jit(run, static_argnums=2)(xla, x, False)
    assert _rel(np.asarray(got)[real], np.asarray(want)[real]) < 2e-5   # 5e-2 with the rows kept

    weights = jax.random.normal(jax.random.key(22), x.shape) * mask[..., None]

    def grads(layer, fused):
        loss = lambda x, layer: jnp.sum(run(layer, x, fused) * weights)     # noqa: E731
        gx, gl = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(x, layer)
        return [gx, *jax.tree.leaves(gl)]

    # b_K's gradient is 0 in exact arithmetic (a shift of every logit), rounding in both: its
    # error is read against the largest gradient's norm
    pairs = [(np.asarray(a, np.float64), np.asarray(b, np.float64))
             for a, b in zip(grads(projected, True), grads(xla, False))]
    largest = max(np.linalg.norm(b) for _, b in pairs)
    for g_fused, g_xla in pairs:
        assert np.linalg.norm(g_fused - g_xla) <= 1e-4 * np.linalg.norm(g_xla) + 1e-7 * largest
