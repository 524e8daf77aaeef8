"""The fused FFN block (residual + LayerNorm + FFN + residual as two Pallas kernels; Pallas's
interpreter on CPU) against float64 formulas written here and against the encoder's XLA path."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from attention_reference import forward, sin_loss_grads
from testsupport import cuda_compiler_script, triton_calls

from flurka.configs.model import ModelConfig
from flurka.models.encoder import Encoder
from flurka.kernels.ffn import (
    ONE_KERNEL, FfnTiling, backward_rows, fused_ffn_block, reference_ffn_block, use_ffn_tiling)
from flurka.speed.configs import Point, points

EPS = 1e-6


def _ffn_block_64(x, a, scale, bias, w1, b1, w2, b2, xp=np):
    """z = y + W2·GELU(W1·LN(y) + b1) + b2, y = x + a, in float64 (GELU: tanh form, flax's);
    ``xp``: numpy, or jax.numpy to differentiate it."""
    y = x + a
    normed = (y - y.mean(-1, keepdims=True)) / xp.sqrt(y.var(-1, keepdims=True) + EPS) * scale + bias
    h = normed @ w1 + b1
    gelu = 0.5 * h * (1 + xp.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    return y + gelu @ w2 + b2


def _operands(seed, batch=2, n=75, d=256, f=384):
    """x, a [batch, n, d] (150 rows: a last row block of 22 with the tiling's 64), LayerNorm
    scale/bias, W1 [d, f], b1, W2 [f, d], b2 — float64; d and f several 128-wide blocks."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(batch, n, d)), 2.0 + rng.normal(size=(batch, n, d)),
            1 + 0.2 * rng.normal(size=d), 0.2 * rng.normal(size=d),
            rng.normal(size=(d, f)) / math.sqrt(d), 0.2 * rng.normal(size=f),
            rng.normal(size=(f, d)) / math.sqrt(f), 0.2 * rng.normal(size=d)]


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


TILING = FfnTiling(block_n=64, num_warps=4, num_stages=2)
FORMS = [TILING, ONE_KERNEL]     # two kernels (h through memory) and one


@pytest.mark.parametrize("tiling", FORMS, ids=["two-kernels", "one-kernel"])
def test_fused_ffn_block_matches_the_float64_formula(tiling):
    ops = _operands(1)
    got = fused_ffn_block(*(jnp.asarray(v, jnp.float32) for v in ops), eps=EPS, tiling=tiling)
    assert got.shape == (2, 75, 256) and got.dtype == jnp.float32
    assert _rel(got, _ffn_block_64(*ops)) < 2e-6


@pytest.mark.parametrize("tiling", FORMS, ids=["two-kernels", "one-kernel"])
def test_the_block_takes_the_residual_sum_whole(tiling):
    """a None: x is y = x + a already (the attention's kernel wrote it) — against the float64
    formula, and the same z and gradient as from x and a summed in the kernels."""
    ops = _operands(7)
    x, a, *params = (jnp.asarray(v, jnp.float32) for v in ops)
    y = x + a
    got = fused_ffn_block(y, None, *params, eps=EPS, tiling=tiling)
    assert _rel(got, _ffn_block_64(*ops)) < 2e-6
    np.testing.assert_array_equal(got, fused_ffn_block(x, a, *params, eps=EPS, tiling=tiling))

    def loss(y, a=None):
        return jnp.sum(jnp.sin(fused_ffn_block(y, a, *params, eps=EPS, tiling=tiling)))

    np.testing.assert_array_equal(jax.grad(loss)(y), jax.grad(loss)(x, a))


@pytest.mark.parametrize("tiling", FORMS, ids=["two-kernels", "one-kernel"])
def test_fused_ffn_block_in_bf16_is_as_close_as_the_xla_path(tiling):
    """bf16 operands: the kernels (one rounding fewer: fc1's output is not rounded before its GELU)
    land as close to the float64 formula as the XLA path does, and within 1 % of it."""
    ops = _operands(1)
    bf = [jnp.asarray(v, jnp.bfloat16) for v in ops]
    exact = _ffn_block_64(*(np.asarray(jnp.asarray(v, jnp.float32), np.float64) for v in bf))
    fused, xla = fused_ffn_block(*bf, eps=EPS, tiling=tiling), reference_ffn_block(*bf, eps=EPS)
    assert fused.dtype == jnp.bfloat16
    assert _rel(fused, xla) < 1e-2
    assert _rel(fused, exact) <= 1.5 * _rel(xla, exact)


@pytest.mark.parametrize("n, d, f", [(20, 128, 256), (75, 256, 384)],
                         ids=["one-program", "three-programs"])
def test_fused_ffn_block_gradient_matches_float64_finite_differences(n, d, f):
    """Every operand's gradient (the gradient kernel: one program of 64 rows with 40 past the
    end; 150 rows over programs of 64, the last partial) along a random direction against a
    central difference of the float64 formula."""
    ops = _operands(2, n=n, d=d, f=f)
    rng = np.random.default_rng(3)
    weights = rng.normal(size=(2, n, d))

    def loss(*p):
        return jnp.sum(fused_ffn_block(*p, eps=EPS, tiling=TILING) * weights)

    grads = jax.grad(loss, argnums=tuple(range(8)))(*(jnp.asarray(v, jnp.float32) for v in ops))
    for i, grad in enumerate(grads):
        direction = rng.normal(size=ops[i].shape)
        step = 1e-5
        plus, minus = list(ops), list(ops)
        plus[i], minus[i] = ops[i] + step * direction, ops[i] - step * direction
        want = np.sum((_ffn_block_64(*plus) - _ffn_block_64(*minus)) * weights) / (2 * step)
        got = float(np.sum(np.asarray(grad, np.float64) * direction))
        assert abs(got - want) <= 1e-4 * abs(want) + 1e-4, (i, got, want)


def test_fused_ffn_block_gradient_in_bf16_is_as_close_as_the_xla_paths():
    """bf16: every operand's gradient from the kernel lands as close to the float64 formula's
    (float32 autodiff of the formula on the same bf16 values) as the XLA path's gradient does,
    and within 2 % of it."""
    ops = _operands(4)
    bf = [jnp.asarray(v, jnp.bfloat16) for v in ops]
    weights = jnp.asarray(np.random.default_rng(5).normal(size=(2, 75, 256)), jnp.float32)

    def grads(block, params):
        def loss(*p):
            return jnp.sum(block(*p).astype(jnp.float32) * weights)
        return jax.jit(jax.grad(loss, argnums=tuple(range(8))))(*params)

    fused = grads(lambda *p: fused_ffn_block(*p, eps=EPS, tiling=ONE_KERNEL), bf)
    xla = grads(lambda *p: reference_ffn_block(*p, eps=EPS), bf)
    with jax.enable_x64():
        exact = grads(lambda *p: _ffn_block_64(*p, xp=jnp),
                      [jnp.asarray(np.asarray(jnp.asarray(v, jnp.float32)), jnp.float64) for v in bf])
    for i, (got, ref, want) in enumerate(zip(fused, xla, exact)):
        assert got.dtype == jnp.bfloat16
        assert _rel(got, ref) < 2e-2, i
        assert _rel(got, want) <= 1.5 * _rel(ref, want) + 1e-3, (i, _rel(got, want), _rel(ref, want))


def test_the_gradient_kernel_takes_rows_by_width_and_leaves_the_widest_to_xla():
    """Its [rows, d_model] float32 accumulator holds 32 768 elements (128 registers × 256 threads):
    64 rows up to d_model 512, fewer above, none past 2048 — there the gradient is the XLA
    path's (no kernel in the lowered gradient; the loss is linear in z, so no forward)."""
    assert [backward_rows(d) for d in (128, 512, 1024, 2048, 4096)] == [64, 64, 32, 16, None]

    def kernels(d):
        specs = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in
                 ((1, 100, d), (1, 100, d), (d,), (d,), (d, 256), (256,), (256, d), (d,))]
        grad = jax.grad(lambda *p: jnp.sum(fused_ffn_block(*p, eps=EPS).astype(jnp.float32)),
                        argnums=(0, 4))
        return triton_calls(grad, *specs, fields=("name", "grid_x"))

    assert kernels(2048) == [{"name": "flurka_ffn_block_bwd", "grid_x": "7"}]   # 100 rows / 16
    assert kernels(4096) == []


