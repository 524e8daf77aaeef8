"""The tiny CPU sweep: every mechanism in forward and train mode (layer scope), equal parameters."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flurka.attention import MECHANISMS
from flurka import hlo
from flurka.attention import flops as flop_model
from flurka.speed import configs
from flurka.speed.runner import run_sweep
from testsupport import RECORDED

LOW_RANK = {"linformer", *flop_model.FLURKA}


@pytest.fixture(scope="module")
def layer_doc():
    pts = configs.points("tiny", scopes=["layer"])
    return run_sweep(pts, range(len(pts)), sweep="tiny", out=None, warmup=1, repeats=2)


def test_every_mechanism_runs_forward_and_train(layer_doc):
    rows = layer_doc["results"]
    assert {(r["mechanism"], r["mode"]) for r in rows} == {
        (m, mode) for m in MECHANISMS for mode in ("forward", "train")}
    for r in rows:
        assert r["status"] == "ok", (r["mechanism"], r["mode"], r.get("error"))
        assert 0 < r["p10_s"] <= r["median_s"] <= r["p90_s"]
        assert r["flops"] > 0 and r["xla_dot_flops"] > 0 and r["min_bytes"] > 0
        # the compiled plan moves at least the bytes no plan can avoid, by kinds that sum up
        assert r["xla_traffic_bytes"] >= r["min_bytes"], (r["mechanism"], r["mode"])
        assert sum(r["xla_traffic_by_kind"].values()) == r["xla_traffic_bytes"]
        assert r["floor_s"] > 0 and r["ratio_to_floor"] == pytest.approx(
            r["median_s"] / r["floor_s"])
        # the training step does the forward dots and (at least) as many again for backward;
        # a lone layer's input is data, so x's gradient is neither computed nor counted
        fwd = next(f for f in rows if f["mechanism"] == r["mechanism"] and f["mode"] == "forward")
        if r["mode"] == "train":
            assert 2 * fwd["xla_dot_flops"] <= r["xla_dot_flops"] < 3 * fwd["xla_dot_flops"]
            assert 2 * fwd["flops"] < r["flops"] < 3 * fwd["flops"]


def test_parameter_counts_match_across_mechanisms(layer_doc):
    fwd = {r["mechanism"]: r for r in layer_doc["results"] if r["mode"] == "forward"}
    shared = {m: r["params"] - r["params_lowrank"] for m, r in fwd.items()}
    d = 32
    assert shared["full"] == 4 * (d * d + d)  # W_Q, W_K, W_V, W_O with biases
    for m in MECHANISMS:
        if "eva" not in m:  # EVA adds its adaptive proposal (two Linear + LayerNorm per layer)
            assert shared[m] == shared["full"], m
        assert (fwd[m]["params_lowrank"] > 0) == (m in LOW_RANK)
    assert fwd["linformer"]["params_lowrank"] == 2 * 16 * 64  # E1, E2: [d_k, N]
    assert len({fwd[m]["params"] for m in ("linformer", "flurka-performer", "flurka-rnn")}) == 1


@pytest.mark.parametrize("scope", ["layer", "model"])
def test_timed_low_rank_layers_have_a_dense_e(scope):
    """The layers' default E (pooled block means) is almost all zeros, and a product over zeros
    can time faster than one over trained weights: the timed E is the paper's dense draw."""
    import numpy as np
    from flurka.speed import bench

    for point in configs.points("tiny", scopes=[scope]):
        if point.mechanism in LOW_RANK and point.mode == "forward":
            e1, e2 = bench.attention_layer(bench.build(point)).seq_proj.matrices(point.seq_len)
            for e in (np.asarray(e1), np.asarray(e2)):
                assert np.count_nonzero(e) == e.size, point.mechanism
                assert abs(e.std() * np.sqrt(point.d_k) - 1) < 0.2  # N(0, 1/d_k)


