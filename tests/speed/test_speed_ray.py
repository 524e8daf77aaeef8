"""The Ray speed sweep: two tiny points as Ray tasks on a private local Ray (CPU, no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flurka.results.records import speed_records_from_document

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("interleave", [False, True], ids=["per-point", "interleaved"])
def test_ray_sweep_runs_points_as_tasks(tmp_path, interleave):
    """Per point: two tasks, each sample sized to the step; --interleave: one task timing both
    mechanisms side by side, three calls a sample as asked."""
    out = tmp_path / "ray_tiny.json"
    proc = subprocess.run(
        [sys.executable, "experiments/speed_sweep.py", "--sweep", "tiny", "--cpu",
         "--num-cpus", "2", "--mechanisms", "rnn,flurka-rnn", "--modes", "forward",
         "--scope", "layer", "--repeats", "2", "--warmup", "1", "--out", str(out)]
        + ["--interleave", "--calls-per-sample", "3"] * interleave
        + ["--mlflow-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"] * interleave,
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if interleave:   # the document as its own MLflow run, the card in its tags
        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
        (run,) = client.search_runs([client.get_experiment_by_name("flurka-speed").experiment_id])
        assert run.data.tags["flurka.device"] == "cpu" and run.data.tags["flurka.sweep"] == "tiny"
        assert f"MLflow run {run.info.run_id}" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["settings"]["runner"] == "ray" and doc["device"]["platform"] == "cpu"
    assert doc["settings"].get("interleaved", False) is interleave
    assert doc["settings"]["calls_per_sample"] == (3 if interleave else None)
    assert {"jax", "jaxlib", "flax", "python"} <= set(doc["versions"])
    rows = doc["results"]
    assert [(r["index"], r["mechanism"]) for r in rows] == [(0, "rnn"), (1, "flurka-rnn")]
    for r in rows:
        assert r["status"] == "ok" and r["median_s"] > 0 and r["floor_s"] > 0
        assert r.get("interleaved", False) is interleave
        assert r["calls_per_sample"] == 3 if interleave else 1 <= r["calls_per_sample"] <= 32
    (ceil,) = doc["ceilings"].values()  # one device kind, probed inside the tasks
    assert ceil["float32"]["matmul_flops_per_s"] > 0
    # each row names its task, the run its ratio pairs within: one task for the side-by-side pair
    runs = {r.mechanism: r.run for r in speed_records_from_document(doc)}
    assert [r["task"] for r in rows] == ([0, 0] if interleave else [0, 1])
    assert (runs["rnn"] == runs["flurka-rnn"]) is interleave
    assert runs["rnn"] == f"{doc['created']} task 0"
