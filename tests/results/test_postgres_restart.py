"""A PostgreSQL results database that restarts mid-sweep costs nothing (issue 58, point 8): the
ingest is retried through the outage, said in one line when it goes and one when it is back, adds
its trials exactly once (also when the server dies in the middle of its transaction), and
`flurka ingest` rides out a restart the same way, or stops in one line once the budget is spent.

A throwaway cluster of the test's own (tests/support/postgres_cluster.py, started as .ci/run starts
CI's), since the test stops and starts the server: no ``postgres`` marker, no FLURKA_TEST_POSTGRES_URL.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from postgres_cluster import missing_reason, throwaway_postgres
from testsupport import free_ports

from flurka.results import ingest_sweep, upgrade
from flurka.results.db import redact
from flurka.results.retry import db_store

DOWN_S = 3.0


@pytest.fixture(scope="module")
def pg():
    why = missing_reason()
    if why:
        pytest.skip(why)
    with throwaway_postgres() as cluster:
        yield cluster


@pytest.fixture
def fresh_db(pg, request):
    """URL (with the password) of a new database on the throwaway server, the server running."""
    if not pg.running():
        pg.start()
    return pg.create_database(request.node.name.removeprefix("test_")[:40])


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[flurka]")]


def _record(sweep_id: str, n: int) -> dict:
    trials = [{"trial_key": f"rnn-{seed}", "attention": "rnn", "benchmark": "lra-listops-small", "seed": seed,
               "status": "ok", "steps": 8, "alpha": None, "base": None, "d_k": None, "num_features": None,
               "metrics": {"accuracy": 0.5, "loss": 1.0},
               "curve": [{"step": s, "loss": 1.0 / s} for s in range(1, 4)],
               "config": {"attention": "rnn", "seed": seed, "steps": 8}}
              for seed in range(n)]
    return {"sweep_id": sweep_id, "name": sweep_id, "created_at": "2026-12-01T12:00:00+00:00", "git_commit": "abc",
            "environment": {"device": "cpu", "host": "h", "versions": {}}, "trials": trials}


def _counts(url: str, sweep_id: str) -> tuple[int, int, int]:
    """(sweeps of that id, its trial rows, its distinct trial keys)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            sweeps = conn.execute(sa.text("SELECT count(*) FROM sweeps WHERE external_id = :s"), {"s": sweep_id}).scalar()
            rows, keys = conn.execute(sa.text(
                "SELECT count(*), count(DISTINCT t.trial_key) FROM trials t JOIN sweeps s ON s.id = t.sweep_id "
                "WHERE s.external_id = :s"), {"s": sweep_id}).one()
    finally:
        engine.dispose()
    return sweeps, rows, keys


def _restart_after(pg, seconds: float) -> threading.Thread:
    def restart():
        time.sleep(seconds)
        pg.start()
    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    return thread


def test_an_ingest_goes_through_a_server_restart(pg, fresh_db, capfd):
    """The server is stopped (pg_ctl -m fast) after the schema is in, started again 3 s later: the
    ingest waits it out, adds its trials once, says so in two lines; again: all skipped."""
    engine = upgrade(fresh_db)
    where = f"results DB {redact(engine.url)}"
    try:
        with engine.connect() as conn:          # a pooled connection the stop makes stale
            conn.execute(sa.text("SELECT 1"))
        pg.stop("fast")
        thread = _restart_after(pg, DOWN_S)
        t = time.monotonic()
        report = db_store(engine).call(ingest_sweep, engine, _record("restart", 5))
        took = time.monotonic() - t
        thread.join()
        again = db_store(engine).call(ingest_sweep, engine, _record("restart", 5))
    finally:
        engine.dispose()
    assert (report.added, report.skipped) == (5, 0) and (again.added, again.skipped) == (0, 5)
    assert _counts(fresh_db, "restart") == (1, 5, 5)
    assert DOWN_S <= took < DOWN_S + 10
    lines = _lines(capfd.readouterr().err)
    print("\n".join(lines))
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"[flurka] {where} unreachable (") and "Connection refused" in lines[0], lines
    assert lines[0].endswith("retrying for up to 300 s"), lines
    assert lines[1].startswith(f"[flurka] {where} is back after "), lines
    assert pg.password not in "\n".join(lines)


