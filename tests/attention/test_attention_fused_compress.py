"""The pre-attention LayerNorm fused into the Linformer compression (row statistics and the
split-N compression as Pallas kernels; Pallas's interpreter on CPU) against float64 formulas
written here and against the XLA path, and compiled for an H100 that is not here."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from testsupport import cuda_compiler_script, triton_calls

from flurka.kernels.compress import (
    backward_fits, normalised_compression, normalised_input_gradient,
    reference_normalised_compression, row_statistics, split_rows)

EPS = 1e-6


def _moments_64(x):
    """Each row's mean and 1/σ (population variance), float64."""
    return x.mean(-1), 1 / np.sqrt(x.var(-1) + EPS)


def _compression_64(x, keep, scale, bias, e1, e2, xp=np):
    """(E1·x̂, E2·x̂), x̂ = keep ⊙ LayerNorm(x), over the first n columns of E; float64.
    ``xp``: numpy, or jax.numpy to differentiate it."""
    mean, var = x.mean(-1), x.var(-1)
    rstd = 1 / xp.sqrt(var + EPS)
    normed = ((x - mean[..., None]) * rstd[..., None] * scale + bias) * keep[..., None]
    n = x.shape[1]
    return tuple(xp.einsum("kn,bnd->bkd", e[:, :n], normed) for e in (e1, e2))


def _operands(seed, batch=2, n=150, d=256, d_k=80, max_len=200, real=(150, 110)):
    """x [batch, n, d] (off-centre rows), keep (the second sequence padded), LayerNorm
    scale/bias [d], E1, E2 [d_k, max_len] (max_len > n: columns the kernel must not read) —
    float64. With the kernel's 64 × 32 tiles: a last row block of d_k and a last step of n that
    are partial."""
    rng = np.random.default_rng(seed)
    keep = (np.arange(n)[None, :] < np.array(real[:batch])[:, None]).astype(np.float64)
    return [0.5 + 1.5 * rng.normal(size=(batch, n, d)), keep,
            1 + 0.2 * rng.normal(size=d), 0.2 * rng.normal(size=d),
            *(rng.normal(size=(d_k, max_len)) / math.sqrt(n) for _ in range(2))]


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _f32(values):
    return [jnp.asarray(v, jnp.float32) for v in values]


def test_row_statistics_and_the_compression_match_the_float64_formulas():
    """float32: the statistics, and both compressions over three forced splits (the last with
    22 real rows), padded rows zeroed, E's columns past n unread — and the XLA path too."""
    ops = _operands(1)
    x, keep, scale, bias, e1, e2 = _f32(ops)
    mean, rstd = row_statistics(x, eps=EPS)
    assert mean.shape == rstd.shape == (2, 150) and mean.dtype == rstd.dtype == jnp.float32
    want_mean, want_rstd = _moments_64(ops[0])
    assert _rel(mean, want_mean) < 2e-6 and _rel(rstd, want_rstd) < 2e-6
    assert split_rows(150, 256, 80, 2, 3) == (64, 3)
    want = _compression_64(*ops)
    for stats in (None, (mean, rstd)):
        got = normalised_compression(x, keep > 0, scale, bias, e1, e2, eps=EPS, stats=stats,
                                     splits=3)
        for g, w in zip(got, want):
            assert g.shape == (2, 80, 256) and g.dtype == jnp.float32
            assert _rel(g, w) < 2e-6
    for g, w in zip(reference_normalised_compression(x, keep, scale, bias, e1, e2, eps=EPS), want):
        assert _rel(g, w) < 2e-6


def test_a_shared_e_is_returned_twice_and_no_keep_means_every_row():
    """sharing "kv" (e2 None): one matrix, returned as both; keep None: no row zeroed (default
    splits: one split of five steps here)."""
    x, _, scale, bias, e1, _ = ops = _operands(2, n=150)
    ones = np.ones(x.shape[:2])
    x1, x2 = normalised_compression(*_f32([x]), None, *_f32([scale, bias, e1]), eps=EPS)
    assert x1 is x2
    assert _rel(x1, _compression_64(x, ones, scale, bias, e1, ops[5])[0]) < 2e-6


