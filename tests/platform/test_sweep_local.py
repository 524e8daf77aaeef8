"""The sweep end to end on an embedded local Ray: MLflow runs, results DB rows, tables."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pandas as pd
import sqlalchemy as sa
import pytest

from flurka.sweeps.runner import run_sweep, summary
from flurka.sweeps.spec import SweepSpec
from flurka.sweeps.system_metrics import PREFIX


def check_placement(out, client, branch) -> None:
    """What a finished sweep ``out`` records of where its trials ran: each result's placement, the
    results DB's trial rows and environment, the sweep record, and ``branch``'s MLflow run's
    system metrics and node tag (issue 58)."""
    host = socket.gethostname()
    for key, r in out.results.items():   # the base run too: its result says where it ran
        p = r["placement"]
        assert (p["node"], p["device"], p["platform"], p["device_count"]) == (host, "cpu", "cpu", 1), key
        assert p["peak_host_bytes"] > 0 and p["peak_device_bytes"] is None and p["node_id"], key
    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT node, device, device_count, peak_host_bytes, peak_device_bytes "
                                    "FROM trials")).all()
        env_host = conn.execute(sa.text("SELECT host FROM environments")).scalar_one()
    engine.dispose()
    assert rows and all(r.node == host and r.device == "cpu" and r.device_count == 1 and r.peak_host_bytes > 0
                        and r.peak_device_bytes is None for r in rows), rows
    assert env_host == host                               # the trials' node(s), not merely the driver's
    record = json.loads((out.run_dir / "sweep-record.json").read_text())
    assert all(t["node"] == host and t["peak_host_bytes"] > 0 for t in record["trials"])
    system = {k for k in branch.data.metrics if k.startswith(PREFIX)}
    assert {"system/cpu_percent", "system/host_rss_bytes", "system/peak_host_bytes"} <= system
    history = client.get_metric_history(branch.info.run_id, "system/host_rss_bytes")
    assert len(history) >= 2 and all(m.value > 0 for m in history)
    assert branch.data.tags["node"] == host and branch.data.tags["device"]


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
    # one-CPU trials pinned to a core each (None only where another sweep on this machine held them)
    assert all(r["cores"] is None or len(r["cores"]) == 1 for r in out.results.values())
    assert any((out.run_dir / "jax-cache").iterdir())          # the trials' shared compilation cache
    assert not (out.run_dir / "ray-session.json").exists()     # recorded while Ray ran, gone after

    client, runs = mlflow_runs(out.mlflow_uri, "tiny")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == out.parent_run_id]
    assert len(parents) == 1 and len(nested) == 3 and len(runs) == 4
    # named by what differs (one benchmark: not in the name), identified by the planned run's key
    assert sorted(r.info.run_name for r in nested) == [
        "flurka-rnn a=0.25 dk=16 s0", "flurka-rnn a=0.5 dk=16 s0", "linformer dk=16 s0 base"]
    assert sorted(r.data.tags["flurka.trial_key"] for r in nested) == sorted(out.results)
    branch = next(r for r in nested if r.info.run_name == "flurka-rnn a=0.25 dk=16 s0")
    assert branch.info.status == "FINISHED"
    # MLflow's own fields: a model-training experiment, the run's source and user
    assert client.get_experiment(branch.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert branch.data.tags["mlflow.source.name"] == "flurka sweep" and branch.data.tags["mlflow.user"]
    # every trial's data set is its MLflow input, the same digest for every seed of the benchmark
    inputs = [client.get_run(r.info.run_id).inputs.dataset_inputs for r in nested]
    assert all(len(i) == 1 for i in inputs) and {i[0].dataset.name for i in inputs} == {"lra-listops-small"}
    assert len({i[0].dataset.digest for i in inputs}) == 1
    # one name per metric (not accuracy, eval_accuracy and final.accuracy); final = the last eval point
    names = set(branch.data.metrics)
    assert {"train/loss", "train/accuracy", "train/tflop", "eval/loss", "eval/accuracy"} <= names
    assert all(k.startswith(("train/", "eval/", "system/", "compilation.")) for k in names), names
    final = out.results[branch.data.tags["flurka.trial_key"]]["final_metrics"]
    assert branch.data.metrics["eval/accuracy"] == pytest.approx(final["accuracy"], rel=1e-4)   # 5 digits shown
    # each configuration its own colour in MLflow's charts
    assert len({r.data.tags["mlflow.runColor"] for r in nested}) == 3
    assert branch.data.params["config.model.attention"] == "flurka-rnn" and branch.data.params["config.alpha"] == "0.25"
    assert "git_commit" in branch.data.params and "version.jax" in branch.data.params
    steps = [m.step for m in client.get_metric_history(branch.info.run_id, "train/loss")]
    assert steps == sorted(set(steps)) and steps[-1] == 8       # each step once
    assert {a.path for a in client.list_artifacts(branch.info.run_id)} >= {"result.json", "config.json", "curves.csv"}
    tables = {a.path for a in client.list_artifacts(out.parent_run_id, "tables")}
    assert {"tables/uptraining_lra-listops-small.csv", "tables/uptraining_lra-listops-small.json"} <= tables
    for path in (p for p in tables if p.endswith(".json")):       # columns MLflow's table viewer shows
        local = client.download_artifacts(out.parent_run_id, path, str(tmp_path / "dl"))
        assert not [c for c in json.loads(Path(local).read_text())["columns"] if "." in c], path
    assert parents[0].data.metrics["uptrain_compute_ratio"] == pytest.approx(14 / 16)
    check_placement(out, client, client.get_run(branch.info.run_id))   # where each trial ran (issue 58)
    # the best trial's model (the branch with the best final accuracy), logged on its run and
    # named on the parent, loads back
    import mlflow

    from flurka.training import load_run

    branches = {r.data.tags["flurka.trial_key"]: r for r in nested if "a=" in r.info.run_name}
    accuracy = {k: out.results[k]["final_metrics"]["accuracy"] for k in branches}
    uri = parents[0].data.tags["flurka.model.lra-listops-small"]
    best_key = next(k for k, r in branches.items() if uri == f"runs:/{r.info.run_id}/model")
    assert accuracy[best_key] == max(accuracy.values())
    loaded = load_run(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "model"),
                                                          tracking_uri=out.mlflow_uri))
    assert loaded.step == 8 and loaded.attention == "flurka-rnn"
    assert loaded.config.alpha == out.results[best_key]["config"]["alpha"]

    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT attention, alpha FROM trials ORDER BY alpha")).all()
    assert [(a, al) for a, al in rows] == [("flurka-rnn", 0.25), ("flurka-rnn", 0.5)]
    assert "25%" in summary(out) and str(out.run_dir) in summary(out)
    # the main job's time split: each trial's own (the base stopped after its fork too), the driver's
    for key, r in out.results.items():
        assert {"data", "setup", "train_steps", "checkpoints", "report"} <= set(r["time_split"]), key
        assert any(k.startswith("compile/") for k in r["time_split"]), key
    split = out.time_split
    assert split["trials"] == 3 and 0 < split["train_steps_share"] < 1
    assert split["driver"]["ray_start"] > 0 and 0 < split["driver"]["mlflow"] < split["driver"]["wall"]
    assert parents[0].data.metrics["time/train_steps_share"] == pytest.approx(split["train_steps_share"], rel=1e-4)
    assert "Time split" in summary(out, verbose=True) and "driver: ray_start" in summary(out, verbose=True)


@pytest.mark.slow
def test_a_base_and_alpha_per_variant_are_honoured_end_to_end(tmp_path, tiny_overrides):
    """The paper's appendix as a sweep: flurka-rnn up-trained from its kernel constituent (rnn) at
    its own α, flurka-performer from Linformer at another; each branch starts from its own base's
    checkpoint, is recorded with its base, and Table 5 names each row's base. (The tests' shared
    compilation cache: the default layout is test_local_sweep_end_to_end's.)"""
    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-performer", "flurka-rnn"),
                     base={"flurka-rnn": "kernel"}, alphas={"flurka-performer": (0.25,), "flurka-rnn": (0.5,)},
                     steps=8, overrides=tiny_overrides, baselines=False, run_dir=str(tmp_path / "run"), num_cpus=2,
                     name="per-variant")
    out = run_sweep(spec)
    assert not out.failed and not out.stopped
    bases = {k.split("/")[2]: r for k, r in out.results.items() if k.startswith("base/")}
    branches = {r["attention"]: r for k, r in out.results.items() if k.startswith("branch/")}
    assert set(bases) == {"linformer", "rnn"} and set(branches) == {"flurka-performer", "flurka-rnn"}
    for variant, base, alpha in (("flurka-performer", "low-rank", 0.25), ("flurka-rnn", "kernel", 0.5)):
        r = branches[variant]
        assert (r["config"]["base"], r["config"]["alpha"]) == (base, alpha)
        assert r["switches"][0]["step"] == round(alpha * 8)
    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = set(conn.execute(sa.text("SELECT attention, base, alpha FROM trials WHERE alpha > 0")))
    engine.dispose()
    assert rows == {("flurka-performer", "low-rank", 0.25), ("flurka-rnn", "kernel", 0.5)}
    table = out.tables["uptraining_lra-listops-small"]
    assert list(table.index) == [("flurka-performer", "low-rank", 16), ("flurka-rnn", "kernel", 16)]
    assert list(out.tables["observations_lra-listops-small"].index) == list(table.index)
    assert "| flurka-rnn       | kernel   |" in summary(out)
    # the sweep's results as a file beside its stores: another database that ingests it prints the same table
    from flurka.results import ingest_file, open_results, quality_tables

    other = open_results(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        assert ingest_file(other, out.run_dir / "sweep-record.json").added == 2
        again = quality_tables.uptraining_table(other, benchmark="lra-listops-small", metric="accuracy")
    finally:
        other.dispose()
    pd.testing.assert_frame_equal(again, table)
