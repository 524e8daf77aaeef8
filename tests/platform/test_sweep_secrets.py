"""A password in ``--results-db`` (or ``--mlflow-uri``) is never persisted (issue 40): sweep.json
and the MLflow params ``spec.*`` hold the URL masked, the real one comes from the flag at run
time, and ``--resume`` without the flag says so in one line (exit 2) instead of using the mask.

A SQLite URL cannot carry a password, so the always-run test writes a sweep's state and MLflow
parent run for a PostgreSQL URL with one (the writing code path of ``run_sweep``; the server is
never contacted) and greps every file under the run dir. With FLURKA_TEST_POSTGRES_URL (CI) a tiny
sweep runs against a real PostgreSQL, as the user types it, and the run dir and Ray's own temp
dir are grepped the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from flurka.sweeps import runner
from flurka.sweeps.spec import SpecError, SweepSpec, mask_url, masked_fields, stored_dict

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "Pw-s3cret-40"
URL = f"postgresql+psycopg://flurka:{PASSWORD}@db.example.invalid:5432/results?sslmode=require"
MASKED = "postgresql+psycopg://flurka@db.example.invalid:5432/results?sslmode=require"


def _files_holding(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` whose bytes contain ``secret`` (also as UTF-16, URL-quoted)."""
    from urllib.parse import quote

    needles = {secret.encode(), secret.encode("utf-16-le"), quote(secret).encode()}
    hits = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                data = path.read_bytes()
            except OSError:          # a socket, a vanished file
                continue
            if any(n in data for n in needles):
                hits.append(str(path.relative_to(root)))
    return hits


@pytest.mark.parametrize("url,masked", [
    (URL, MASKED),
    ("postgresql://me@h/res?password=pw&sslmode=require", "postgresql://me@h/res?sslmode=require"),
    ("http://me:pw@mlflow.example:5000", "http://me@mlflow.example:5000"),
    ("sqlite:////abs/run/results.db", "sqlite:////abs/run/results.db"),      # nothing to mask: unchanged
    ("postgresql://me@h/res", "postgresql://me@h/res"),
])
def test_mask_url(url, masked):
    assert mask_url(url) == masked


def test_stored_spec_masks_every_password():
    spec = SweepSpec(benchmarks=("lra-listops-small",), results_db=URL, mlflow_uri="http://me:pw@mlflow.example:5000")
    assert masked_fields(spec) == ["results_db", "mlflow_uri"]
    stored = stored_dict(spec)
    assert stored["results_db"] == MASKED and stored["mlflow_uri"] == "http://me@mlflow.example:5000"
    assert spec.results_url == URL                       # in memory: the real URL, from the flag
    assert masked_fields(SweepSpec(benchmarks=("lra-listops-small",))) == []