def test_a_server_killed_mid_transaction_leaves_no_half_sweep(pg, fresh_db, capfd):
    """pg_ctl -m immediate while a long ingest is inserting its trials (seen in pg_stat_activity),
    started again 2 s later: what it had inserted is gone with its transaction, and the retried
    unit adds every trial exactly once."""
    n = 1500
    engine = upgrade(fresh_db)
    killed = threading.Event()

    def kill_mid_transaction():
        admin = sa.create_engine(pg.url(password=True), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    busy = conn.execute(sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND xact_start IS NOT NULL "
                        "AND query LIKE 'INSERT INTO trials%'"), {"db": sa.make_url(fresh_db).database}).scalar()
                    if busy:
                        break
                    time.sleep(0.01)
                else:
                    return
        finally:
            admin.dispose()
        time.sleep(0.2)                          # some trials in, uncommitted
        pg.stop("immediate")
        killed.set()
        time.sleep(2)
        pg.start()

    thread = threading.Thread(target=kill_mid_transaction, daemon=True)
    thread.start()
    try:
        report = db_store(engine).call(ingest_sweep, engine, _record("killed", n))
        thread.join()
    finally:
        engine.dispose()
    assert killed.is_set(), "the ingest ended before the server could be killed in it"
    assert (report.added, report.skipped) == (n, 0)
    assert _counts(fresh_db, "killed") == (1, n, n)
    lines = _lines(capfd.readouterr().err)
    print("\n".join(lines))
    assert len(lines) == 2 and " unreachable (" in lines[0] and " is back after " in lines[1], lines


def test_a_refused_connection_is_transient_a_refused_login_is_not(pg, fresh_db):
    """What db.connect raises (DatabaseUnreachable, one line) is judged by the error behind it."""
    from flurka.results.db import DatabaseUnreachable, connect
    from flurka.results.retry import db_transient, reason

    wrong = sa.make_url(fresh_db).set(password="not-" + pg.password)
    with pytest.raises(DatabaseUnreachable) as refused_login:
        connect(wrong)
    assert not db_transient(refused_login.value)
    assert reason(refused_login.value) == 'FATAL: password authentication failed for user "flurka"'
    with pytest.raises(DatabaseUnreachable) as refused:
        connect(sa.make_url(fresh_db).set(port=free_ports(1)[0]))
    assert db_transient(refused.value) and reason(refused.value) == "Connection refused"


# -- `flurka ingest`, as a user types it ---------------------------------------------------------------------

def _flurka() -> list[str]:
    script = Path(sys.executable).with_name("flurka")
    return [str(script)] if script.exists() else [shutil.which("flurka") or "flurka"]


def _ingest_cli(pg, url: str, path: Path, **env: str) -> subprocess.Popen:
    """`flurka ingest --db URL FILE`, the URL without a password (libpq reads PGPASSWORD)."""
    assert pg.password not in url
    return subprocess.Popen([*_flurka(), "ingest", "--db", url, str(path)], env={**pg.env(), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_flurka_ingest_to_a_stopped_server_fails_at_once(pg, fresh_db, tmp_path):
    """A server that is down when `flurka ingest` starts is bad input, as in a sweep's preflight: one
    line, exit 2, at once (no retrying), nothing added, the password nowhere. (A restart once the files
    are going in is waited out: the in-process tests above, through the same retried unit.)"""
    upgrade(fresh_db).dispose()
    url = redact(fresh_db)
    record = tmp_path / "sweep-record.json"
    record.write_text(json.dumps(_record("cli-down", 4)))
    pg.stop("fast")
    try:
        t = time.monotonic()
        proc = _ingest_cli(pg, url, record)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        pg.start()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"flurka ingest: cannot reach {url}: ") and "Connection refused" in lines[0], lines
    assert took < 15 and pg.password not in out + err
    assert _counts(fresh_db, "cli-down") == (0, 0, 0)


def test_flurka_ingest_with_a_wrong_password_fails_at_once(pg, fresh_db, tmp_path):
    """A server that answers "no" is no restart: a wrong PGPASSWORD is one line, exit 2, at once."""
    url = redact(fresh_db)
    record = tmp_path / "sweep-record.json"
    record.write_text(json.dumps(_record("cli-password", 1)))
    t = time.monotonic()
    proc = _ingest_cli(pg, url, record, PGPASSWORD="not-" + pg.password)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t < 15      # the CLI's start; no retrying
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"flurka ingest: cannot reach {url}: ") and "password authentication failed" in lines[0]
