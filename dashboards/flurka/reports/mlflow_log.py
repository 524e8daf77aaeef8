"""Logging a written report to MLflow: the sweep's parent run, a given run, or a new run.

The sweep's parent run is the one ``flurka.tracking.SweepTracker`` made: tagged with the sweep id
and not nested. Writes go through an ``MlflowClient`` for ``tracking_uri`` (no global MLflow state).
"""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from flurka.tracking.mlflow_runs import PARENT_TAG, SWEEP_TAG

ARTIFACT_PATH = "report"


def find_sweep_run(client: MlflowClient, experiment: str, sweep_id: str) -> str:
    """The run id of sweep ``sweep_id``'s parent run in ``experiment`` (ValueError if none)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"no MLflow experiment {experiment!r}")
    runs = [r for r in client.search_runs([exp.experiment_id], filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_id}'")
            if PARENT_TAG not in r.data.tags]
    if not runs:
        raise ValueError(f"no parent run of sweep {sweep_id!r} in MLflow experiment {experiment!r}")
    return runs[0].info.run_id


def log_report(out_dir: str | Path, *, tracking_uri: str, run_id: str | None = None, experiment: str | None = None,
               sweep_id: str | None = None, artifact_path: str = ARTIFACT_PATH) -> str:
    """Upload the report directory as artifacts under ``artifact_path``; returns the run id.

    Target: ``run_id``; else the parent run of ``sweep_id`` in ``experiment``; else a new run named
    "report" in ``experiment`` (created if missing).
    """
    out = Path(out_dir)
    if not (out / "index.html").is_file():
        raise ValueError(f"{out} holds no report (index.html): build it first")
    if run_id is None and experiment is None:
        raise ValueError("log_report needs run_id, or experiment (with sweep_id for the sweep's run)")
    client = MlflowClient(tracking_uri=tracking_uri)
    if run_id is None and sweep_id is not None:
        run_id = find_sweep_run(client, experiment, sweep_id)
    elif run_id is None:
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
        run = client.create_run(exp_id, run_name="report", tags={"flurka.kind": "report"})
        run_id = run.info.run_id
        client.set_terminated(run_id)
    client.log_artifacts(run_id, str(out), artifact_path)
    return run_id
