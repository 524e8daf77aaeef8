"""The one-lease GPU driver (benchmarks/gpu_session.py), dry-run on the CPU, and the deadline."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
from pathlib import Path

import pytest

from flurka.catalogue.mechanisms import FLURKA
from flurka.speed.configs import points
from flurka.speed.runner import run_sweep

ROOT = Path(__file__).resolve().parents[2]


def _driver():
    spec = importlib.util.spec_from_file_location("gpu_session", ROOT / "benchmarks" / "gpu_session.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plans_name_real_points_in_priority_order():
    g = _driver()
    first = g.planned(*g.PLANS["first"][0])
    assert len(first) == 9 and {p.seq_len for _, p in first} == {55500}
    assert [p.mechanism for _, p in first][:2] == ["flurka-performer", "flurka-rnn"]
    assert [p.mechanism for _, p in first][-2:] == ["full", "flash"]  # quadratic ones last
    for plan in g.PLANS.values():
        for sweep, where in plan:
            assert g.planned(sweep, where), (sweep, where)  # every block selects something
    aligned = g.planned(*g.PLANS["third"][0])                           # aligned: E built padded
    assert {(p.align, p.pad_to, p.padded_len) for _, p in aligned} == {(128, 128, 55_552)} and len(aligned) == 5
    fused = [p for block in g.PLANS["third"] if "fused" in block[1] for _, p in g.planned(*block)]
    assert fused and all(p.fused and p.mechanism.startswith("flurka-") for p in fused)
    fused_forward = [p for sweep, where in g.PLANS["third"] if sweep == "flash-compare"
                     and "fused" in where and where["mode"] == {"forward"}
                     for _, p in g.planned(sweep, where)]
    assert {p.mechanism for p in fused_forward} == {"flurka-performer", "flurka-rnn", "flurka-eva"}
    padded = [(i, p) for sweep, where in g.PLANS["third"] if "pad_to" in where and "align" not in where
              for i, p in g.planned(sweep, where)]                       # the same points' twins,
    unpadded = [(i, dataclasses.replace(p, pad_to=1, xla=())) for i, p in padded]  # padded to 128
    assert {(p.pad_to, p.padded_len) for _, p in padded} == {(128, 52_608)}
    v2 = [p for _, p in padded if p.xla]                                 # and XLA's GEMM fusion v2
    assert v2 and {(p.mode, dict(p.xla)["xla_gpu_experimental_gemm_fusion_v2"]) for p in v2} == \
        {("forward", True)}
    assert all(u in [(i, p) for sweep, where in g.PLANS["third"] for i, p in g.planned(sweep, where)]
               for u in unpadded)
    by_dtype = {where["dtype"].copy().pop(): g.planned(sweep, where)
                for sweep, where in g.PLANS["third"] if "dtype" in where}
    assert {p.dtype for _, p in by_dtype["float32"]} == {"float32"}      # twins: same points,
    assert [(i, p.mechanism) for i, p in by_dtype["float32"]] == \
        [(i, p.mechanism) for i, p in by_dtype["bfloat16"]]              # the other dtype
    compared = [p for sweep, where in g.PLANS["fourth"] if sweep == "flash-compare"
                for _, p in g.planned(sweep, where)]
    for mode in ("forward", "train"):       # the flash comparison: flash in the same lease
        assert {p.mechanism for p in compared if p.mode == mode} >= \
            {"flash", "flurka-performer", "flurka-rnn"}
    boundary = g.planned(*g.PLANS["third"][-1])                          # both sides of 15000
    assert len(boundary) == 30 and {p.seq_len for _, p in boundary} == {2000, 3000, 4000, 5000, 7050, 15000}
    for name in ("fourth", "targets"):      # the wide fused kernel beside its XLA twins
        wide = [p for sweep, where in g.PLANS[name] if sweep == "n-sweep"
                for _, p in g.planned(sweep, where) if p.seq_len == 55500 and p.mode == "forward"
                and p.align == 128]
        assert {p.mechanism for p in wide if p.fused} == set(g.FUSABLE)
        assert {p.mechanism for p in wide if not p.fused} >= set(g.FUSABLE)
    for name in ("fourth", "targets"):      # the fused FFN: FLuRKA at its best, and flash
        ffn = [p for sweep, where in g.PLANS[name] for _, p in g.planned(sweep, where)
               if p.fused_ffn]
        assert {(p.mechanism, p.mode) for p in ffn} >= {(m, "forward") for m in {"flash", *FLURKA}}
        assert all(p.scope == "model" and p.seq_len == 52500 for p in ffn)
        assert all(p.fused and p.pad_to == 128 for p in ffn if p.mechanism != "flash")
        # ... and the whole fused layer (W_Q, W_O in the query-side kernel) where it fits: the
        # projectable variants; flurka-eva (no projected kernel) fused without it
        assert {p.mechanism for p in ffn if p.fused_projections} == set(FLURKA) & set(g.PROJECTABLE) \
            == {"flurka-performer", "flurka-rnn"}
        assert "flurka-eva" in {p.mechanism for p in ffn if p.fused and not p.fused_projections}
    targets = [p for sweep, where in g.PLANS["targets"] for _, p in g.planned(sweep, where)]
    # the targets on a card never measured: every alignable mechanism's N = 55.5k layer
    # aligned first, then flash against FLuRKA at 52.5k, both modes; the quadratic ones last
    assert {p.mechanism for p in targets[:7]} == set(g.ALIGNABLE) - {"full"}
    assert all(p.align == 128 and p.seq_len == 55500 and p.mode == "forward" for p in targets[:7])
    flash = {(p.mechanism, p.mode) for p in targets if p.seq_len == 52500}
    assert {(m, mode) for m in ("flash", "flurka-performer", "flurka-rnn", "flurka-eva")
            for mode in ("forward", "train")} <= flash
    assert {p.mechanism for p in targets[-2:]} == {"full", "flash"}
    second = [p for sweep, where in g.PLANS["h100-second"] for _, p in g.planned(sweep, where)]
    # what the targets owe: the EVAs aligned first, fused and XLA (plain EVA's 2x and
    # flurka-eva's 1.5x, missed, never timed with the fused chunk softmax), then FLuRKA's best
    # flash comparison and flash, both modes (the first lease timed no flash training step);
    # the quadratic ones last
    assert sorted((p.mechanism, p.fused) for p in second[:4]) == [
        ("eva", False), ("eva", True), ("flurka-eva", False), ("flurka-eva", True)]
    assert all(p.align == 128 and p.seq_len == 55500 and p.mode == "forward" for p in second[:4])
    assert {(p.mechanism, p.mode) for p in second[4:12]} == {
        (m, mode) for m in ("flash", *FLURKA) for mode in ("forward", "train")}
    assert all(p.fused and p.pad_to == 128 for p in second[4:12] if p.mechanism != "flash")
    assert {p.mechanism for p in second[-2:]} == {"full", "flash"}
    # flurka-rnn's aligned training step beside rnn's (a tie within the spread on the first lease)
    assert {"rnn", "flurka-rnn"} <= {p.mechanism for p in second if p.mode == "train" and p.align == 128
                                     and p.seq_len == 55500 and not p.fused}


def test_a_plan_cannot_ask_for_projections_a_layer_does_not_have(tmp_path):
    """A block with fused_projections names projectable mechanisms only ("projectable", or a
    list of them): flurka-eva's query side has no projected kernel, so a block asking for it
    (here through the "flurka" group) is refused when the plans are read, not dropped."""
    g = _driver()
    plans = g.PLANS_FILE.read_text()
    assert 'fused_projections = [true], fused_ffn = [true], mechanism = "projectable"' in plans
    bad = tmp_path / "plans.toml"
    bad.write_text(plans.replace('fused_projections = [true], fused_ffn = [true], '
                                 'mechanism = "projectable"',
                                 'fused_projections = [true], fused_ffn = [true], '
                                 'mechanism = "flurka"'))
    with pytest.raises(ValueError, match="fused_projections of flurka-eva, which have no "
                                         "projected kernel"):
        g.load_plans(bad)
    assert "flurka-eva" not in g.HANDED_OVER


def test_theory_arguments_are_a_valid_plan():
    import argparse

    from flurka.theory import cli as theory_cli
    g = _driver()
    parser = argparse.ArgumentParser()
    theory_cli.add_arguments(parser)
    plan = theory_cli.plan(parser.parse_args([*g.THEORY_ARGS, "--out", "t.json"]))
    assert max(plan["d_k"]) <= 2048 // 2 and plan["m"]


def test_dry_run_checks_and_writes_ingestable_documents(tmp_path, capsys):
    g = _driver()
    assert g.main(["--out", str(tmp_path), "--tiny", "--check", "rnn,flash,full", "--budget-s", "600",
                   "--repeats", "1", "--warmup", "0", "--check-align", "128", "--check-fused",
                   "--profile-steps", "1", "--tune-fused"]) == 0
    check = json.loads((tmp_path / "check.json").read_text())["check"]
    # CPU vs CPU: the same layer, so exactly equal; flash bf16 within bf16 rounding of full f32;
    # the aligned layer (other shapes, same function) within float32 rounding of the plain one.
    by = {(r["mechanism"], r["dtype"], r.get("padding") or r.get("align")
           or ("projections" if r.get("fused_projections") else r.get("fused"))): r
          for r in check if "num_heads" not in r}
    (wide,) = [r for r in check if "num_heads" in r]      # the N-sweep's d_h = m = 325, fused
    assert (wide["mechanism"], wide["dtype"], wide["d_model"], wide["num_heads"]) == \
        ("rnn", "bfloat16", 325, 1)
    assert 1e-4 < wide["rel_err"] < 2e-2 and 1e-4 < wide["grad_rel_err"] < 5e-2
    assert by[("rnn", "float32", None)]["rel_err"] == 0.0
    assert 0.0 < by[("rnn", "float32", 128)]["rel_err"] < 1e-5
    assert ("flash", "float32", 128) not in by                    # flash cannot be aligned
    # the Pallas query side (interpreted here) against the XLA layer: float32 and bf16 rounding
    assert 0.0 < by[("rnn", "float32", True)]["rel_err"] < 1e-5
    assert 1e-4 < by[("rnn", "bfloat16", True)]["rel_err"] < 2e-2
    # their gradients (aligned; fused: the backward kernel) against the CPU layer's
    assert 0.0 < by[("rnn", "float32", 128)]["grad_rel_err"] < 1e-5
    # softmax's key bias: a zero gradient up to roundoff, not a 0.66 relative error
    assert 0.0 < by[("full", "float32", 128)]["grad_rel_err"] < 1e-5
    assert 0.0 < by[("rnn", "float32", True)]["grad_rel_err"] < 1e-5
    assert 1e-4 < by[("rnn", "bfloat16", True)]["grad_rel_err"] < 5e-2
    assert "grad_rel_err" not in by[("rnn", "float32", None)]
    assert ("flash", "float32", True) not in by
    for padding in ("any", "right"):
        assert 1e-4 < by[("flash", "bfloat16", padding)]["rel_err"] < 2e-2
    # W_Q, the query side and W_O in one kernel (d_model 256) against the XLA layer
    assert 0.0 < by[("rnn", "float32", "projections")]["rel_err"] < 1e-5
    assert 0.0 < by[("rnn", "float32", "projections")]["grad_rel_err"] < 1e-5
    assert 1e-4 < by[("rnn", "bfloat16", "projections")]["rel_err"] < 2e-2
    # flurka-rnn, which --check does not name: its projected layer with the LayerNorm handed
    # over (the compression's and the projected query side's gradient kernels) in float32
    handed = by[("flurka-rnn", "float32", "projections")]
    assert handed["norm"] and 0.0 < handed["rel_err"] < 1e-5 and 0.0 < handed["grad_rel_err"] < 1e-5, handed
    assert not any(r["mechanism"] == "flurka-eva" for r in check)
    # the fused FFN block (its two kernels, interpreted here) against the XLA path in float32
    assert 0.0 < by[("fused_ffn", "float32", None)]["rel_err"] < 1e-5
    assert 1e-4 < by[("fused_ffn", "bfloat16", None)]["rel_err"] < 2e-2
    # ... and its gradient kernel's every operand gradient
    assert 0.0 < by[("fused_ffn", "float32", None)]["grad_rel_err"] < 1e-5
    assert 1e-4 < by[("fused_ffn", "bfloat16", None)]["grad_rel_err"] < 5e-2
    tiny = json.loads((tmp_path / "tiny.json").read_text())
    assert tiny["schema"] == "flurka.speed/1"
    assert [(r["mechanism"], r["fused"]) for r in tiny["results"]] == [     # ORDER: FLuRKA first
        ("flurka-rnn", False), ("rnn", False), ("flurka-rnn", True)]
    assert all(r["status"] == "ok" and r["ratio_to_floor"] > 0 for r in tiny["results"])
    assert all(r["profile"]["steps"] == 1 and r["profile"]["by_kind"] for r in tiny["results"])
    ffn = json.loads((tmp_path / "tiny-ffn.json").read_text())["results"]
    ffn_tuning = json.loads((tmp_path / "ffn_tuning.json").read_text())  # before that point
    assert [(r["mechanism"], r["scope"], r["fused_ffn"], r["fused_projections"], r["status"])
            for r in ffn] == [("flurka-rnn", "model", True, False, "ok"),
                              ("flurka-rnn", "model", True, True, "ok")]  # the whole fused block
    assert [r["tiling"]["kernels"] for r in ffn_tuning["rows"]] == [2, 1]   # default, the grid
    assert ffn[0]["ffn_tiling"] == ffn_tuning["best"] != tiny["results"][-1].get("ffn_tiling")
    compress = json.loads((tmp_path / "compress_tuning.json").read_text())  # before the last
    assert [r["status"] for r in compress["rows"]] == ["ok", "ok"]          # default, the grid
    assert json.loads((tmp_path / "tiny-ffn.json").read_text())["settings"][
        "compress_tiling"] == compress["best"]
    tuning = json.loads((tmp_path / "fused_tuning.json").read_text())   # --tune-fused
    ran = [r for r in tuning["rows"] if r["status"] == "ok"]
    assert [r["stage"] for r in ran] == (["forward"] * 3 + ["gradient"] * 2 + ["wide"] * 2
                                         + ["softmax"] * 2)
    assert tuning["device"] and tuning["wide_size"]["head_dim"] == 130   # past one block: wide
    assert tuning["softmax_size"]["head_dim"] == 130 and tuning["softmax_size"]["keys"] == 16
    wide, softmax = (min((r for r in ran if r["stage"] == stage), key=lambda r: r["total_s"])
                     for stage in ("wide", "softmax"))
    assert set(wide["median_s"]) == {"favor", "elu"} and set(softmax["median_s"]) == {"softmax"}
    assert tuning["best"] == softmax["tiling"] == tiny["settings"]["fused_tiling"]
    assert {k: v for k, v in tuning["best"].items() if not k.startswith("softmax_")} == \
        {k: v for k, v in wide["tiling"].items() if not k.startswith("softmax_")}  # wide's kept
    assert tiny["results"][-1]["tiling"] == tuning["best"] and "tiling" not in tiny["results"][0]
    # the tuning ran when the plan reached its fused point, after the XLA points
    log = capsys.readouterr().out
    tuned = log.index("fused_tiling in")
    assert log.index(" rnn forward") < tuned < log.index("flurka-rnn forward", tuned)
    ffn_tuned = log.index("ffn_tiling in")          # the FFN's, at the first fused FFN point
    assert log.index("flurka-rnn forward", tuned) < ffn_tuned < log.index("] tiny-ffn", ffn_tuned)
    compress_tuned = log.index("compress_tiling in")   # at the first point with projections
    assert log.index("] tiny-ffn", ffn_tuned) < compress_tuned < log.index("] tiny-ffn",
                                                                           compress_tuned)


def test_shape_probes_count_each_products_flops():
    """2·M·K·N per product, batched ones once per batch: a K split by hand does the same work."""
    g = _driver()
    rows = g.shape_probes({"E_x [64,96]@[96,32]": ((64, 96), (96, 32)),
                           "E_x split-3 [3,64,32]@[3,32,32]": ((3, 64, 32), (3, 32, 32)),
                           "q f32 [2,16,8]@[2,8,4]": ((2, 16, 8), (2, 8, 4))}, repeats=2)
    assert [r["flops"] for r in rows] == [2 * 64 * 96 * 32] * 2 + [2 * 2 * 16 * 8 * 4]
    assert all(r["median_s"] > 0 and r["flops_per_s"] == r["flops"] / r["median_s"] for r in rows)
    split = {name: shapes for name, shapes in g.SHAPE_PROBES.items() if "split" in name}
    assert split
    for name, (sa, sb) in split.items():      # the GPU probe: the same product as its unsplit twin
        (whole_a, whole_b), = [v for k, v in g.SHAPE_PROBES.items()
                               if k.startswith(name.split(" split")[0] + " [")]
        assert sa[0] * sa[2] == whole_a[1] == sb[0] * sb[1]                  # K, split
        assert (sa[1], sb[2]) == (whole_a[0], whole_b[1])                   # M, N
    (stacked_a, stacked_b), = [v for k, v in g.SHAPE_PROBES.items() if "stacked" in k]
    (one_a, one_b), = [v for k, v in g.SHAPE_PROBES.items() if k.startswith("E_x flash padded")]
    assert stacked_a == (2 * one_a[0], one_a[1]) and stacked_b == one_b   # E1, E2 on X once


def test_failed_tuning_keeps_the_default_tiling_and_the_plan_going(tmp_path, monkeypatch):
    g = _driver()

    def no_candidate_runs(**_):
        raise RuntimeError("no forward tiling ran: out of shared memory")
    monkeypatch.setattr(g, "tune_fused", no_candidate_runs)
    assert g.main(["--out", str(tmp_path), "--tiny", "--check", "", "--repeats", "1",
                   "--warmup", "0", "--tune-fused"]) == 0
    tuning = json.loads((tmp_path / "fused_tuning.json").read_text())
    assert "out of shared memory" in tuning["error"] and "best" not in tuning
    tiny = json.loads((tmp_path / "tiny.json").read_text())
    assert [r["status"] for r in tiny["results"]] == ["ok"] * 3
    assert tiny["results"][-1]["tiling"] == tiny["settings"]["fused_tiling"] == \
        dataclasses.asdict(g.Tiling())


def test_run_sweep_stops_at_the_deadline(tmp_path):
    pts = points("tiny", mechanisms=["rnn"], modes=["forward"])
    out = tmp_path / "s.json"
    doc = run_sweep(pts, range(len(pts)), sweep="tiny", out=str(out), repeats=1, warmup=0,
                    with_ceilings=False, deadline=time.monotonic() - 1)
    assert doc["results"] == [] and doc["settings"]["stopped_at_deadline"] is True
    doc = run_sweep(pts, range(len(pts)), sweep="tiny", out=str(out), repeats=1, warmup=0,
                    with_ceilings=False, deadline=time.monotonic() + 600)
    assert len(doc["results"]) == len(pts) and "stopped_at_deadline" not in doc["settings"]


def test_lease_script_runs_the_driver_with_flags_it_knows(tmp_path):
    """benchmarks/gpu_lease.sh (one lease, one call): it starts the driver from the repository
    root with JAX alone on the path, and every flag it passes is one the driver's parser has."""
    import os
    import re
    import subprocess
    import sys

    script = (ROOT / "benchmarks" / "gpu_lease.sh").read_text()
    start = script.index('"$PYTHON" benchmarks/gpu_session.py')
    call = script[start:script.index("2>&1", start)]
    flags = set(re.findall(r"(--[a-z][a-z-]+)", call))
    assert {"--plan", "--tune-fused", "--profile-steps", "--check-fused", "--budget-s"} <= flags
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "lease")}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh"), "--help"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "jax" in done.stdout and "usage:" in done.stdout
    assert [f for f in flags if f not in done.stdout] == []
    assert "usage:" in (tmp_path / "lease" / "log.txt").read_text()


