"""The sweep end to end on an embedded local Ray: MLflow runs, results DB rows, tables."""

from __future__ import annotations

import sqlalchemy as sa
import pytest

from flurka.sweeps.runner import run_sweep, summary
from flurka.sweeps.spec import SweepSpec


@pytest.mark.slow
def test_local_sweep_end_to_end(tmp_path, tiny_overrides, mlflow_runs, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)     # the default layout, as `make sweep` has it
    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.25, 0.5), steps=8,
                     overrides=tiny_overrides, baselines=False, run_dir=str(tmp_path / "run"), num_cpus=2,
                     name="tiny")
    out = run_sweep(spec)
    assert not out.failed and not out.stopped
    # base run (Linformer, stops after its last fork at step 4) + 2 branches
    assert len(out.results) == 3
    assert out.compute["uptrain_steps_executed"] == 4 + 6 + 4 and out.compute["uptrain_steps_independent"] == 16
    assert all(r["compilation"]["compiles"] > 0 for r in out.results.values())
    assert any((out.run_dir / "jax-cache").iterdir())          # the trials' shared compilation cache

    client, runs = mlflow_runs(out.mlflow_uri, "tiny")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == out.parent_run_id]
    assert len(parents) == 1 and len(nested) == 3 and len(runs) == 4
    branch = next(r for r in nested if "a0.25" in r.info.run_name)
    assert branch.info.status == "FINISHED"
    assert branch.data.params["config.attention"] == "flurka-rnn" and branch.data.params["config.alpha"] == "0.25"
    assert "git_commit" in branch.data.params and "version.jax" in branch.data.params
    steps = [m.step for m in client.get_metric_history(branch.info.run_id, "loss")]
    assert steps == sorted(set(steps)) and steps[-1] == 8       # each step once
    assert {a.path for a in client.list_artifacts(branch.info.run_id)} >= {"result.json", "config.json", "curves.csv"}
    tables = {a.path for a in client.list_artifacts(out.parent_run_id, "tables")}
    assert "tables/uptraining_lra-listops-small.csv" in tables
    assert parents[0].data.metrics["uptrain_compute_ratio"] == pytest.approx(14 / 16)

    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT attention, alpha FROM trials ORDER BY alpha")).all()
    assert [(a, al) for a, al in rows] == [("flurka-rnn", 0.25), ("flurka-rnn", 0.5)]
    assert "25%" in summary(out) and str(out.run_dir) in summary(out)
