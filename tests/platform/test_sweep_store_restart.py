"""A tracking server or results database that restarts mid-sweep costs nothing (issue 58, point 8):
the driver's writes are retried with backoff through the outage, said in one line when it goes
and one when it is back; a bad request is never retried; the budget is honoured."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from flurka.results import ingest_sweep, upgrade
from flurka.results.retry import Store, StoreUnavailable, db_store, db_transient
from flurka.tracking.retrying import RetryingClient, mlflow_store, mlflow_transient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[flurka]")]


class _Answer(BaseHTTPRequestHandler):
    """A stand-in MLflow server: every request gets ``status`` and MLflow's error JSON."""
    status, code = 404, "RESOURCE_DOES_NOT_EXIST"

    def do_GET(self):   # noqa: N802
        body = json.dumps({"error_code": self.code, "message": "stand-in"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


def _serve(port: int, handler=_Answer) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# -- the retry helper, against real failures -------------------------------------------------------------

def test_a_refused_connection_is_retried_until_the_server_answers(capfd, caplog):
    """Nothing listens on the port for 1.5 s, then a server answers: the call returns its answer
    (get_experiment_by_name: None for a 404), with one outage line and one back line."""
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    client = RetryingClient(MlflowClient(tracking_uri=uri), mlflow_store(f"MLflow server at {uri}"))
    servers = []
    timer = threading.Timer(1.5, lambda: servers.append(_serve(port)))
    timer.start()
    try:
        t = time.monotonic()
        assert client.get_experiment_by_name("nothing") is None
        took = time.monotonic() - t
    finally:
        timer.join()
        for s in servers:
            s.shutdown()
            s.server_close()
    assert 1.5 <= took < 10
    # urllib3's own warning on each try ("Retrying (Retry(total=0, ...))"): not shown
    assert not [r for r in caplog.records if r.name.startswith("urllib3")]
    lines = _lines(capfd.readouterr().err)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"[flurka] MLflow server at {uri} unreachable (Connection refused); retrying for up to ")
    assert lines[1].startswith(f"[flurka] MLflow server at {uri} is back after ")


def test_a_bad_request_is_not_retried(capfd):
    """A 400 (INVALID_PARAMETER_VALUE) is raised at once, the first time, without a line."""
    class Bad(_Answer):
        status, code = 400, "INVALID_PARAMETER_VALUE"

    port = _free_port()
    server = _serve(port, Bad)
    calls = []
    try:
        store = mlflow_store("MLflow server")
        client = MlflowClient(tracking_uri=f"http://127.0.0.1:{port}")
        t = time.monotonic()
        with pytest.raises(MlflowException, match="stand-in"):
            store.call(lambda: calls.append(1) or client.get_experiment_by_name("x"))
        assert time.monotonic() - t < 2
    finally:
        server.shutdown()
        server.server_close()
    assert calls == [1]
    assert _lines(capfd.readouterr().err) == []


def test_the_budget_is_honoured_then_each_write_is_tried_once(capfd, monkeypatch):
    """A closed port and a 2 s budget ($FLURKA_STORE_RETRY_S): StoreUnavailable after about 2 s,
    said in one line; the next write is tried once, at once, and raises too."""
    monkeypatch.setenv("FLURKA_STORE_RETRY_S", "2")
    uri = f"http://127.0.0.1:{_free_port()}"
    store = mlflow_store(f"MLflow server at {uri}")
    client = RetryingClient(MlflowClient(tracking_uri=uri), store)
    t = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"unreachable \(Connection refused\) for 2 s"):
        client.get_experiment_by_name("x")
    assert 2 <= time.monotonic() - t < 6
    t = time.monotonic()
    with pytest.raises(StoreUnavailable):
        client.get_experiment_by_name("x")
    assert time.monotonic() - t < 1.5
    lines = _lines(capfd.readouterr().err)
    assert len(lines) == 2, lines
    assert "retrying for up to 2 s" in lines[0]
    assert lines[1].startswith(f"[flurka] MLflow server at {uri} still unreachable after 2 s; the sweep goes on")