def test_the_compression_in_bf16_is_as_close_as_the_xla_path():
    """bf16 x and E (float32 LayerNorm parameters): within 1 % of the XLA path and at least as
    close to the float64 formula (same roundings: x̂ rounded to bf16, float32 accumulation)."""
    ops = _operands(3)
    x, e1, e2 = (jnp.asarray(ops[i], jnp.bfloat16) for i in (0, 4, 5))
    keep, scale, bias = _f32(ops[1:4])
    exact = _compression_64(np.asarray(x, np.float64), *ops[1:4], np.asarray(e1, np.float64),
                            np.asarray(e2, np.float64))
    fused = normalised_compression(x, keep, scale, bias, e1, e2, eps=EPS, splits=2)
    xla = reference_normalised_compression(x, keep, scale, bias, e1, e2, eps=EPS)
    for f, r, w in zip(fused, xla, exact):
        assert f.dtype == jnp.bfloat16
        assert _rel(f, r) < 1e-2
        assert _rel(f, w) <= 1.5 * _rel(r, w)


@pytest.mark.parametrize("size, shared", [
    (dict(n=40, d=128, d_k=24, max_len=50, real=(40, 31)), False),
    (dict(n=150, d=256, d_k=140, max_len=200, real=(150, 110)), False),
    (dict(n=150, d=256, d_k=140, max_len=200, real=(150, 110)), True)],
    ids=["one-program", "several-programs", "shared-e"])
def test_the_gradient_matches_float64_finite_differences(size, shared):
    """x, scale, bias, E1 and E2's gradients (the gradient kernels) of a random linear
    functional of (x1, x2), along random directions, against central differences of the float64
    formula: one program of each kernel, then several with partial last blocks (150 rows in
    64-row programs; d_k 140 in 128-row blocks and 64-row steps; E's 200 columns in blocks of 64,
    those past n getting none), and one E for both (sharing "kv")."""
    ops = _operands(4, **size)
    if shared:
        ops[5] = ops[4]
    rng = np.random.default_rng(5)
    weights = [rng.normal(size=(2, size["d_k"], size["d"])) for _ in range(2)]
    differentiable = (0, 2, 3, 4) if shared else (0, 2, 3, 4, 5)

    def loss(x, scale, bias, e1, e2=None):
        out = normalised_compression(x, keep, scale, bias, e1, e2, eps=EPS, splits=2)
        return sum(jnp.sum(o * w) for o, w in zip(out, weights))

    keep = jnp.asarray(ops[1] > 0)
    grads = jax.grad(loss, argnums=tuple(range(len(differentiable))))(
        *_f32(ops[i] for i in differentiable))
    for i, grad in zip(differentiable, grads):
        assert grad.shape == ops[i].shape
        direction = rng.normal(size=ops[i].shape)
        step = 1e-5
        plus, minus = list(ops), list(ops)
        plus[i], minus[i] = ops[i] + step * direction, ops[i] - step * direction
        if shared:
            plus[5], minus[5] = plus[4], minus[4]
        want = sum(np.sum((p - m) * w) for p, m, w in
                   zip(_compression_64(*plus), _compression_64(*minus), weights)) / (2 * step)
        got = float(np.sum(np.asarray(grad, np.float64) * direction))
        assert abs(got - want) <= 1e-4 * abs(want) + 1e-4, (i, got, want)


def test_the_gradient_in_bf16_is_as_close_as_the_xla_paths():
    """bf16 x and E: every gradient from the kernels lands as close to the float64 formula's
    (float64 autodiff of the formula on the same bf16 values) as the XLA path's does, and
    within 2 % of it."""
    ops = _operands(8)
    x, e1, e2 = (jnp.asarray(ops[i], jnp.bfloat16) for i in (0, 4, 5))
    keep, scale, bias = _f32(ops[1:4])
    rng = np.random.default_rng(9)
    weights = [jnp.asarray(rng.normal(size=(2, 80, 256)), jnp.float32) for _ in range(2)]

    def grads(compression, operands):
        def loss(x, scale, bias, e1, e2):
            out = compression(x, operands[1], scale, bias, e1, e2)
            return sum(jnp.sum(o.astype(w.dtype) * w) for o, w in zip(out, weights))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(operands[0], *operands[2:])

    fused = grads(lambda *a: normalised_compression(*a, eps=EPS), (x, keep, scale, bias, e1, e2))
    xla = grads(lambda *a: reference_normalised_compression(*a, eps=EPS),
                (x, keep, scale, bias, e1, e2))
    with jax.enable_x64():
        weights = [w.astype(jnp.float64) for w in weights]
        exact = grads(lambda *a: _compression_64(*a, xp=jnp), [
            jnp.asarray(np.asarray(jnp.asarray(v, jnp.float32)), jnp.float64)
            for v in (x, keep, scale, bias, e1, e2)])
    for i, (got, ref, want) in enumerate(zip(fused, xla, exact)):
        assert got.dtype == ref.dtype
        assert _rel(got, ref) < 2e-2, i
        assert _rel(got, want) <= 1.5 * _rel(ref, want) + 1e-3, (i, _rel(got, want),
                                                                  _rel(ref, want))


