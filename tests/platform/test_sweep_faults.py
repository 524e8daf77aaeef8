"""Faults: a trial process SIGKILLed mid-run is retried by Tune and resumes from its own last
checkpoint; the result equals an uninterrupted run and MLflow / the results DB hold it once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from flurka.sweeps.spec import SweepSpec

KILL_AT = 10          # the branch runs steps 4..16, logs every 2, checkpoints every 4


def _killing_callback(kills: dict, reports: list):
    """The sweep's MLflow callback plus, in the driver, a SIGKILL of the branch trial's worker
    process (pid from Tune's result) the first time it reports step ``KILL_AT``. A function
    trainable waits inside ``tune.report`` until the driver asks for the next result, so the
    kill lands while the worker sits at that report — no race with its next checkpoint."""
    from flurka.tracking import callback as cb

    class Killing(cb.MLflowTrialCallback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            super().on_trial_result(iteration, trials, trial, result, **info)
            run = self.resolve(trial.config)["run"]
            if result.get("stream") != "train":
                return
            reports.append((run["key"], int(result["step"]), int(result["pid"])))
            if run["kind"] == "branch" and int(result["step"]) == KILL_AT and not kills:
                ckpts = Path(self.resolve(trial.config)["train"]["workdir"]) / "checkpoints"
                kills["checkpoints"] = sorted(int(p.name) for p in Path(ckpts).iterdir() if p.name.isdigit())
                kills["pid"] = int(result["pid"])
                os.kill(kills["pid"], signal.SIGKILL)

        def on_trial_recover(self, iteration, trials, trial, **info):
            kills.setdefault("recovered", []).append(self.resolve(trial.config)["run"]["key"])

    return Killing


@pytest.mark.slow
def test_killed_trial_is_retried_from_its_checkpoint(tmp_path, tiny_overrides, mlflow_runs, monkeypatch):
    from flurka import training
    from flurka.sweeps import runner
    from flurka.sweeps.runner import run_sweep
    from flurka.sweeps.branching import make_plan
    from flurka.sweeps.spec import validate
    from flurka.sweeps.trainable import build_config, train_overrides

    kills: dict = {}
    reports: list = []
    monkeypatch.setattr(runner, "MLflowTrialCallback", _killing_callback(kills, reports))
    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.25,), steps=16,
                     overrides=tiny_overrides, baselines=False, checkpoint_every=4, max_failures=2,
                     run_dir=str(tmp_path / "run"), num_cpus=1, name="faults")
    out = run_sweep(spec)

    assert not out.failed and len(out.results) == 2
    (branch_key,) = [k for k in out.results if k.startswith("branch/")]
    assert kills["recovered"] == [branch_key]                 # Tune retried exactly that trial
    assert kills["checkpoints"][-1] == 8                       # its last checkpoint before the kill
    branch = [(step, pid) for key, step, pid in reports if key == branch_key]
    first_try = [s for s, pid in branch if pid == kills["pid"]]
    retry = [s for s, pid in branch if pid != kills["pid"]]
    assert first_try == [6, 8, 10]
    assert retry == [10, 12, 14, 16]                           # resumed at 8: steps 5..8 not re-run

    # Bit for bit the uninterrupted branch (same fork from the sweep's own base checkpoint).
    got = out.results[branch_key]
    (planned,) = make_plan(validate(spec)).branches
    overrides = train_overrides(planned, spec.overrides, run_dir=str(out.run_dir), steps=spec.steps,
                                checkpoint_every=spec.checkpoint_every)
    _, cfg = build_config({"run": planned.to_dict(), "train": overrides})
    want = training.run(cfg.replace(workdir=str(tmp_path / "uninterrupted"), checkpoint_every=0))
    assert [h["step"] for h in got["history"]] == [h["step"] for h in want["history"]] == list(range(2, 17, 2))
    np.testing.assert_allclose([h["loss"] for h in got["history"]], [h["loss"] for h in want["history"]],
                               rtol=1e-6, atol=0)
    assert got["final_metrics"] == pytest.approx(want["final_metrics"], rel=1e-6)
    # The retry loaded the killed attempt's programs from the sweep's cache; it compiled only what
    # that attempt never reached (the final evaluation's: 2 of 43 programs when written).
    compiled = got["compilation"]
    assert compiled["compiles"] > 0 and compiled["cache_hits"] >= 0.8 * compiled["compiles"]

    # MLflow: one nested run per planned trial, each loss step once; DB: the branch once.
    client, runs = mlflow_runs(out.mlflow_uri, "faults")
    nested = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.tags["flurka.trial_key"] for r in nested) == sorted(out.results) and len(runs) == 3
    run = next(r for r in nested if r.data.tags["flurka.trial_key"] == branch_key)
    assert run.info.run_name == "flurka-rnn a=0.25 dk=16 s0"
    assert run.info.status == "FINISHED"
    assert run.data.metrics["compilation.cache_hits"] == got["compilation"]["cache_hits"]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert steps == [6, 8, 10, 12, 14, 16]
    with sa.create_engine(out.results_url).connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM trials")).scalar() == 1



@pytest.mark.slow
def test_a_base_that_cannot_be_forked_skips_its_branches(tmp_path, tiny_overrides, mlflow_runs):
    """Issue 40: a baseline doubling as the base that diverges before the fork step does not
    launch its branch (which would fail on a missing checkpoint); the branch is recorded as
    skipped, with the base's reason, in MLflow and in the results DB beside the baselines."""
    from flurka.sweeps.runner import run_sweep, summary

    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.5,),
                     steps=8, overrides={**tiny_overrides, "learning_rate": 1e9}, full=False,
                     control=False, run_dir=str(tmp_path / "run"), num_cpus=2, name="unforkable")
    out = run_sweep(spec)

    (branch,) = out.skipped
    assert branch.startswith("branch/") and branch not in out.results
    base = "baseline/lra-listops-small/linformer/s0/T8/dk16"
    assert out.results[base]["status"].startswith("diverged at step")
    assert out.skipped[branch] == f"base {base} {out.results[base]['status']}"
    assert "1 skipped (their base cannot be forked: base " in summary(out)

    _, runs = mlflow_runs(out.mlflow_uri, "unforkable")
    (skipped,) = [r for r in runs if r.data.tags.get("flurka.trial_key") == branch]
    assert skipped.info.status == "KILLED"
    assert skipped.data.tags["flurka.status"] == f"skipped: {out.skipped[branch]}"

    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text("select trial_key, status from trials")).all())
    engine.dispose()
    assert rows[branch] == f"skipped: {out.skipped[branch]}"
    assert rows[base].startswith("diverged at step") and len(rows) == 3
