"""The dry run's prediction (issue 57 item 4, :mod:`flurka.sweeps.forecast`): a planned trial's
FLOPs are the ``train_flops`` a real run of it reports, its time is FLOPs / the rate on record,
and without records the dry run says so in one line and starts nothing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from flurka.configs import get_config
from flurka.data import SMALL_DATASETS
from flurka.sweeps import forecast
from flurka.sweeps.branching import independent_equivalent, make_plan
from flurka.sweeps.spec import SweepSpec, validate
from flurka.training import flops as flops_lib

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(warmup_steps=0, eval_every=0, log_every=1, batch_size=4, eval_batches=1, bleu_batches=1, prefetch=0,
            model=dict(d_model=16, d_ff=16, num_layers=1, num_decoder_layers=1, num_heads=2,
                       attention_options={"num_features": 8}))


def _sweep(tmp_path, **kw) -> SweepSpec:
    return validate(SweepSpec(**{**dict(benchmarks=("nmt-list-small",), variants=("flurka-performer",),
                                        alphas=(0.5,), d_k=(8,), seeds=(0,), steps=4, overrides=TINY, full=False,
                                        control=False, run_dir=str(tmp_path / "runs")), **kw}))


def _runner_config(run, sweep, tmp_path):
    """The config the runner gives the trial (trainable.train_overrides), no checkpoints."""
    from flurka.sweeps.trainable import train_overrides

    o = train_overrides(run, sweep.config_overrides, run_dir=str(tmp_path / "runs"), steps=sweep.steps,
                        checkpoint_every=sweep.checkpoint_every)
    return get_config(run.benchmark, **o)


def test_a_trials_predicted_flops_are_what_a_real_run_of_it_reports(tmp_path):
    """An up-training trial of 4 steps (2 on the base, 1 hand-over, 1 on the variant) trained for
    real: its train_flops equal the prediction exactly, and the branch forked at step 2 is predicted
    at the steps after the fork. The forecast's config is the runner's for every planned trial."""
    from flurka.training.loop import train

    sweep = _sweep(tmp_path)
    plan = make_plan(sweep)
    ignore = dict(workdir=None, checkpoint_every=0, checkpoint_steps=(), keep_checkpoints=None, base_checkpoint=None)
    for run in plan.baselines + plan.bases + plan.branches:
        assert forecast.trial_config(run, sweep).replace(**ignore) == _runner_config(run, sweep, tmp_path).replace(**ignore)
    (branch,) = plan.branches
    assert branch.base_key is not None and branch.start_step == 2
    whole = independent_equivalent(branch)
    config = _runner_config(whole, sweep, tmp_path).replace(workdir=None)
    layout = forecast.batch_layout(config)
    result = train(config, progress=False, mesh=None)
    assert [s["step"] for s in result["switches"]] == [2]
    assert forecast.trial_flops(whole, config, *layout) == result["train_flops"]
    at_fork = next(h["train_flops"] for h in result["history"] if h["step"] == 2)
    predicted = forecast.plan_flops(sweep, plan)
    assert predicted[branch.key] == result["train_flops"] - at_fork
    base = next(r for r in plan.baselines if r.key == branch.base_key)
    assert predicted[base.key] == 4 * at_fork // 2     # 4 plain Linformer steps, each what the base's first ones cost


def test_paper_layouts_are_the_real_loaders_batches():
    """The paper-scale sets are laid out from their configs; the input-pipeline benchmark built
    each through its real loader (stand-in sources) and recorded a step's FLOPs: they agree."""
    record = json.loads((ROOT / "benchmarks/results/cpu/2026-12-07-input-pipeline/input-pipeline.json").read_text())
    checked = 0
    for r in record["results"]:
        config = get_config(r["benchmark"])
        if config.dataset in SMALL_DATASETS:
            continue
        info, shapes = forecast.batch_layout(config)
        if config.task in ("translation", "mlm"):   # the stand-in text trains a smaller vocabulary than 32k
            assert info.vocab_size == 32_000
            info = dataclasses.replace(info, vocab_size=r["vocab_size"],
                                       target_vocab_size=r["vocab_size"] if config.task == "translation" else 0)
        floor = r["step_floor"]
        assert flops_lib.train_step_flops(config, info, shapes, attention="full") == floor["full_train_flops"]
        assert flops_lib.train_step_flops(config, info, shapes, attention=floor["mechanism"]) == floor["train_flops"]
        checked += 1
    assert checked >= 18