@pytest.mark.parametrize("card,mib,budget_gb", [("NVIDIA H100 80GB HBM3", 81559, 73),
                                               ("NVIDIA H200", 143771, 129)])
def test_lease_script_runs_what_is_owed_on_any_card(tmp_path, card, mib, budget_gb):
    """Without PLAN, any card runs what the targets owe, with 92 % of its memory as the budget;
    the card comes from nvidia-smi (faked here, with an interpreter that only echoes what it is
    asked to run)."""
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/bash\ncase "$*" in\n'
        f'  "--query-gpu=name --format=csv,noheader") echo "{card}" ;;\n'
        f'  *noheader,nounits*) echo {mib} ;;\n'
        f'  *) echo "{card}, {mib} MiB" ;;\nesac\n')
    (bin_dir / "echo-python").write_text('#!/bin/bash\necho "python $*"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHON": str(bin_dir / "echo-python"), "OUT": str(tmp_path / "lease")}
    env.pop("PLAN", None)
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "lease" / "log.txt").read_text()
    assert "--plan h100-second " in log and f"--memory-budget-gb {budget_gb}\n" in log, log


@pytest.mark.parametrize("failing", ["wide", "softmax"])
def test_a_failed_wide_stage_keeps_the_launches_tuned_before_it(monkeypatch, failing):
    """A wide stage that cannot run (its inputs out of memory, say) is recorded, and the tuning
    still comes back with the launches the stages before it chose (and after it, the softmax's)."""
    from flurka.speed import tuning
    g = _driver()
    build = {"wide": tuning.kernel_inputs, "softmax": tuning.softmax_inputs}[failing]

    def narrow_only(*args, **size):
        if size["head_dim"] > 128:
            raise MemoryError("RESOURCE_EXHAUSTED: wide inputs")
        return build(*args, **size)

    monkeypatch.setattr(tuning, {"wide": "kernel_inputs", "softmax": "softmax_inputs"}[failing],
                        narrow_only)
    result = tuning.tune_fused(**g.TINY_TUNING)
    assert "RESOURCE_EXHAUSTED" in result[f"{failing}_error"]
    stages = {"forward", "gradient", "wide", "softmax"} - {failing}
    assert {r["stage"] for r in result["rows"]} == stages

    def best(stage):
        return min((r for r in result["rows"] if r["stage"] == stage and r["status"] == "ok"),
                   key=lambda r: r["total_s"])["tiling"]

    def launches_but_softmax(tiling):
        return {k: v for k, v in tiling.items() if not k.startswith("softmax_")}

    if failing == "wide":   # the softmax stage still ran, on the one-block launches
        assert result["best"] == best("softmax")
        assert launches_but_softmax(result["best"]) == launches_but_softmax(best("gradient"))
    else:
        assert result["best"] == best("wide")


