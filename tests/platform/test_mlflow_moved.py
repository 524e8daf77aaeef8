"""A run dir moved or copied elsewhere still opens (issue 41): MLflow stores absolute artifact
URIs, and ``relocate_artifacts`` points a SQLite store's at the run dir's own ``mlartifacts``
(what ``flurka ui`` and a sweep's ``--resume`` do on opening it). Real MLflow store and client."""

from __future__ import annotations

import shutil

import mlflow
import pytest
from mlflow import MlflowClient

from flurka.tracking.mlflow_runs import SweepTracker, artifact_root_for
from flurka.tracking.store import relocate_artifacts


def _sweep_store(run_dir):
    uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    tracker = SweepTracker(uri, "moved", "s1", artifact_root=artifact_root_for(uri, run_dir))
    parent = tracker.start_sweep("s1", {"steps": 8})
    tracker.client.log_text(parent, "the table", "tables/t.csv")
    return parent


def _read(run_dir, run_id, dst):
    uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    path = mlflow.artifacts.download_artifacts(f"runs:/{run_id}/tables/t.csv", dst_path=str(dst),
                                               tracking_uri=uri)
    return open(path).read(), MlflowClient(uri).get_run(run_id).info.artifact_uri


def test_a_moved_run_dir_reads_its_own_artifacts(tmp_path):
    first, moved = tmp_path / "first", tmp_path / "elsewhere" / "run"
    first.mkdir()
    parent = _sweep_store(first)
    moved.parent.mkdir()
    shutil.move(first, moved)
    with pytest.raises(Exception):                          # what MLflow does unaided
        _read(moved, parent, tmp_path / "dl0")
    line = relocate_artifacts(moved / "mlflow.db")
    assert line == (f"{moved} was moved or copied: its MLflow artifacts are now {moved / 'mlartifacts'} "
                    f"(were {first / 'mlartifacts'})")
    text, root = _read(moved, parent, tmp_path / "dl1")
    assert text == "the table" and root.startswith((moved / "mlartifacts").as_uri() + "/")
    assert relocate_artifacts(moved / "mlflow.db") is None   # once


def test_a_copy_stops_pointing_at_the_original(tmp_path):
    first, copy = tmp_path / "first", tmp_path / "copy"
    first.mkdir()
    parent = _sweep_store(first)
    shutil.copytree(first, copy)
    assert relocate_artifacts(first / "mlflow.db") is None   # the original is where it was
    assert relocate_artifacts(copy / "mlflow.db") is not None
    shutil.rmtree(first / "mlartifacts")
    assert _read(copy, parent, tmp_path / "dl")[0] == "the table"
