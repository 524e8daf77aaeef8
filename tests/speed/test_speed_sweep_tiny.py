"""The tiny CPU sweep: every mechanism in forward and train mode (layer scope), equal parameters."""

from __future__ import annotations

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