def test_what_is_transient():
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE

    assert mlflow_transient(MlflowException("down", error_code=TEMPORARILY_UNAVAILABLE))
    assert mlflow_transient(MlflowException("API request failed with exception Connection refused"))  # 500
    assert not mlflow_transient(MlflowException("bad", error_code=INVALID_PARAMETER_VALUE))
    assert not mlflow_transient(MlflowException("gone", error_code=RESOURCE_DOES_NOT_EXIST))
    assert not mlflow_transient(ValueError("a bug"))
    locked = sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    assert db_transient(locked)
    assert not db_transient(sa.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: x")))
    assert not db_transient(sa.exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE")))


def test_a_unit_is_retried_as_a_whole():
    """Calls inside a retried unit are not retried one by one: the unit is."""
    tries = []
    store = Store("thing", lambda e: isinstance(e, ConnectionError), budget=5, sleep=lambda s: None)

    def inner():
        tries.append("inner")
        if len(tries) < 3:
            raise ConnectionError("refused")
        return "ok"

    assert store.call(lambda: store.call(inner)) == "ok"
    assert tries == ["inner"] * 3


def test_writes_past_the_budget_wait_and_are_made_in_order_when_it_is_back(tmp_path, monkeypatch, capfd):
    """The callback's MLflow store stays unreachable past the retry budget (its client pointed at a
    closed port meanwhile): the hooks' writes wait instead of failing the sweep; the next hook,
    the store back, makes them first, then its own: every step once, in order."""
    from types import SimpleNamespace

    from flurka.tracking.callback import MLflowTrialCallback
    from flurka.tracking.mlflow_runs import SweepTracker

    monkeypatch.setenv("FLURKA_STORE_RETRY_S", "0.5")
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    tracker = SweepTracker(uri, "wait", "sweep-wait")
    tracker.start_sweep("sweep-wait", {})
    run = {"key": "k1", "kind": "branch", "benchmark": "lra-listops-small"}
    callback = MLflowTrialCallback(tracker, params_of=lambda c: {"a": 1}, name_of=lambda c: "k1")
    trial = SimpleNamespace(config={"run": run}, last_result={})
    callback.on_trial_start(0, [], trial)
    run_id = tracker._runs["k1"]
    store = tracker.client.raw
    tracker.client.raw = MlflowClient(tracking_uri=f"http://127.0.0.1:{_free_port()}")   # nothing listens
    try:
        callback.on_trial_result(0, [], trial, {"step": 2, "stream": "train", "loss": 1.0})
        t = time.monotonic()
        callback.on_trial_result(0, [], trial, {"step": 4, "stream": "train", "loss": 0.8})
        assert time.monotonic() - t < 1.5         # given up: one try, no wait
        assert len(callback.pending) == 2
    finally:
        tracker.client.raw = store
    callback.on_trial_result(0, [], trial, {"step": 6, "stream": "train", "loss": 0.5})
    assert callback.pending == []
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(2, 1.0), (4, 0.8), (6, 0.5)]
    lines = _lines(capfd.readouterr().err)
    assert [line.split(" (")[0].split(" after ")[0] for line in lines] == [
        f"[flurka] MLflow store {uri} unreachable", f"[flurka] MLflow store {uri} still unreachable",
        f"[flurka] MLflow store {uri} is back"], lines


# -- the results database --------------------------------------------------------------------------------

def _record(sweep_id: str, n: int) -> dict:
    trials = [{"trial_key": f"rnn-{seed}", "attention": "rnn", "benchmark": "lra-listops-small", "seed": seed,
               "status": "ok", "steps": 8, "alpha": None, "base": None, "d_k": None, "num_features": None,
               "metrics": {"accuracy": 0.5}, "config": {"attention": "rnn", "seed": seed, "steps": 8}}
              for seed in range(n)]
    return {"sweep_id": sweep_id, "name": sweep_id, "created_at": "2026-12-01T12:00:00+00:00", "git_commit": "abc",
            "environment": {"device": "cpu", "host": "h", "versions": {}}, "trials": trials}


def test_a_locked_results_db_is_retried_and_ingest_stays_idempotent(tmp_path, capfd):
    """Another connection holds the SQLite file in an EXCLUSIVE transaction for 2 s: the ingest is
    retried past it (one outage line, one back line) and adds its trials once; again: all skipped."""
    db = tmp_path / "results.db"
    upgrade(f"sqlite:///{db}").dispose()
    engine = sa.create_engine(f"sqlite:///{db}", connect_args={"timeout": 0.2}, pool_pre_ping=True)
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    released = threading.Timer(2.0, lambda: holder.execute("COMMIT"))
    released.start()
    try:
        t = time.monotonic()
        report = db_store(engine).call(ingest_sweep, engine, _record("locked", 3))
        took = time.monotonic() - t
        again = db_store(engine).call(ingest_sweep, engine, _record("locked", 3))
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT count(*) FROM trials")).scalar()
    finally:
        released.join()
        holder.close()
        engine.dispose()
    assert (report.added, report.skipped) == (3, 0) and (again.added, again.skipped) == (0, 3) and rows == 3
    assert took >= 1.5
    lines = _lines(capfd.readouterr().err)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"[flurka] results DB sqlite:///{db} unreachable (database is locked); retrying")
    assert lines[1].startswith(f"[flurka] results DB sqlite:///{db} is back after ")