def test_sweep_json_and_mlflow_hold_no_password_and_resume_needs_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.5,), steps=8,
                     run_dir=str(tmp_path / "run"), results_db=URL, name="secret")
    # what run_sweep writes once Ray is up: the sweep's state, then MLflow's parent run and params
    state = runner._sweep_state(spec)
    tracker, parent = runner.open_tracking(spec, state["sweep_id"], "local")
    tracker.end_sweep("FINISHED")

    sweep_json = tmp_path / "run" / "sweep.json"
    stored = json.loads(sweep_json.read_text())
    assert stored["spec"]["results_db"] == MASKED and stored["masked"] == ["results_db"]
    assert stat.S_IMODE(sweep_json.stat().st_mode) == 0o600
    params = tracker.client.get_run(parent).data.params
    assert params["spec.results_db"] == MASKED
    assert _files_holding(tmp_path, PASSWORD) == []      # sweep.json, mlflow.db, mlartifacts/: none
    from ray import cloudpickle                          # Tune's tuner.pkl round trip: still writes
    again = cloudpickle.loads(cloudpickle.dumps(tracker))
    again.set_tags(parent, {"flurka.test": "restored"})
    assert again.client.get_run(parent).data.tags["flurka.test"] == "restored"

    # --resume without --results-db: the mask cannot be used; one line, before Ray, exit 2
    with pytest.raises(SpecError, match="stored without its password; give --results-db") as info:
        runner.preflight(dataclasses.replace(spec, resume=True, results_db=None))
    assert "\n" not in str(info.value) and PASSWORD not in str(info.value)
    assert runner._stored_state(dataclasses.replace(spec, resume=True))["sweep_id"] == state["sweep_id"]

    import ray

    def refuse(*_a, **_k):
        raise AssertionError("Ray started")

    monkeypatch.setattr(ray, "init", refuse)
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import uptrain_sweep
    finally:
        sys.path.pop(0)
    capsys.readouterr()
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    code = uptrain_sweep.main(["--benchmarks", "lra-listops-small", "--variants", "flurka-rnn", "--alphas", "0.5",
                               "--steps", "8", "--name", "secret", "--run-dir", str(tmp_path / "run"), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"--results-db {MASKED} was stored without its password" in err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


@pytest.mark.postgres
@pytest.mark.slow
def test_tiny_sweep_on_postgres_persists_no_password(tmp_path):
    """The user's command against a real PostgreSQL with a password in the URL; every file the
    sweep leaves (run dir: sweep.json, MLflow, Tune, checkpoints; Ray's temp dir) is grepped."""
    admin = os.environ.get("FLURKA_TEST_POSTGRES_URL")
    if not admin:
        if os.environ.get("CI"):
            pytest.fail("FLURKA_TEST_POSTGRES_URL is unset in CI: .ci/run must start PostgreSQL")
        pytest.skip("FLURKA_TEST_POSTGRES_URL unset (set by .ci/run)")
    from testsupport import scratch_postgres_database

    password = sa.make_url(admin).password
    if not password:
        pytest.skip("FLURKA_TEST_POSTGRES_URL has no password to leak")
    run = tmp_path / "run"
    before_ray = set(Path("/tmp").glob("flurka-ray-*"))
    with scratch_postgres_database(admin, "flurka_secret") as url:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "JAX_COMPILATION_CACHE_DIR")}
        argv = ["--benchmarks", "lra-listops-small", "--variants", "flurka-rnn", "--alphas", "0.5", "--steps", "8",
                "--no-baselines", "--num-cpus", "1", "--name", "secret", "--run-dir", str(run), "--results-db", url,
                *[a for k, v in (("warmup_steps", 0), ("eval_every", 0), ("log_every", 2), ("batch_size", 8),
                                 ("eval_batches", 1), ("model.d_model", 16), ("model.d_ff", 32), ("model.num_layers", 1))
                  for a in ("--set", f"{k}={v}")]]
        proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "uptrain_sweep.py"), *argv],
                              cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert password not in proc.stdout and password not in proc.stderr
        assert "flurka sweep: warning: the password in --results-db is on a command line" in proc.stderr
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM trials")).scalar() == 1
        engine.dispose()
        stored = json.loads((run / "sweep.json").read_text())
        assert stored["masked"] == ["results_db"] and password not in stored["spec"]["results_db"]
        assert _files_holding(run, password) == []
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
        runs = client.search_runs([client.get_experiment_by_name("secret").experiment_id])
        parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        assert len(parent) == 1 and len(runs) == 3 and all(r.info.status == "FINISHED" for r in runs)
        assert parent[0].data.params["spec.results_db"] == mask_url(url) and password not in mask_url(url)
        for ray_dir in set(Path("/tmp").glob("flurka-ray-*")) - before_ray:
            assert _files_holding(ray_dir, password) == [], ray_dir

        # --resume, the same command with the flag again: accepted (the mask is never used to connect)
        from flurka.sweeps.spec import parse

        spec = parse([*argv, "--resume"])
        assert spec.results_db == url and spec.resume
        assert runner._stored_state(spec)["sweep_id"] == stored["sweep_id"]


def test_a_password_in_a_url_is_warned_about_not_echoed():
    """Issue 58: a job's entrypoint is kept by Ray (its job list, the driver log, ps): a password in
    --results-db or --mlflow-uri gets one warning line naming the password-free form, printed by the
    sweep once its checks pass (bad input stays one line); a URL without one (libpq reads
    PGPASSWORD / PGPASSFILE) gets none."""
    from flurka.sweeps.spec import parse, password_warnings

    (line,) = password_warnings(parse(["--benchmarks", "lra-listops-small", "--results-db", URL]))
    assert line.startswith("warning: the password in --results-db is on a command line or in a script")
    assert PASSWORD not in line and "PGPASSFILE" in line
    assert password_warnings(parse(["--benchmarks", "lra-listops-small", "--results-db", MASKED,
                                    "--mlflow-uri", "http://me@ml:5000"])) == []


def test_tracker_pickled_for_resume_keeps_no_password(monkeypatch):
    """Tune pickles the MLflow callback (and so the tracker) into tuner.pkl for --resume: the
    pickle holds the masked URI; unpickled in a driver that has the real one (from the flag), the
    tracker writes with the real one."""
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient
    from ray import cloudpickle as pickle                               # as Tune writes tuner.pkl

    from flurka.tracking import mlflow_runs
    from flurka.tracking.callback import MLflowTrialCallback

    known = SimpleNamespace(experiment_id="1", tags=dict([mlflow_runs.EXPERIMENT_KIND]))   # nothing to write
    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", lambda self, name: known)
    monkeypatch.setattr(mlflow_runs, "_REAL_URIS", {})
    uri = f"http://flurka:{PASSWORD}@mlflow.example.invalid:5000"
    tracker = mlflow_runs.SweepTracker(uri, "secret", "secret-1")
    data = pickle.dumps(MLflowTrialCallback(tracker))
    assert PASSWORD.encode() not in data
    again = pickle.loads(data).tracker
    assert again.uri == uri and again.client._tracking_client.tracking_uri == uri
    monkeypatch.setattr(mlflow_runs, "_REAL_URIS", {})                 # a driver without the flag
    assert pickle.loads(data).tracker.uri == "http://flurka@mlflow.example.invalid:5000"