def test_aligned_points_run_on_padded_shapes_and_count_true_flops():
    """align=12 pads every tiny dimension (d_model 32, d_h 8, d_k 16, N 64, m 8): the point runs,
    records its align, keeps the FLOP model's count of the true shapes, and XLA does more dot work
    than that (the padding is extra work, bought for speed on a GPU)."""
    from flurka.attention import ALIGNABLE
    pts = configs.points("tiny", scopes=["layer"], modes=["forward"], align=12)
    assert {p.mechanism for p in pts if p.align == 12} == set(ALIGNABLE)
    assert {p.align for p in pts if p.mechanism not in ALIGNABLE} == {1}  # flash: as it is
    plain_pts = configs.points("tiny", scopes=["layer"], modes=["forward"])
    chosen = [i for i, p in enumerate(pts) if p.mechanism in ("linformer", "flurka-performer")]
    aligned, plain = (run_sweep([ps[i] for i in chosen], chosen, sweep="tiny", out=None, warmup=1,
                                repeats=2)["results"] for ps in (pts, plain_pts))
    for a, p in zip(aligned, plain):
        assert a["mechanism"] == p["mechanism"] in ("linformer", "flurka-performer")
        assert a["status"] == "ok" and a["align"] == 12 and p["align"] == 1
        assert a["flops"] == p["flops"]
        assert a["xla_dot_flops"] > 1.3 * p["xla_dot_flops"]
    with pytest.raises(ValueError, match="flash does not support align"):
        configs.Point(mechanism="flash", mode="forward", scope="layer", seq_len=64, d_model=32,
                      num_heads=4, align=128)


def test_fused_points_run_and_match_sizes():
    """--fused runs the kernel mechanisms' Pallas query side (interpreted on the CPU) and records
    it, aligned (align=16: d_h 8 → 16, m 8 → 16) or not (the kernel pads d_h 8 → 16 itself); a
    fused layer it cannot build is an error result saying why, not a crash."""
    from flurka.attention import FUSABLE
    from flurka.kernels.query_side import Tiling, use_tiling
    pts = configs.points("tiny", scopes=["layer"], modes=["forward", "train"], align=16, fused=True)
    assert {p.mechanism for p in pts if p.fused} == set(FUSABLE)
    chosen = [i for i, p in enumerate(pts) if p.mechanism == "flurka-rnn"]
    with use_tiling(Tiling(block_n=16, bwd_block_n=16, bwd_rows=32)):   # recorded in each row
        rows = run_sweep([pts[i] for i in chosen], chosen, sweep="tiny", out=None, warmup=0,
                         repeats=1)["results"]
    assert [(r["mode"], r["status"], r["fused"], r["tiling"]["block_n"], r["tiling"]["bwd_rows"])
            for r in rows] == [("forward", "ok", True, 16, 32), ("train", "ok", True, 16, 32)]
    unaligned = [p for p in configs.points("tiny", scopes=["layer"], modes=["forward"], fused=True)
                 if p.mechanism == "rnn"]
    row = run_sweep(unaligned, [0], sweep="tiny", out=None, warmup=0, repeats=1)["results"][0]
    assert (row["status"], row["fused"]) == ("ok", True)
    too_wide = dataclasses.replace(unaligned[0], d_model=2048, num_heads=2)     # d_h 1024
    row = run_sweep([too_wide], [0], sweep="tiny", out=None, warmup=0, repeats=1)["results"][0]
    assert row["status"] == "error" and "up to 512" in row["error"]
    with pytest.raises(ValueError, match="linformer has no fused kernel"):
        configs.Point(mechanism="linformer", mode="forward", scope="layer", seq_len=64, d_model=32,
                      num_heads=4, fused=True)