def _encoders(fused_ffn, *, dropout_rate=0.0, d_model=256, d_ff=384, **attention_options):
    config = ModelConfig("flurka-rnn", attention_options={"d_k": 16, **attention_options},
                         d_model=d_model, num_heads=2, num_layers=2, d_ff=d_ff,
                         dropout_rate=dropout_rate, fused_ffn=fused_ffn)
    return Encoder(config, max_len=40, rngs=nnx.Rngs(params=0, dropout=1))


def test_encoder_with_fused_ffn_computes_the_xla_encoders_function_and_gradient():
    """Same parameters (same seeds): outputs and every parameter's gradient agree with the XLA
    path, padded rows included (the FFN is per position)."""
    xla, fused = _encoders(False), _encoders(TILING)
    assert xla.layers[0].ffn_tiling is None and fused.layers[0].ffn_tiling == TILING
    x = jax.random.normal(jax.random.key(4), (2, 40, 256))
    mask = jnp.arange(40)[None, :] < jnp.array([[40], [33]])
    np.testing.assert_allclose(fused(x, mask), xla(x, mask), rtol=0, atol=2e-5)

    def loss(m):
        return jnp.sum(jnp.sin(m(x, mask)))

    g_xla, g_fused = (jax.tree.leaves(nnx.grad(loss)(m)) for m in (xla, fused))
    assert len(g_xla) == len(g_fused)
    for gx, gf in zip(g_xla, g_fused):
        assert _rel(gf, gx) < 1e-4