def test_tuning_rows_are_per_kernel(monkeypatch):
    """Each candidate is timed ``chain`` kernels a call; its row's time is one kernel's (the call's
    ÷ chain), for the query side, the FFN block and the compression alike."""
    from flurka.speed import tuning
    g = _driver()

    def calls_of_0_3_s(calls, *, warmup, repeats):
        return {key: {"status": "ok", "median_s": 0.3} for key in calls}

    monkeypatch.setattr(tuning, "time_interleaved", calls_of_0_3_s)
    fused = tuning.tune_fused(**{**g.TINY_TUNING, "chain": 3})
    assert fused["chain"] == 3 and len(fused["rows"]) >= 4
    for row in fused["rows"]:
        kernels = ("softmax",) if row["stage"] == "softmax" else ("favor", "elu")
        assert row["median_s"] == pytest.approx(dict.fromkeys(kernels, 0.1))
        assert row["total_s"] == pytest.approx(0.1 * len(kernels))
    for tune, tiny in ((tuning.tune_ffn, g.TINY_FFN_TUNING), (tuning.tune_compression, g.TINY_COMPRESS_TUNING)):
        result = tune(**{**tiny, "chain": 3})
        assert result["chain"] == 3 and [r["median_s"] for r in result["rows"]] == pytest.approx([0.1, 0.1])