def _record(name: str, *results, ceiling: float = 1e15) -> dict:
    return {"schema": forecast.SPEED_SCHEMA, "created": "2026-12-07T00:00:00+00:00",
            "device": {"name": name, "platform": "gpu"},
            "ceilings": {"bfloat16": {"matmul_flops_per_s": ceiling}}, "results": list(results)}


def _step(mechanism: str, d_model: int, flops: int, median_s: float, dtype: str = "float32", **kw) -> dict:
    return {"status": "ok", "mode": "train", "scope": "model", "dtype": dtype, "mechanism": mechanism,
            "d_model": d_model, "seq_len": 1024, "batch": 1, "layers": 2, "flops": flops, "median_s": median_s, **kw}


def test_the_time_is_the_flops_over_the_rate_on_record(tmp_path):
    """A card whose nearest float32 training step ran 3e12 FLOPs in 20 ms: each trial's time is
    its FLOPs / 1.5e14 FLOP/s; softmax steps, other dtypes and farther sizes do not count."""
    sweep = _sweep(tmp_path, steps=400, overrides={})
    plan = make_plan(sweep)
    rates = tmp_path / "rates"
    rates.mkdir()
    (rates / "a.json").write_text(json.dumps(_record(
        "Test GPU Z9", _step("flurka-rnn", 64, 3_000_000_000_000, 0.02),
        _step("full", 64, 9_000_000_000_000, 0.001), _step("rnn", 64, 1, 1e-9, dtype="bfloat16"),
        _step("rnn", 2048, 1, 1e-9))))
    docs, _ = forecast.load_records(rates)
    (rate,) = forecast.card_rates(docs, d_model=64, dtype="float32")
    assert rate.flops_per_s == 3_000_000_000_000 / 0.02 and rate.ceiling == 1e15
    flops = forecast.plan_flops(sweep, plan)
    runs = plan.baselines + plan.bases + plan.branches
    for run in runs:
        assert rate.seconds(flops[run.key]) == (flops[run.key] / (3_000_000_000_000 / 0.02), True)
    text = "\n".join(forecast.forecast_lines(sweep, plan, step_times=rates, gpus=1))
    gpu_s = sum(flops[r.key] / rate.flops_per_s for r in runs)
    assert f"Z9 (Test GPU Z9): ≈ {forecast._hours(gpu_s).replace(' h', ' GPU-h')}, ≈ {forecast._hours(gpu_s)} wall on 1 card;" in text
    assert "Z9 at 150.0 TFLOP/s: the median of the float32 training steps of flurka-rnn on record" in text
    assert forecast.NO_RECORDS not in text


def test_without_records_the_dry_run_says_so_in_one_line_and_starts_nothing(tmp_path):
    """No step times (an empty --step-times folder; an installed wheel has no benchmarks/results/):
    one line says so, the FLOPs are printed, exit 0; no Ray imported, no run dir, no file."""
    empty = tmp_path / "none"
    empty.mkdir()
    code = ("import sys; from flurka.sweeps import cli, spec; p = spec.ArgumentParser(prog='flurka sweep'); "
            "cli.add_arguments(p); rc = cli.run(p.parse_args(sys.argv[1:])); print('ray imported:', 'ray' in sys.modules); "
            "sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "--config", "paper-uptrain", "--dry-run", "--step-times",
                           str(empty), "--run-dir", str(tmp_path / "runs")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line for line in lines if forecast.NO_RECORDS in line] == [f"{forecast.NO_RECORDS} ({empty} holds none): FLOPs only"]
    assert "in all: 78 trials, 5952000 training steps over 3 seed(s)" in lines
    assert any(line.startswith("in all: ") and "training FLOPs" in line for line in lines)
    assert "GPU-h" not in proc.stdout and lines[-1] == "ray imported: False"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["none"] and not any(empty.iterdir())