def test_the_whole_fused_block_computes_the_xla_encoders_function():
    """Every kernel at once — the attention's W_Q, query side and W_O in one with the LayerNorm
    inside, the FFN block in one handing the next block x's statistics — against the XLA
    encoder with the same parameters (float32, padded rows), gradients included."""
    xla = _encoders(False)
    fused = _encoders(ONE_KERNEL, fused=True, fused_projections=True)
    assert fused.layers[0].attention.fused_projections and fused._next_eps(0) == 1e-6
    x = jax.random.normal(jax.random.key(5), (2, 40, 256))
    mask = jnp.arange(40)[None, :] < jnp.array([[40], [29]])
    real = np.asarray(mask)
    got, want = np.asarray(forward(fused, x, mask)), np.asarray(forward(xla, x, mask))
    assert _rel(got[real], want[real]) < 1e-5

    g_xla, g_fused = (jax.tree.leaves(sin_loss_grads(m, x, mask)) for m in (xla, fused))
    for gx, gf in zip(g_xla, g_fused):
        assert _rel(gf, gx) < 1e-4


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_one_kernel_hands_the_next_layer_norm_its_statistics(dtype):
    """With ``next_eps`` the one kernel also returns z's row statistics for the next LayerNorm
    (mean, 1/σ with that eps, here 0.25; 150 rows, a ragged last 64-row block): those of z as
    returned — in bf16 its rounded values — against the float64 formula; the gradient is z's
    alone, the same as without them. The two kernels have no whole row: z and None."""
    ops = [jnp.asarray(v, dtype) for v in _operands(2)]
    z, (mean, rstd) = fused_ffn_block(*ops, eps=EPS, tiling=ONE_KERNEL, next_eps=0.25)
    assert mean.shape == rstd.shape == (2, 75) and mean.dtype == rstd.dtype == jnp.float32
    rows = np.asarray(z.astype(jnp.float32), np.float64)
    assert _rel(mean, rows.mean(-1)) < 1e-6
    assert _rel(rstd, 1 / np.sqrt(rows.var(-1) + 0.25)) < 1e-6
    np.testing.assert_array_equal(z, fused_ffn_block(*ops, eps=EPS, tiling=ONE_KERNEL))
    z2, none = fused_ffn_block(*ops, eps=EPS, tiling=TILING, next_eps=1e-5)
    assert none is None and z2.shape == z.shape

    def loss(x, next_eps):
        out = fused_ffn_block(x, *ops[1:], eps=EPS, tiling=ONE_KERNEL, next_eps=next_eps)
        z, (mean, rstd) = out if next_eps else (out, (0.0, 0.0))
        return jnp.sum(jnp.sin(z.astype(jnp.float32))) + jnp.sum(mean) + jnp.sum(rstd)

    np.testing.assert_array_equal(jax.grad(loss)(ops[0], 1e-5), jax.grad(loss)(ops[0], None))