# -- a sweep through an MLflow server restart ----------------------------------------------------------------

class _MlflowServer:
    """``mlflow server`` on a port, SQLite backend, in its own process group (stopped by SIGTERM to it)."""

    def __init__(self, root: Path):
        self.root, self.port = root, _free_port()
        self.db = root / "mlflow.db"
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> None:
        log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.db}", "--artifacts-destination", str(self.root / "artifacts"),
             "--workers", "1"], cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"mlflow server on {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def _metric_rows(db: Path) -> int:
    """Metric points of the trials' (nested) runs so far."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute("SELECT count(*) FROM metrics m JOIN tags t ON t.run_uuid = m.run_uuid "
                               "WHERE t.key = 'mlflow.parentRunId'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


@pytest.mark.slow
def test_a_sweep_goes_through_an_mlflow_server_restart(tmp_path, tiny_overrides, mlflow_runs, capfd, monkeypatch):
    """The server is stopped (SIGTERM to its process group) as the first trial's first metrics land
    (the hooks of Tune's callback write the rest),
    and started again on the same port and database: the sweep succeeds, every trial's run exists
    once with all its metric steps, and the outage and its end were each said in one line."""
    from flurka.sweeps.runner import run_sweep
    from flurka.sweeps.spec import SweepSpec

    monkeypatch.setenv("FLURKA_STORE_RETRY_S", "120")
    server = _MlflowServer(tmp_path)
    server.start()
    outage: dict[str, float] = {}
    done = threading.Event()

    def restart():
        while not done.is_set() and _metric_rows(server.db) == 0:
            time.sleep(0.05)
        if done.is_set():
            return
        server.stop()
        outage["stopped"] = time.monotonic()
        time.sleep(3)
        server.start()
        outage["back"] = time.monotonic()

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    try:
        spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.5,), steps=8,
                         overrides={**tiny_overrides, "log_every": 2}, baselines=False,
                         run_dir=str(tmp_path / "run"), num_cpus=2, name="restart", mlflow_uri=server.uri)
        out = run_sweep(spec)
        done.set()
        thread.join(timeout=90)
        assert "stopped" in outage and "back" in outage, "the server was never restarted"
        assert not out.failed and not out.stopped and len(out.results) == 2     # the base run and the branch
        lines = _lines(capfd.readouterr().err)
        gone = [line for line in lines if "unreachable" in line]
        back = [line for line in lines if " is back after " in line]
        assert len(gone) == 1 and len(back) == 1, lines
        assert gone[0].startswith(f"[flurka] MLflow server at {server.uri} unreachable (")
        assert gone[0].endswith("retrying for up to 120 s")
        assert not any("still unreachable" in line for line in lines), lines

        client, runs = mlflow_runs(server.uri, "restart")
        nested = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        assert len([r for r in runs if "mlflow.parentRunId" not in r.data.tags]) == 1
        keys = [r.data.tags["flurka.trial_key"] for r in nested]
        assert sorted(keys) == sorted(out.results)          # each trial's run, once
        for run in nested:
            assert run.info.status == "FINISHED"
            result = out.results[run.data.tags["flurka.trial_key"]]
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
            # every step once, none missing from the first it logged (a branch starts after its fork)
            want = {int(e["step"]) for e in result["history"] if "loss" in e and int(e["step"]) >= steps[0]}
            assert steps == sorted(set(steps)) and want <= set(steps), (run.info.run_name, steps, sorted(want))
            assert steps[-1] == max(want)
            if run.data.tags["flurka.kind"] != "base":       # a base run stops at its last fork: no evaluation
                assert "eval/accuracy" in run.data.metrics
            assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"result.json", "curves.csv"}
    finally:
        done.set()
        thread.join(timeout=90)
        server.stop()