def test_chained_products_compute_every_step_inside_the_loop():
    """The probes' chain: the call returns the last step's product — a with its first element
    set to chain - 1, times b (float64 here) — and the compiled loop's body holds the product
    (XLA did not hoist it out as loop-invariant), the entry none."""
    import re

    import jax.numpy as jnp
    import numpy as np

    from flurka.speed.ceilings import chained_products
    from flurka.hlo import parse
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s) for s in ((2, 24, 40), (2, 40, 16)))
    fn = chained_products(5)
    got = np.asarray(fn(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)))
    last = a.copy()
    last[0, 0, 0] = 4.0
    np.testing.assert_allclose(got, last @ b, rtol=1e-5, atol=1e-5)
    hlo = fn.lower(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)).compile().as_text()
    bodies = {name: [i.line for i in body] for name, body in parse(hlo).computations.items()}

    def calls_dot(name, seen=()):
        lines = bodies.get(name, [])
        return any(" dot(" in line for line in lines) or any(
            calls_dot(c, seen + (name,)) for line in lines
            for c in re.findall(r"(?:calls|to_apply|body)=%([\w.\-]+)", line) if c not in seen)
    (body,) = set(re.findall(r"body=%([\w.\-]+)", hlo))
    entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)
    assert calls_dot(body)
    assert not any(" dot(" in line or any(calls_dot(c) for c in re.findall(r"calls=%([\w.\-]+)", line))
                   for line in bodies[entry])


def test_the_card_check_takes_gradients_through_a_handed_over_layer_norm():
    """The on-card check's gradient error with the block's LayerNorm handed to a projected
    low-rank layer (its gradient kernels: the compression's, the projected query side's, x's
    through the LayerNorm — interpreted here) against the unfused layer after the LayerNorm on
    the CPU: float32 rounding apart, LayerNorm parameters included; a reference with other
    parameters is caught."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from flurka.attention import make_attention
    g = _driver()
    sizes = dict(d_model=128, num_heads=2, max_len=96, d_k=24)
    fused = make_attention("flurka-rnn", fused=True, fused_projections=True, **sizes,
                           rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 96, 128), jnp.float32)
    mask = jnp.arange(96)[None, :] < jnp.array([[96], [70]])
    cpu, norm = jax.devices("cpu")[0], g._layer_norm(128)
    plain = make_attention("flurka-rnn", **sizes, rngs=nnx.Rngs(0))
    assert 0.0 < g._grad_error(fused, plain, x, mask, "float32", cpu, norm) < 1e-5
    other = make_attention("flurka-rnn", **sizes, rngs=nnx.Rngs(1))   # another layer: caught
    assert g._grad_error(fused, other, x, mask, "float32", cpu, norm) > 0.1
