"""``python -m flurka.speed``: the JSON document, model scope, point selection, bad input, and the
paper's sweeps as data."""

from __future__ import annotations

import json

from flurka.attention import flops as flop_model
from flurka.speed import configs
from flurka.speed.__main__ import main


def test_model_scope_and_cli_json(tmp_path):
    out = tmp_path / "speed.json"
    assert main(["--sweep", "tiny", "--mechanisms", "full,flurka-rnn", "--scope", "model",
                 "--repeats", "2", "--warmup", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["calls_per_sample"] is None   # sized per point (flurka.speed.timing)
    assert doc["schema"] == "flurka.speed/1" and doc["sweep"] == "tiny"
    assert doc["device"]["platform"] == "cpu" and doc["device"]["count"] >= 1
    assert doc["device"]["name"]
    assert {"python", "jax", "jaxlib", "flax"} <= set(doc["versions"])
    assert doc["ceilings"]["float32"]["matmul_flops_per_s"] > 0
    assert doc["ceilings"]["float32"]["copy_bytes_per_s"] > 0
    rows = doc["results"]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r["status"] == "ok" and r["scope"] == "model" and r["layers"] == 2
        for key in ("mechanism", "mode", "seq_len", "d_model", "num_heads", "d_k", "num_features",
                    "ffn", "dtype", "batch", "median_s", "p10_s", "p90_s", "flops", "floor_s",
                    "ratio_to_floor", "device_name", "calls_per_sample"):
            assert r[key] is not None, key
    full_layer = flop_model.forward_flops(
        "full", flop_model.AttentionShape(batch=2, seq_len=64, d_model=32, num_heads=4))
    full_fwd = next(r for r in rows if r["mechanism"] == "full" and r["mode"] == "forward")
    assert full_fwd["flops"] == 2 * (full_layer + 4 * 2 * 64 * 32 * 32)


def test_points_selection_and_bad_input(tmp_path, capsys):
    out = tmp_path / "one.json"
    assert main(["--sweep", "tiny", "--mechanisms", "rnn", "--modes", "forward", "--scope",
                 "layer", "--points", "0", "--repeats", "1", "--no-ceilings",
                 "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert len(rows) == 1 and rows[0]["mechanism"] == "rnn" and "floor_s" not in rows[0]
    for argv, message in ((["--mechanisms", "softmax"], "valid: full, flash"),
                          (["--points", "99"], "out of range"),
                          (["--modes", "backward"], "valid: forward, train"),
                          (["--profile-steps", "-1"], "--profile-steps >= 0"),
                          (["--calls-per-sample", "0"], "--calls-per-sample must be >= 1")):
        assert main(["--sweep", "tiny", "--out", str(out), *argv]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith("python -m flurka.speed: error: ")
        assert message in err


def test_ffn_kernels_choose_the_fused_ffn_form(tmp_path, capsys):
    """--ffn-kernels 1: the fused FFN points run the one-kernel form (the row records it);
    without --fused-ffn it is refused before any compute."""
    out = tmp_path / "ffn.json"
    assert main(["--sweep", "tiny-ffn", "--modes", "forward", "--points", "0", "--fused-ffn",
                 "--ffn-kernels", "1", "--repeats", "1", "--no-ceilings",
                 "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["status"] == "ok" and row["fused_ffn"] and row["ffn_tiling"]["kernels"] == 1
    assert main(["--sweep", "tiny-ffn", "--ffn-kernels", "1", "--out", str(out)]) == 2
    assert "--ffn-kernels needs --fused-ffn" in capsys.readouterr().err


def test_fused_projections_without_fused_is_refused(tmp_path, capsys):
    """Issue 60: it ran, exit 0, every row fused_projections false: an option dropped silently."""
    out = tmp_path / "p.json"
    assert main(["--sweep", "tiny", "--fused-projections", "--out", str(out)]) == 2
    assert "--fused-projections needs --fused" in capsys.readouterr().err and not out.exists()


def test_paper_sweeps_as_specified():
    n = configs.points("n-sweep", mechanisms=["full"], modes=["forward"], scopes=["layer"])
    assert [p.seq_len for p in n] == list(range(7050, 55051, 3000)) + [55500]
    assert {(p.d_model, p.num_heads, p.d_k, p.dtype) for p in n} == {(2600, 8, 1500, "bfloat16")}
    dk = configs.points("dk-sweep", mechanisms=["linformer"], modes=["train"], scopes=["layer"])
    assert [p.d_k for p in dk] == [8000, 11200, 14400, 17600, 20000]
    assert {(p.seq_len, p.head_dim) for p in dk} == {(20000, 128)}
    dm = configs.points("dmodel-sweep", mechanisms=["rnn"], modes=["train"], scopes=["layer"])
    assert [p.d_model for p in dm] == [800, 4000, 7200, 10400, 13600, 16800, 20000]
    fc = configs.points("flash-compare", modes=["forward"])
    assert {p.seq_len for p in fc} == {7500, 16500, 25500, 34500, 43500, 52500}
    assert {(p.layers, p.ffn, p.num_heads, p.scope) for p in fc} == {(6, 512, 4, "model")}
    assert "flash" in {p.mechanism for p in fc}
    boundary = configs.points("claims-boundary", modes=["forward"])
    assert {(p.d_model, p.num_heads, p.d_k, p.num_features, p.scope) for p in boundary} == {(2600, 8, 1500, 325, "layer")}
    ns = sorted({p.seq_len for p in boundary})
    assert ns[0] < 3100 and 4100 < ns[1 + ns.index(4000)] and 15000 in ns and ns[-1] > 15000  # both sides of each
    assert {p.mechanism for p in boundary} == {"linformer", "performer", "rnn", "eva", "flurka-performer",
                                               "flurka-rnn", "flurka-eva"}
    small = configs.points("claims-boundary-small", modes=["forward"])
    assert {(p.d_model, p.num_heads, p.d_k, p.num_features, p.dtype) for p in small} == {(512, 8, 128, 64, "float32")}
    assert min(p.seq_len for p in small) < 160 and max(p.seq_len for p in small) > 8 * 128 * (8 + 2) // 8


def test_interleaved_cli_run(tmp_path):
    """--interleave: the same document, rows timed side by side per configuration."""
    out = tmp_path / "side.json"
    assert main(["--sweep", "tiny", "--mechanisms", "rnn,flurka-rnn", "--scope", "layer", "--repeats", "3",
                 "--warmup", "1", "--interleave", "--calls-per-sample", "2", "--no-ceilings",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["interleaved"] is True and doc["settings"]["calls_per_sample"] == 2
    rows = doc["results"]
    assert [(r["index"], r["mechanism"], r["mode"]) for r in rows] == [
        (0, "rnn", "forward"), (2, "flurka-rnn", "forward"), (1, "rnn", "train"), (3, "flurka-rnn", "train")]
    for r in rows:
        assert r["status"] == "ok" and r["interleaved"] and r["repeats"] == 3 and r["warmup"] == 1
        assert r["calls_per_sample"] == 2
        assert 0 < r["min_s"] <= r["median_s"] <= r["p90_s"] and r["device_name"] and r["flops"]