def test_the_input_gradient_through_the_layer_norm_matches_float64_autodiff():
    """normalised_input_gradient — the projected side's ∂x through x̂ = keep ⊙ LN(x) of a
    downstream y = x̂·W, from ∂y and the forward's statistics (150 rows in 64-row programs, the
    second sequence padded) — against float64 autodiff of the formula: ∂x, ∂γ, ∂β; and the x̂
    it writes for W's gradient against the float64 formula (padded rows zero)."""
    x, keep, scale, bias = _operands(11)[:4]
    rng = np.random.default_rng(12)
    w, dy = rng.normal(size=(256, 384)) / 16, rng.normal(size=(2, 150, 384))
    xf, kf, sf, bf = _f32([x, keep, scale, bias])
    mean, rstd = row_statistics(xf, eps=EPS)
    *got, normed = normalised_input_gradient(xf, kf, sf, bf, mean, rstd, *_f32([dy, w]))
    mu, sigma = _moments_64(x)
    want_normed = ((x - mu[..., None]) * sigma[..., None] * scale + bias) * keep[..., None]
    assert normed.dtype == jnp.float32 and _rel(normed, want_normed) < 2e-6
    with jax.enable_x64():
        def downstream(x, scale, bias):
            mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
            normed = ((x - mu) / jnp.sqrt(var + EPS) * scale + bias) * keep[..., None]
            return jnp.sum((normed @ w) * dy)
        want = jax.grad(downstream, argnums=(0, 1, 2))(
            *(jnp.asarray(v, jnp.float64) for v in (x, scale, bias)))
    for g, w_ in zip(got, want):
        assert g.shape == w_.shape
        assert _rel(g, w_) < 2e-5


def test_statistics_and_compression_lower_to_two_triton_kernels_for_the_gpu():
    """Pallas's Triton lowering runs here without a GPU: at d = 512, d_k = 1024, N = 1000 (bf16)
    the statistics (⌈1000 / 64⌉ row blocks, 4 warps) and the compression (4 column × 16 row
    blocks collapsed into grid x, 4 splits, 8 warps, 4 stages) — two calls, whether the caller
    passes the statistics or not."""
    spec = jax.ShapeDtypeStruct
    bf, f32 = jnp.bfloat16, jnp.float32
    specs = (spec((1, 1000, 512), bf), spec((1, 1000), jnp.bool_), spec((512,), f32),
             spec((512,), f32), spec((1024, 1024), bf), spec((1024, 1024), bf))

    def given(x, keep, scale, bias, e1, e2):
        stats = row_statistics(x, eps=EPS)
        return normalised_compression(x, keep, scale, bias, e1, e2, eps=EPS, stats=stats)

    def default(x, keep, scale, bias, e1, e2):
        return normalised_compression(x, keep, scale, bias, e1, e2, eps=EPS)

    for fn in (given, default):
        calls = triton_calls(fn, *specs)
        assert [(c["name"], c["grid_x"], c["grid_y"], c["grid_z"], c["num_warps"],
                 c["num_stages"]) for c in calls] == [
            ("flurka_row_statistics", "16", "1", "1", "4", "2"),
            ("flurka_normalised_compression", "64", "4", "1", "8", "4")], calls


