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
from flurka.catalogue.mechanisms import COMPRESSED
from flurka.kernels.query_side import Tiling
from flurka.kernels.projected_layer import fused_projected_query_side
from flurka.speed.configs import Point, points

TILING = Tiling(block_n=16, bwd_block_n=16, bwd_rows=32)   # the gradient's query-side kernels
N = 150                                 # three 64-row programs per sequence, the last ragged
# float32 gradients of the projected layer against the fused layer's, of the largest element
TOLERANCE = {"performer": 2e-5, "rnn": 2e-5, "flurka-rnn": 2e-5, "flurka-performer": 5e-5}


def _layer(mechanism, seed=0, *, d_model=128, heads=2, **options):
    # the paper's Gaussian E, as these tolerances were measured on (randomize makes any E dense)
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


def test_projectable_mechanisms_are_the_kernel_layers():
    """flurka-eva is not: each query has its own window of compressed rows, and the kernel takes
    one key side for every query of a sequence."""
    assert set(PROJECTABLE) == {"performer", "rnn", "flurka-performer", "flurka-rnn"}


@pytest.mark.parametrize("mechanism", PROJECTABLE)
def test_projected_layer_matches_float64_reference(mechanism, rng_seed):
    layer = _layer(mechanism, 5, fused=TILING, fused_projections=True)
    assert layer.fused_projections
    x, mask = _inputs(rng_seed)
    got = np.asarray(forward(layer, x, mask))
    want = reference(_layer(mechanism, 5), x, mask)     # same parameters, unfused
    real = np.asarray(mask)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("mechanism", PROJECTABLE)
def test_projected_layer_bf16_and_gradient_match_the_fused_layer(mechanism, rng_seed):
    """bf16 within 1 % of the fused layer without projections in the kernel; in float32 every
    parameter's gradient (the fused layer's, recomputed: XLA's projections around the query-side
    kernels) equals that layer's — flurka-performer's to 5e-5:
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
    x, w = jnp.zeros((1, 64, 128)), jnp.zeros((128, 128))
    with pytest.raises(ValueError, match="feature must be one of favor, elu, got 'softmax'"):
        fused_projected_query_side(x, w, w[0], w, w[0], (w, w, None), feature="softmax",
                                   head_dim=64)
    # flurka-eva: one clear error, whatever else is asked, and no point that takes it
    for options in ({"fused": True}, {"fused": TILING}, {}):
        with pytest.raises(ValueError, match="flurka-eva: fused_projections is not available"):
            _layer("flurka-eva", fused_projections=True, **options)
    with pytest.raises(ValueError, match="fused_projections needs fused=True and one of "
                                         "performer, rnn, flurka-performer, flurka-rnn; got "
                                         "flurka-eva"):
        Point("flurka-eva", "forward", "layer", 1024, 512, 4, d_k=128, fused=True,
              fused_projections=True)


def test_points_take_projections_where_the_layer_fits():
    flash = [p for p in points("flash-compare", fused=True, fused_projections=True)]
    assert {p.mechanism for p in flash if p.fused_projections} == {
        "flurka-performer", "flurka-rnn"}
    assert {p.mechanism for p in flash if p.fused and not p.fused_projections} == {"flurka-eva"}
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


LOW_RANK_PROJECTABLE = ("flurka-performer", "flurka-rnn")


def _norm(seed, d_model=128):
    norm = nnx.LayerNorm(d_model, rngs=nnx.Rngs(0))
    return randomize(norm, seed, scale=0.5)


@nnx.jit(static_argnums=(4, 5))
def _normed(layer, norm, x, mask, handed_over=True, residual=False):
    """layer.fused_block(x, norm=LN) (the LayerNorm handed over; ``residual``: x added in the
    kernel), else layer(LN(x)); one compiled program, as :func:`attention_reference.forward`."""
    if handed_over:
        return layer.fused_block(x, mask, norm=norm, residual=residual)
    return layer(norm(x), mask)


@pytest.mark.parametrize("mechanism", LOW_RANK_PROJECTABLE)
def test_a_handed_over_layer_norm_runs_inside_the_kernels(mechanism):
    """layer.fused_block(x, norm=LN) where the layer fuses the LayerNorm (the compression kernel
    and the projected query side normalise x as they load it) computes layer(LN(x)): every row (padded
    ones too) in float32, and in float32 the gradients of x, the LayerNorm's and the layer's
    parameters; in bf16 as close to the float32 layer as the XLA layer in bf16 is (the LayerNorm's
    scale folded into W_Q rounds differently)."""
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
        out = layer.fused_block(x, mask, norm=norm) if fused else layer(norm(x), mask)
        return jnp.sum(out * weights)

    def grads(fused):
        gx, gl, gn = nnx.jit(nnx.grad(loss, argnums=(0, 1, 2)), static_argnums=3)(
            x, layer, norm, fused)
        return [gx, *jax.tree.leaves(gl), *jax.tree.leaves(gn)]

    for g_fused, g_xla in zip(grads(True), grads(False)):
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


@pytest.mark.parametrize("mechanism", ["flurka-rnn"])
def test_the_kernel_writes_the_residual_sum_where_asked(mechanism):
    """residual=True: x + layer.fused_block(x, norm=LN) written by the kernel that writes the
    output — float32: exactly the sum (the same kernel output, the same float32 add); bf16: x + the
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
        out = layer.fused_block(x, mask, norm=norm, residual=residual)
        return jnp.sum((out if residual else x + out) * weights)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    assert _rel(grad(x, True), grad(x, False)) < 1e-6
    for other, kwargs in ((_layer("flurka-rnn", fused=TILING), dict(norm=norm)),
                          (layer, {})):
        with pytest.raises(ValueError, match="residual"):
            other.fused_block(x, mask, residual=True, **kwargs)


