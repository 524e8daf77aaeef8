"""Speed and theory documents reach MLflow (issue 41): ``flurka ingest`` gives each its own run,
with the card in the tags, the document as an artifact and its rows as tables, beside the
sweeps in the run dir's store; a second ingest adds nothing. Recorded documents, real store."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient

from testsupport import flurka

ROOT = Path(__file__).resolve().parents[2]
SPEED = ROOT / "benchmarks/results/cpu/2026-12-02-speed/layers.json"
THEORY = ROOT / "benchmarks/results/cpu/2026-11-26-theory-random/theory_random_n2048.json"


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    MlflowClient(f"sqlite:///{run / 'mlflow.db'}").create_experiment("a sweep")   # the sweep's store
    return run


def test_ingest_logs_each_document_as_a_run_beside_the_sweeps(tmp_path):
    run = _run_dir(tmp_path)
    code, out, err = flurka(["ingest", "--db", str(run / "results.db"), str(SPEED), str(THEORY)], tmp_path)
    assert code == 0, err
    assert out.count("MLflow run") == 2 and out.count("(logged)") == 2
    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    runs = {}
    for name in ("flurka-speed", "flurka-theory"):
        (one,) = client.search_runs([client.get_experiment_by_name(name).experiment_id])
        runs[name] = one
    speed = runs["flurka-speed"]
    assert client.get_experiment_by_name("flurka-speed").tags["mlflow.experimentKind"] == "custom_model_development"
    assert speed.data.tags["mlflow.source.name"] == "flurka ingest" and speed.data.tags["mlflow.user"]
    assert speed.info.run_name == "layers (cpu)" and speed.data.tags["flurka.device"] == "cpu"
    assert speed.data.tags["flurka.schema"] == json.loads(SPEED.read_text())["schema"]
    assert speed.data.params["version.jax"] == json.loads(SPEED.read_text())["versions"]["jax"]
    paths = {a.path for a in client.list_artifacts(speed.info.run_id, "tables")}
    assert paths == {"tables/results.csv", "tables/results.json"}
    # its artifacts beside the store, as a sweep's, not in ./mlruns of the command's directory
    assert speed.info.artifact_uri.startswith((run / "mlartifacts").resolve().as_uri() + "/")
    assert (run / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()
    local = client.download_artifacts(speed.info.run_id, "document.json", str(tmp_path / "dl"))
    assert Path(local).read_text() == SPEED.read_text()
    logged = json.loads(speed.data.tags["mlflow.loggedArtifacts"])
    assert {"path": "tables/results.json", "type": "table"} in logged     # opens in the table viewer
    theory = {a.path for a in client.list_artifacts(runs["flurka-theory"].info.run_id, "tables")}
    assert {"tables/approximation_errors.csv", "tables/ranks.csv"} <= theory
    # again: nothing new, in the DB or in MLflow
    code, out, _ = flurka(["ingest", "--db", str(run / "results.db"), str(SPEED), str(THEORY)], tmp_path)
    assert code == 0 and out.count("(already there)") == 2
    assert all(len(client.search_runs([client.get_experiment_by_name(n).experiment_id])) == 1 for n in runs)


def test_ingest_without_a_store_beside_the_db_or_with_none_logs_nothing(tmp_path):
    run = _run_dir(tmp_path)
    code, out, err = flurka(["ingest", "--db", str(run / "results.db"), "--mlflow-uri", "none", str(SPEED)],
                            tmp_path)
    assert code == 0 and "MLflow" not in out, err
    assert MlflowClient(f"sqlite:///{run / 'mlflow.db'}").get_experiment_by_name("flurka-speed") is None
    code, out, err = flurka(["ingest", "--db", str(tmp_path / "elsewhere.db"), str(SPEED)], tmp_path)
    assert code == 0 and "MLflow" not in out, err
    assert not (tmp_path / "mlflow.db").exists()