def test_the_gradient_kernels_take_d_model_up_to_512_and_leave_wider_to_xla():
    """The ∂x kernel's [64, d] float32 accumulator fits its registers up to d = 512: there the
    gradient lowers to its two kernels (⌈1000 / 64⌉ row programs; d_k's 128-row blocks × E's
    64-column blocks) beside the statistics, past it to none (the XLA path's gradient, its own
    statistics; the loss is linear, so no forward either)."""
    assert [backward_fits(d) for d in (128, 512, 640)] == [True, True, False]
    spec = jax.ShapeDtypeStruct

    def calls(d):
        specs = (spec((1, 1000, d), jnp.bfloat16), spec((d,), jnp.float32),
                 spec((d,), jnp.float32), spec((256, 1000), jnp.bfloat16))

        def loss(x, scale, bias, e1):
            out = normalised_compression(x, None, scale, bias, e1, eps=EPS)[0]
            return jnp.sum(out.astype(jnp.float32))
        return [(c["name"], c["grid_x"], c["grid_y"])
                for c in triton_calls(jax.grad(loss, argnums=(0, 3)), *specs)]

    assert calls(512) == [("flurka_row_statistics", "16", "1"),
                          ("flurka_compression_e_bwd", "2", "16"),
                          ("flurka_compression_x_bwd", "16", "1")], calls(512)
    assert calls(640) == [], calls(640)