def test_only_the_projected_low_rank_layers_with_one_e_fuse_the_norm():
    """Elsewhere the layer applies the handed-over LayerNorm itself (the same function)."""
    assert not _layer("flurka-rnn", fused=TILING).fuses_norm
    assert not _layer("rnn", fused=TILING, fused_projections=True).fuses_norm
    per_head = _layer("flurka-rnn", 2, fused=TILING, fused_projections=True, sharing="none")
    assert not per_head.fuses_norm
    x, mask = _inputs(3)
    norm = _norm(4)
    assert _rel(per_head.fused_block(x, mask, norm=norm), per_head(norm(x), mask)) == 0.0


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_the_projected_gradient_kernel_is_spill_free_on_an_h100(tmp_path):
    """Compiled for the card at the flash comparison's layer (d_model 512, 4 heads of 128, bf16,
    the LayerNorm handed over with a keep; elu's m = 128) over a length the blocks do not divide
    (N = 3000: the third 1024-row chunk ragged; at one chunk, N ≤ 1024, ptxas spills 16-40 B):
    the query side's gradient kernel runs on Hopper's warpgroup MMA without spilling, and its
    traffic is exactly x, ∂out, the statistics, keep, β·W_Q, the weights and the key side in,
    and out ∂q, the context, the float32 shares of the biases' gradients and the chunks' dKV,
    dΣφ(K) partials: q, ∂c and the context are recomputed from x and ∂out, not read back."""
    row = cuda_compiler_script("""
        import json, sys, tempfile, jax, jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        from flurka.kernels.compress import PreNorm
        from flurka.kernels.projected_layer import fused_projected_query_side
        from flurka.speed import aot, profile
        device = aot.target_device(aot.TARGETS["h100"])
        spec, bf, f32 = jax.ShapeDtypeStruct, jnp.bfloat16, jnp.float32
        n, d = 3000, 512
        args = [spec((1, n, d), bf), spec((d, d), bf), spec((d,), bf), spec((d, d), bf),
                spec((d,), bf), spec((d,), f32), spec((d,), f32), spec((1, n), f32),
                spec((1, n), f32), spec((1, n), f32), spec((1, n, d), bf),
                spec((1, 4, 128, 128), bf), spec((1, 4, 128), bf)]

        def gradient(x, wq, bq, wo, bo, scale, bias, mean, rstd, keep, g, kv, k_sum):
            def layer(x, wq, bq, wo, bo, scale, bias, kv, k_sum):
                return fused_projected_query_side(
                    x, wq, bq, wo, bo, (kv, k_sum, None), feature="elu", head_dim=128,
                    norm=PreNorm(scale, bias, 1e-6, mean, rstd, keep))
            out, vjp = jax.vjp(layer, x, wq, bq, wo, bo, scale, bias, kv, k_sum)
            return out, vjp(g)

        with tempfile.TemporaryDirectory() as dump:
            _, compiled = aot.compile_for(jax.jit(gradient), args, device, dump)
            row = {"kernels": aot.kernel_report(dump),
                   "traffic": profile.planned_traffic(compiled.as_text(), top=40)}
        json.dump(row, open(sys.argv[1], "w"))
    """, tmp_path)
    n, d, heads = 3000, 512, 4
    x = n * d * 2                                                # bf16
    common_reads = (2 * x + 3 * n * 4 + d * 4                    # x, ∂out; mean, rstd, keep; β·W_Q
                    + 2 * (d * d * 2) + d * 2)                   # W_Q, W_O, b_Q
    chunks = -(-n // 1024)                                       # 1024-row chunks
    reads = heads * 128 * 128 * 2 + heads * 128 * 2              # KV, Σφ(K)
    writes = 3 * heads * (128 * 128 + 128) * 4                   # the chunks' dKV, dΣφ(K)
    kernels = {k["kernel"]: k for k in row["kernels"]}
    backward = kernels["flurka_elu_projected_query_side_bwd"]
    assert backward["grid"] == [heads, chunks, 1], backward
    assert backward["mma"] == "wgmma", backward
    assert backward["spill_store_bytes"] == 0 and backward["registers"] <= 255, backward
    total = (common_reads + reads + 2 * x + writes
             + 2 * chunks * d * 4)                               # ∂q, c; the biases' shares
    pallas = [k["bytes"] for k in row["traffic"]["largest"] if k["kind"] == "pallas"]
    assert total in pallas, (total, pallas)
