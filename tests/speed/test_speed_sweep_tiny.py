"""The tiny CPU sweep: every mechanism in forward and train mode (layer scope), equal parameters."""

from __future__ import annotations

import dataclasses

import pytest

from flurka.attention import MECHANISMS
from flurka.attention import flops as flop_model
from flurka.speed import configs
from flurka.speed.runner import run_sweep

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
        # the training step does the forward dots and (at least) as many again for backward
        fwd = next(f for f in rows if f["mechanism"] == r["mechanism"] and f["mode"] == "forward")
        if r["mode"] == "train":
            assert r["xla_dot_flops"] >= 2 * fwd["xla_dot_flops"]
            assert r["flops"] == 3 * fwd["flops"]


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


def test_aligned_points_run_on_padded_shapes_and_count_true_flops():
    """align=12 pads every tiny dimension (d_model 32, d_h 8, d_k 16, N 64, m 8): the point runs,
    records its align, keeps the FLOP model's count of the true shapes, and XLA does more dot work
    than that (the padding is extra work, bought for speed on a GPU)."""
    from flurka.attention import ALIGNABLE
    pts = configs.points("tiny", scopes=["layer"], modes=["forward"], align=12)
    assert {p.mechanism for p in pts if p.align == 12} == set(ALIGNABLE)
    assert {p.align for p in pts if p.mechanism not in ALIGNABLE} == {1}  # eva, flash: as they are
    plain_pts = configs.points("tiny", scopes=["layer"], modes=["forward"])
    chosen = [i for i, p in enumerate(pts) if p.mechanism in ("linformer", "flurka-performer")]
    aligned, plain = (run_sweep([ps[i] for i in chosen], chosen, sweep="tiny", out=None, warmup=1,
                                repeats=2)["results"] for ps in (pts, plain_pts))
    for a, p in zip(aligned, plain):
        assert a["mechanism"] == p["mechanism"] in ("linformer", "flurka-performer")
        assert a["status"] == "ok" and a["align"] == 12 and p["align"] == 1
        assert a["flops"] == p["flops"]
        assert a["xla_dot_flops"] > 1.3 * p["xla_dot_flops"]
    with pytest.raises(ValueError, match="eva does not support align"):
        configs.Point(mechanism="eva", mode="forward", scope="layer", seq_len=64, d_model=32,
                      num_heads=4, align=128)


def test_fused_points_run_and_match_sizes():
    """--fused runs the kernel mechanisms' Pallas query side (interpreted on the CPU) and records
    it, aligned (align=16: d_h 8 → 16, m 8 → 16) or not (the kernel pads d_h 8 → 16 itself); a
    fused layer it cannot build is an error result saying why, not a crash."""
    from flurka.attention import FUSABLE
    from flurka.attention.fused import Tiling, use_tiling
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
        flops = flop_model.hlo_dot_flops_by_type(fn.lower(*args).as_text(dialect="hlo"))
        assert flops.get("bf16", 0) >= 0.99 * sum(flops.values()), (p.mechanism, flops)