def test_the_compression_reads_x_and_e_once_on_an_h100(tmp_path):
    """At the flash comparison's size (N = 52 608, d = 512, d_k = 1024, bf16, batch 1, keep
    given) compiled for the card: the statistics kernel (no MMA) and the compression (on
    Hopper's warpgroup MMA), spill-free in the card's shared memory; the compression's traffic
    is exactly x, E1, E2, the statistics, keep, the LayerNorm parameters and its four splits'
    float32 partials — x̂ never reaches memory — and the step plans less than the XLA path. With
    the gradient (bf16 cotangents): its two kernels spill-free on the warpgroup MMA, ∂x's
    reading x, E1, E2, the statistics and the cotangents and writing ∂x and the programs' ∂γ,
    ∂β shares, ∂E's reading x, the statistics and the cotangents and writing ∂E1, ∂E2 — each
    once — and forward plus gradient plan under 70 % of the XLA path's. The projected side's
    input gradient (∂q·W_Qᵀ through the LayerNorm) spill-free on the warpgroup MMA too."""
    fused, xla, fused_grad, xla_grad, input_grad = cuda_compiler_script("""
        import functools, json, sys, tempfile, jax, jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        from flurka.kernels import compress as fc
        from flurka.speed import aot, profile
        device = aot.target_device(aot.TARGETS["h100"])
        spec, bf, f32 = jax.ShapeDtypeStruct, jnp.bfloat16, jnp.float32
        args = (spec((1, 52_608, 512), bf), spec((1, 52_608), jnp.bool_), spec((512,), f32),
                spec((512,), f32), spec((1024, 52_608), bf), spec((1024, 52_608), bf))
        cotangents = (spec((1, 1024, 512), bf), spec((1, 1024, 512), bf))
        rows = []

        def with_gradient(fn):
            def step(x, keep, scale, bias, e1, e2, g1, g2):
                out, vjp = jax.vjp(lambda x, *p: fn(x, keep, *p), x, scale, bias, e1, e2)
                return out, vjp((g1, g2))
            return step

        for grad in (False, True):
            for fn in (fc.normalised_compression, fc.reference_normalised_compression):
                fn = functools.partial(fn, eps=1e-6)
                step = jax.jit(with_gradient(fn) if grad else fn)
                with tempfile.TemporaryDirectory() as dump:
                    _, compiled = aot.compile_for(step, args + cotangents * grad, device, dump)
                    rows.append({"kernels": aot.kernel_report(dump),
                                 "traffic": profile.planned_traffic(compiled.as_text())})
        with tempfile.TemporaryDirectory() as dump:           # the projected side's ∂x
            aot.compile_for(jax.jit(fc.normalised_input_gradient),
                            (spec((1, 52_608, 512), bf), spec((1, 52_608), jnp.bool_),
                             spec((512,), f32), spec((512,), f32), spec((1, 52_608), f32),
                             spec((1, 52_608), f32), spec((1, 52_608, 512), bf),
                             spec((512, 512), bf)), device, dump)
            rows.append({"kernels": aot.kernel_report(dump)})
        json.dump(rows, open(sys.argv[1], "w"))
    """, tmp_path)
    n, d, d_k = 52_608, 512, 1024
    stats_kernel, compression = fused["kernels"]
    assert (stats_kernel["kernel"], stats_kernel["grid"]) == ("flurka_row_statistics",
                                                              [-(-n // 64), 1, 1])
    assert stats_kernel["mma"] is None
    assert (compression["kernel"], compression["grid"]) == ("flurka_normalised_compression",
                                                            [4 * 16, 4, 1])
    assert compression["mma"] == "wgmma" and compression["threads"] == 8 * 32
    for kernel in fused["kernels"]:
        assert kernel["spill_store_bytes"] == 0 and kernel["registers"] <= 255, kernel
        assert 0 < kernel["shared_memory_bytes"] <= 232_448, kernel
    x, e, row = n * d * 2, d_k * n * 2, n * 4                      # bf16 x and E, float32 rows
    statistics = x + 2 * row                                       # x → mean, rstd
    partials = 2 * 4 * d_k * d * 4                                # 2 E's × 4 splits, float32
    compressing = x + 2 * e + 2 * row + row + 2 * d * 4 + partials  # stats, keep, scale, bias
    pallas = sorted(k["bytes"] for k in fused["traffic"]["largest"] if k["kind"] == "pallas")
    assert pallas == sorted([statistics, compressing])
    assert fused["traffic"]["by_kind"]["pallas"] == statistics + compressing
    assert "pallas" not in xla["traffic"]["by_kind"]
    assert fused["traffic"]["bytes"] < 0.75 * xla["traffic"]["bytes"]

    kernels = {k["kernel"]: k for k in fused_grad["kernels"]}
    assert sorted(kernels) == ["flurka_compression_e_bwd", "flurka_compression_x_bwd",
                               "flurka_normalised_compression", "flurka_row_statistics"]
    assert kernels["flurka_compression_x_bwd"]["grid"] == [-(-n // 64), 1, 1]
    assert kernels["flurka_compression_e_bwd"]["grid"] == [d_k // 128, -(-n // 64), 1]
    for kernel in kernels.values():
        assert kernel["spill_store_bytes"] == 0 and kernel["registers"] <= 255, kernel
        assert 0 < kernel["shared_memory_bytes"] <= 232_448, kernel
        assert kernel["mma"] == (None if kernel["kernel"] == "flurka_row_statistics"
                                 else "wgmma"), kernel
    g = 2 * d_k * d * 2                                            # bf16 cotangents
    shares = 2 * -(-n // 64) * d * 4                               # ∂γ, ∂β, float32
    x_gradient = x + 2 * e + 3 * row + d * 4 + g + x + shares      # reads; ∂x; shares
    e_gradient = x + 3 * row + 2 * d * 4 + g + 2 * e               # reads; ∂E1, ∂E2
    pallas = sorted(k["bytes"] for k in fused_grad["traffic"]["largest"]
                    if k["kind"] == "pallas")
    assert pallas == sorted([statistics, compressing, x_gradient, e_gradient])
    assert fused_grad["traffic"]["bytes"] < 0.7 * xla_grad["traffic"]["bytes"], (
        fused_grad["traffic"]["bytes"], xla_grad["traffic"]["bytes"])
    (kernel,) = input_grad["kernels"]
    assert (kernel["kernel"], kernel["grid"], kernel["mma"]) == (
        "flurka_normalised_input_bwd", [-(-n // 64), 1, 1], "wgmma")
    assert kernel["spill_store_bytes"] == 0 and 0 < kernel["shared_memory_bytes"] <= 232_448


def test_a_tuned_launch_reaches_layers_built_under_it_and_bad_launches_are_refused():
    """``use_compress_tiling`` (a GPU session's tuned choice) is what low-rank layers keep at
    construction; the launch's fields are checked before any compute."""
    from flax import nnx

    from flurka.attention import make_attention
    from flurka.kernels.compress import CompressTiling, use_compress_tiling

    def build():
        return make_attention("flurka-rnn", d_model=128, num_heads=2, max_len=32, d_k=8,
                              fused=True, fused_projections=True, rngs=nnx.Rngs(0))

    tuned = CompressTiling(rows_k=128, step=64, num_warps=8, num_stages=2)
    with use_compress_tiling(tuned):
        layer = build()
    assert layer.compress_tiling == tuned and build().compress_tiling == CompressTiling()
    for bad, message in (({"rows_k": 48}, "rows_k must be a power of two"),
                         ({"step": 8}, "step must be a power of two"),
                         ({"num_warps": 3}, "num_warps must be"),
                         ({"num_stages": 0}, "num_stages must be")):
        with pytest.raises(ValueError, match=message):
            CompressTiling(**bad)