def test_padded_batches_run_masked_and_count_the_real_rows():
    """pad_to=48 pads every point's batch (N 64 → 96 rows, the last 32 masked; the model built
    for 96): the step runs on 96 rows, E1/E2 have 96 columns, and the FLOP model, the input's
    bytes and the recorded N stay the real 64 rows'. The padded rows change nothing real: the
    forward's real rows equal the same model's on the unpadded input, and the training loss is
    the real rows' alone."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from flurka.attention import MECHANISMS
    from flurka.speed import bench
    pts = configs.points("tiny", scopes=["layer"], modes=["forward"], pad_to=48)
    assert {(p.pad_to, p.padded_len, p.seq_len) for p in pts} == {(48, 96, 64)}
    assert {p.mechanism for p in pts} == set(MECHANISMS)
    chosen = [i for i, p in enumerate(pts) if p.mechanism in ("flurka-rnn", "flash")]
    padded = run_sweep([pts[i] for i in chosen], chosen, sweep="tiny", out=None, warmup=0,
                       repeats=1)["results"]
    plain = run_sweep([dataclasses.replace(pts[i], pad_to=1) for i in chosen], chosen,
                      sweep="tiny", out=None, warmup=0, repeats=1)["results"]
    for a, p in zip(padded, plain):
        assert a["status"] == p["status"] == "ok" and (a["pad_to"], p["pad_to"]) == (48, 1)
        assert (a["seq_len"], a["flops"]) == (p["seq_len"], p["flops"])
        assert a["xla_dot_flops"] > 1.4 * p["xla_dot_flops"]           # 96 rows, not 64
        # the fewest bytes: x at N, the parameters as built (E1, E2 with 32 more columns)
        extra_e = (a["params_lowrank"] - p["params_lowrank"]) * 4       # float32
        assert a["min_bytes"] == p["min_bytes"] + extra_e
    assert [r["params_lowrank"] for r in padded] == [0, 2 * 16 * 96]     # flash; flurka-rnn E1, E2

    model_point = next(p for p in configs.points("tiny", scopes=["model"], pad_to=48)
                       if p.mechanism == "flurka-rnn" and p.mode == "train")
    module = bench.build(model_point)
    step, (params, compute, opt_state, rest, x, y) = bench.make_step(model_point, module)[:2]
    assert x.shape == (2, 96, 32)
    graphdef = nnx.graphdef(module)
    run = jax.jit(lambda x: nnx.merge(graphdef, params, rest)(x, deterministic=True))
    masked = jax.jit(lambda x: nnx.merge(graphdef, params, rest)(
        x, jnp.arange(96)[None] < jnp.full((2, 1), 64), deterministic=True))
    real = x[:, :64]
    assert jnp.allclose(masked(x)[:, :64], masked(x.at[:, 64:].set(7.0))[:, :64])
    # the model built for 96 rows, run unpadded on the 64 real ones, gives the same real outputs
    assert jnp.allclose(masked(x)[:, :64], run(real), atol=1e-5)
    loss = step(params, compute, opt_state, rest, x, y)[-1]
    expected = jnp.mean((run(real).astype(jnp.float32) - y[:, :64]) ** 2)
    assert jnp.allclose(loss, expected, rtol=1e-5)
    with pytest.raises(ValueError, match="pad_to must be a positive int"):
        dataclasses.replace(model_point, pad_to=0)


def test_xla_options_compile_the_point_and_are_recorded(tmp_path):
    """--xla NAME=VALUE compiles every point with that XLA option and records it in each row
    (and the results DB keeps such runs apart); an option XLA refuses fails before any point
    is built, naming it."""
    import json

    from flurka.speed.__main__ import main
    out = tmp_path / "x.json"
    args = ["--sweep", "tiny", "--mechanisms", "flurka-rnn", "--modes", "forward", "--scope", "layer",
            "--repeats", "1", "--warmup", "0", "--no-ceilings", "--out", str(out)]
    assert main([*args, "--xla", "xla_gpu_experimental_gemm_fusion_v2=true",
                 "--xla", "xla_cpu_enable_fast_math=false"]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["status"] == "ok" and row["xla"] == {
        "xla_cpu_enable_fast_math": False, "xla_gpu_experimental_gemm_fusion_v2": True}
    out.unlink()
    assert main([*args, "--xla", "xla_no_such_option=1"]) == 2 and not out.exists()
    with pytest.raises(ValueError, match="No such compile option: 'xla_no_such_option'"):
        from flurka.speed.bench import check_compile_options
        check_compile_options({"xla_no_such_option": 1})


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_bf16_model_step_multiplies_bf16_operands(mode):
    """The timed bf16 step at model scope (encoder blocks, FFN, loss, AdamW) asks the matrix units
    for bf16 products only: no float32 GEMM hides in the attention maths or its gradient
    (EVA's float32 proposal aside, < 1 %). Lowered only, never run."""
    import dataclasses

    from flurka.speed import bench
    for p in configs.points("flash-compare", modes=[mode]):
        if p.seq_len != 7500 or p.mechanism in ("flash", "full"):  # flash: cuDNN's own kernel
            continue
        p = dataclasses.replace(p, seq_len=512, d_k=128, num_features=64)
        fn, args, *_ = bench.make_step(p, bench.build(p))
        flops = hlo.dot_flops_by_type(fn.lower(*args).as_text(dialect="hlo"))
        assert flops.get("bf16", 0) >= 0.99 * sum(flops.values()), (p.mechanism, flops)


def test_the_mixed_precision_step_is_autodiff_through_the_cast_of_float32_masters():
    """bf16 train step (model scope, flurka-rnn): the step that takes the masters' bf16 copy
    from the previous update computes what differentiating through a cast of the float32
    masters does — same loss, same AdamW update of every master — and returns the next copy
    as the new masters cast to bf16."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from flurka.attention.base import cast_floating
    from flurka.speed import bench
    point = next(p for p in configs.points("tiny", scopes=["model"], modes=["train"],
                                           dtype="bfloat16") if p.mechanism == "flurka-rnn")
    module = bench.build(point)
    step, (params, compute, opt_state, rest, x, y) = bench.make_step(point, module)[:2]
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(
        lambda c, p: c.dtype == jnp.bfloat16 and p.dtype == jnp.float32, compute, params))
    graphdef, bf = nnx.graphdef(module), jnp.bfloat16

    def loss_of_masters(p):        # the textbook form: the cast inside the differentiated loss
        m = nnx.merge(graphdef, cast_floating(p, bf), cast_floating(rest, bf))
        diff = m(x, deterministic=True).astype(jnp.float32) - y.astype(jnp.float32)
        return jnp.mean(diff * diff)

    @jax.jit
    def reference(params):
        loss, grads = jax.value_and_grad(loss_of_masters)(params)
        updates, _ = optax.adamw(1e-4).update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates)

    loss, want = reference(params)
    new, new_compute, _, got_loss = step(params, compute, opt_state, rest, x, y)
    assert jnp.allclose(got_loss, loss, rtol=1e-6)
    for got, ref in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(want)):
        assert got.dtype == jnp.float32 and jnp.allclose(got, ref, rtol=1e-6, atol=1e-9)
    for c, p in zip(jax.tree_util.tree_leaves(new_compute), jax.tree_util.tree_leaves(new)):
        assert c.dtype == bf and jnp.array_equal(c, p.astype(bf))


SPEED_DOCUMENTS = sorted(p for p in RECORDED.rglob("*.json")
                         if str(json.loads(p.read_text()).get("schema", "")).startswith("flurka.speed/"))


@pytest.mark.parametrize("path", SPEED_DOCUMENTS, ids=lambda p: str(p.relative_to(RECORDED)))
def test_recorded_flops_and_floors_are_the_flop_models(path):
    """Every recorded row's FLOPs and floor are what the FLOP model says today, from the row's own
    sizes and its run's ceilings (``rederive`` a fixed point); a change of the model re-derives
    the records (their times untouched) or fails here."""
    from flurka.speed.bench import rederive

    doc = json.loads(path.read_text())
    again = rederive(doc)
    changed = [(r["mechanism"], r["mode"], r["seq_len"]) for r, s in zip(doc["results"], again["results"]) if r != s]
    assert changed == []
    assert any(r.get("flops") for r in doc["results"])


def test_rows_that_timed_an_earlier_layer_keep_their_recorded_flops():
    """flurka-eva's rows in a document created before its current definition
    (``bench.DEFINED``) timed another layer under the name: ``rederive`` keeps their FLOP-model
    fields as recorded, which today's model does not describe; the same rows in a document
    created since are re-derived, and no other mechanism's rows are dated."""
    from flurka.speed.bench import DEFINED, current_layer, rederive

    doc = json.loads((RECORDED / "h200" / "2026-12-04" / "run1" / "n-sweep.json").read_text())
    assert doc["created"] < DEFINED["flurka-eva"]
    assert any(r["mechanism"] == "flurka-eva" and r["status"] == "ok" for r in doc["results"])
    assert rederive(doc) == doc
    newer = {**doc, "created": f"{DEFINED['flurka-eva']}T00:00:00+00:00"}
    changed = {r["mechanism"] for r, s in zip(newer["results"], rederive(newer)["results"])
               if r != s}
    assert changed == {"flurka-eva"}
    assert not current_layer("flurka-eva", None) and current_layer("eva", None)