@pytest.mark.parametrize("attention", ["flurka-rnn"])
def test_the_next_layer_takes_the_statistics_instead_of_a_pass_of_its_own(attention):
    """At the flash comparison's widths (d_model = FFN = 512, the LayerNorm in the attention's
    kernels, one-kernel FFN, bf16), lowered for the GPU: a 3-block encoder's forward runs the
    statistics kernel once (the first block's input), not once per block; the training step's
    gradient too."""
    with use_ffn_tiling(ONE_KERNEL):
        config = ModelConfig(attention, attention_options={
            "d_k": 128, "fused": True, "fused_projections": True, "dtype": jnp.bfloat16},
            d_model=512, num_heads=4, num_layers=3, d_ff=512, dropout_rate=0.0, fused_ffn=True)
        model = nnx.eval_shape(lambda: Encoder(config, max_len=1024, rngs=nnx.Rngs(0)))
    assert all(block.attention.fuses_norm for block in model.layers)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    x = jax.ShapeDtypeStruct((1, 1024, 512), jnp.bfloat16)

    def encode(p, r, x):
        return nnx.merge(graphdef, p, r)(x)

    def grad(p, r, x):
        return jax.grad(lambda p: jnp.sum(encode(p, r, x).astype(jnp.float32) ** 2))(p)

    for fn in (encode, grad):
        names = [c["name"] for c in triton_calls(fn, params, rest, x)]
        assert names.count("flurka_row_statistics") == 1, names
        assert names.count("flurka_ffn_block") == 3, names


def test_a_tuned_tiling_reaches_encoders_built_under_it():
    """``use_ffn_tiling`` (a GPU session's tuned choice) is what ``fused_ffn=True`` takes at
    construction; a block keeps it after the context ends."""
    with use_ffn_tiling(ONE_KERNEL):
        tuned = _encoders(True)
    assert {b.ffn_tiling for b in tuned.layers} == {ONE_KERNEL}
    assert _encoders(True).layers[0].ffn_tiling == FfnTiling()


def test_active_dropout_takes_the_xla_path():
    """The kernels have no dropout: a training step with dropout on runs the XLA path (the same
    masks from the same streams), deterministic calls the kernels."""
    x = jax.random.normal(jax.random.key(0), (1, 40, 256))
    xla, fused = _encoders(False, dropout_rate=0.5), _encoders(True, dropout_rate=0.5)
    np.testing.assert_array_equal(fused(x, deterministic=False), xla(x, deterministic=False))
    np.testing.assert_allclose(fused(x), xla(x), rtol=0, atol=2e-5)


def test_fused_ffn_refuses_sizes_and_launches_it_cannot_take_before_any_compute():
    with pytest.raises(ValueError, match="d_model that is a multiple of 128"):
        _encoders(True, d_model=200)
    with pytest.raises(ValueError, match="FFN width that is a multiple of 128"):
        _encoders(True, d_ff=200)
    with pytest.raises(ValueError, match="one kernel takes a d_model up to 512"):
        _encoders(ONE_KERNEL, d_model=640)
    for bad, message in (({"kernels": 3}, "kernels must be 1 or 2"),
                         ({"block_n": 48}, "block_n must be a power of two"),
                         ({"num_warps": 3}, "num_warps must be"), ({"num_stages": 0}, "num_stages")):
        with pytest.raises(ValueError, match=message):
            FfnTiling(**bad)
    with pytest.raises(ValueError, match="fused_ffn needs model scope"):
        Point("flurka-rnn", "forward", "layer", 1024, 512, 4, d_k=128, fused_ffn=True)
    with pytest.raises(ValueError, match="fused_ffn needs model scope"):
        Point("flurka-rnn", "forward", "model", 1024, 2600, 8, d_k=128, fused_ffn=True)


def test_points_fuse_the_ffn_of_the_model_points_it_fits():
    flash = points("flash-compare", fused_ffn=True)
    assert flash and all(p.fused_ffn for p in flash)                     # every mechanism alike
    tiny = points("tiny", fused_ffn=True)
    assert {p.fused_ffn for p in tiny if p.scope == "layer"} == {False}
    assert not any(p.fused_ffn for p in points("n-sweep", fused_ffn=True))   # d_model 2600


def test_fused_ffn_lowers_to_two_triton_kernels_for_the_gpu():
    """Pallas's Triton lowering runs here without a GPU, at the flash comparison's d_model =
    FFN = 512 in bf16: the forward is two Triton calls (LN + fc1, fc2 + residual) with the
    default launch — 128-row programs on 8 warps, 2 stages — over (128-wide column blocks,
    row blocks); the gradient adds one (:func:`_backward_kernel`: 64-row programs, 8 warps, 1
    stage). The one-kernel form is one call over the row blocks."""
    tiling, n = FfnTiling(), 1000
    bf = jnp.bfloat16
    specs = [jax.ShapeDtypeStruct(s, bf) for s in
             ((1, n, 512), (1, n, 512), (512,), (512,), (512, 512), (512,), (512, 512), (512,))]

    def forward(*p):
        return fused_ffn_block(*p, eps=EPS)

    def grad(*p):
        return jax.grad(lambda *q: jnp.sum(forward(*q).astype(jnp.float32) ** 2), argnums=(0, 4))(*p)

    for fn in (forward, grad):
        calls = triton_calls(fn, *specs)
        rows = -(-n // tiling.block_n)
        backward = [("flurka_ffn_block_bwd", -(-n // 64), 1, 1, 8)] if fn is grad else []
        assert [(c["name"], int(c["grid_x"]), int(c["grid_y"]), int(c["num_stages"]),
                 int(c["num_warps"])) for c in calls] == [
            ("flurka_ln_fc1", 4, rows, 2, 8), ("flurka_fc2_residual", 4, rows, 2, 8),
            *backward], calls
    with use_ffn_tiling(ONE_KERNEL):   # one kernel: 64-row programs, 8 warps, 1 stage (a new
        (call,) = triton_calls(lambda *p: fused_ffn_block(*p, eps=EPS), *specs,  # function: jit's
                               fields=("name", "grid_x", "grid_y", "num_stages",  # trace of
                                       "num_warps"))                             # forward is cached
    assert call == {"name": "flurka_ffn_block", "grid_x": str(-(-n // 64)), "grid_y": "1",
                    "num_stages": "1", "num_warps": "8"}


def test_the_gradient_kernel_reads_and_writes_each_row_once_on_an_h100(tmp_path):
    """At the flash comparison's size (N = 52 608, d_model = FFN = 512, bf16) compiled for the
    card: the gradient kernel runs on Hopper's warpgroup MMA without spilling, in the card's
    shared memory; its traffic is exactly x, a, ∂z and the block's parameters in, and ∂y, LN(y),
    h, ∂p and the programs' float32 column-sum shares out — the hidden layer is recomputed, not
    read back — and forward plus gradient plan under 55 % of the XLA path's."""
    fused, xla = cuda_compiler_script("""
        import json, sys, tempfile, jax, jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        from flurka.kernels import ffn as ff
        from flurka.speed import aot, profile
        device = aot.target_device(aot.TARGETS["h100"])
        spec, bf = jax.ShapeDtypeStruct, jnp.bfloat16
        n, d, f = 52_608, 512, 512
        args = [spec(s, bf) for s in ((1, n, d), (1, n, d), (d,), (d,), (d, f), (f,), (f, d),
                                      (d,), (1, n, d))]
        rows = []
        for block in (lambda *p: ff.fused_ffn_block(*p, eps=1e-6, tiling=ff.ONE_KERNEL),
                      lambda *p: ff.reference_ffn_block(*p, eps=1e-6)):
            def gradient(*p):                       # a bf16 cotangent, as a layer above gives
                z, vjp = jax.vjp(block, *p[:-1])
                return z, vjp(p[-1])
            with tempfile.TemporaryDirectory() as dump:
                _, compiled = aot.compile_for(jax.jit(gradient), args, device, dump)
                rows.append({"kernels": aot.kernel_report(dump),
                             "traffic": profile.planned_traffic(compiled.as_text())})
        json.dump(rows, open(sys.argv[1], "w"))
    """, tmp_path)
    n, d, f, programs = 52_608, 512, 512, -(-52_608 // 64)
    kernels = {k["kernel"]: k for k in fused["kernels"]}
    assert sorted(kernels) == ["flurka_ffn_block", "flurka_ffn_block_bwd"]
    backward = kernels["flurka_ffn_block_bwd"]
    assert backward["grid"] == [programs, 1, 1] and backward["threads"] == 8 * 32
    assert backward["mma"] == "wgmma"
    for kernel in fused["kernels"]:
        assert kernel["spill_store_bytes"] == 0 and kernel["registers"] <= 255, kernel
        assert 0 < kernel["shared_memory_bytes"] <= 232_448, kernel
    rows, params = n * d * 2, (2 * d + d * f + f + f * d) * 2          # bf16
    reads = 3 * rows + params                                            # x, a, ∂z
    writes = 2 * rows + 2 * n * f * 2 + programs * (3 * d + f) * 4       # ∂y, LN(y); h, ∂p; shares
    pallas = {k["op"]: k["bytes"] for k in fused["traffic"]["largest"] if k["kind"] == "pallas"}
    assert reads + writes in pallas.values(), pallas
    assert "pallas" not in xla["traffic"]["by_kind"]
    assert fused["traffic"]["bytes"] < 0.55 * xla["traffic"]["bytes"], (
        fused["traffic"]["bytes"], xla["traffic"]["bytes"])


def test_every_kernel_of_the_block_fits_an_h100s_shared_memory_in_both_dtypes(tmp_path):
    """Compiled for the card (forward and gradient, both forms, at the flash comparison's
    widths): every launch within its 227 KiB of shared memory. The H100 refused the float32
    two kernels at the bf16 launch (RESOURCE_EXHAUSTED, 257 KiB asked; 2026-11-28), so float32
    takes half the rows and one stage (:meth:`FfnTiling.for_dtype`); bf16 keeps its launch."""
    rows = cuda_compiler_script("""
        import json, sys, tempfile, jax, jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        from flurka.kernels import ffn as ff
        from flurka.speed import aot
        device = aot.target_device(aot.TARGETS["h100"])
        n, d, f = 1000, 512, 512
        rows = []
        for dtype in ("float32", "bfloat16"):
            args = [jax.ShapeDtypeStruct(s, dtype) for s in
                    ((1, n, d), (1, n, d), (d,), (d,), (d, f), (f,), (f, d), (d,), (1, n, d))]
            for tiling in (ff.FfnTiling(), ff.ONE_KERNEL):
                def step(*p, tiling=tiling):
                    z, vjp = jax.vjp(lambda *q: ff.fused_ffn_block(*q, eps=1e-6, tiling=tiling),
                                     *p[:-1])
                    return z, vjp(p[-1])
                with tempfile.TemporaryDirectory() as dump:
                    aot.compile_for(jax.jit(step), args, device, dump)
                    rows += [{"dtype": dtype, "kernels": tiling.kernels, **k}
                             for k in aot.launches(dump)]
        json.dump(rows, open(sys.argv[1], "w"))
    """, tmp_path)
    names = {(r["dtype"], r["kernels"], r["kernel"]) for r in rows}
    assert names == {(dt, k, name) for dt in ("float32", "bfloat16")
                     for k, kernel in ((2, ("flurka_ln_fc1", "flurka_fc2_residual")),
                                       (1, ("flurka_ffn_block",)))
                     for name in (*kernel, "flurka_ffn_block_bwd")}, names
    for row in rows:
        assert 0 < row["shared_memory_bytes"] <= 232_448, row
    bf16 = {r["kernel"]: r["grid"][1] for r in rows if r["dtype"] == "bfloat16"}
    f32 = {r["kernel"]: r["grid"][1] for r in rows if r["dtype"] == "float32"}
    assert bf16["flurka_ln_fc1"] == -(-1000 // 128) and f32["flurka_ln_fc1"] == -(-1000 // 64)


def test_float32_operands_take_half_the_rows_and_one_stage():
    assert FfnTiling().for_dtype(jnp.bfloat16) == FfnTiling()
    assert FfnTiling().for_dtype(jnp.float32) == FfnTiling(2, 64, 8, 1)
    assert FfnTiling(1, 16, 4, 2).for_dtype(jnp.float32) == FfnTiling(1, 16, 4, 1)
