"""Issue 60: SIGINT and SIGTERM end every long command cleanly: exit 130 / 143, one line on stderr
(no traceback), no half-written output, nothing half ingested.

Each case starts the installed ``flurka`` script in a process group of its own, waits until the
command is at its work (a row printed, a program compiled, the results database open), sends the
signal and reads what it left. ``flurka train`` and ``flurka sweep`` have their own tests
(tests/training, tests/platform); the shared piece is :func:`flurka.cli.stopping_on_signals`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

FLURKA = str(Path(sys.executable).parent / "flurka")
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]
THEORY = ["theory", "--seq-len", "64", "--d-model", "32", "--heads", "2", "--d-k", "8,16", "--features", "4,8",
          "--seeds", "0,1"]   # 64 rows: ~15 s on a 2-core host, a compile or two per row
SPEED = ["speed", "--sweep", "tiny", "--mechanisms", "full,linformer,performer", "--repeats", "3", "--warmup", "1",
         "--no-ceilings"]   # 12 points


class Command:
    """A running ``flurka`` process: its stdout lines as they come, its stderr at the end."""

    def __init__(self, argv: list[str], cwd: Path, env: dict | None = None):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}   # its lines as they are printed
        self.proc = subprocess.Popen([FLURKA, *argv], cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def wait_until(self, ready, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode} before {what}: {self.proc.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                os.killpg(self.proc.pid, signal.SIGKILL)
                pytest.fail(f"not {what} after {timeout} s")
            time.sleep(0.01)

    def opened(self, path: Path) -> bool:
        """Whether the process holds ``path`` open (its results database: at work on it)."""
        fds, real = Path(f"/proc/{self.proc.pid}/fd"), os.path.realpath(path)
        try:
            return any(os.readlink(fds / fd) == real for fd in os.listdir(fds))
        except OSError:   # a descriptor closed while listed
            return False

    def stop(self, signum: int) -> tuple[int, str, str]:
        os.kill(self.proc.pid, signum)
        try:
            err = self.proc.stderr.read()
            code = self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._reader.join(timeout=10)
        return code, "".join(self.lines), err


def one_line(err: str) -> str:
    assert "Traceback" not in err and "Exception ignored" not in err, err
    (line,) = err.splitlines()
    return line


def _sweep(n_seeds: int = 3) -> dict:
    """A small sweep record: nmt-small, four mechanisms, loss / FLOPs curves (what a report draws)."""
    trials = []
    for seed in range(n_seeds):
        for i, mech in enumerate(("full", "linformer", "performer", "flurka-performer")):
            curve = [{"step": s, "loss": 3.0 / s + 0.1 * i, "train_flops": 1e11 * s * (1 - 0.1 * i)}
                     for s in range(25, 201, 25)]
            trials.append({"trial_key": f"{mech}/s{seed}", "attention": mech, "benchmark": "nmt-small",
                           "seed": seed, "status": "ok", "steps": 200, "alpha": None, "base": None,
                           "d_k": 16 if mech in ("linformer", "flurka-performer") else None,
                           "num_features": 16 if mech.endswith("performer") else None,
                           "train_flops": curve[-1]["train_flops"], "wall_time_s": 10.0,
                           "metrics": {"bleu": 90.0 - 3 * i + seed, "loss": curve[-1]["loss"]}, "curve": curve})
    return {"sweep_id": "signals-test", "name": "signals", "created_at": "2026-12-01T10:00:00+00:00",
            "git_commit": "abc1234", "environment": {"device": "cpu", "host": "laptop", "versions": {"jax": "0.10.0"}},
            "trials": trials}


@pytest.fixture(scope="module")
def results_db(tmp_path_factory) -> Path:
    from flurka.results import ingest_sweep, open_results

    path = tmp_path_factory.mktemp("signals") / "results.db"
    engine = open_results(f"sqlite:///{path}")
    ingest_sweep(engine, _sweep())
    engine.dispose()
    return path


def _speed_document(index: int, rows: int = 400) -> dict:
    """A speed document of ``rows`` measurements of its own (a second of ingestion or so)."""
    results = [{"index": i, "sweep": f"signals-{index}", "device_name": "cpu", "mechanism": "full",
                "mode": "forward", "scope": "layer", "seq_len": 64 + i, "d_model": 32, "num_heads": 4, "d_k": 16,
                "num_features": 8, "layers": 2, "ffn": 32, "dtype": "float32", "batch": 2, "align": 1,
                "fused": False, "pad_to": 1, "xla": {}, "status": "ok", "median_s": 1e-3 * (1 + index + i / rows),
                "p10_s": 1e-3, "p90_s": 1e-3, "min_s": 1e-3, "repeats": 3} for i in range(rows)]
    return {"schema": "flurka.speed/1", "sweep": f"signals-{index}", "created": "2026-12-01T10:00:00+00:00",
            "device": {"name": "cpu", "platform": "cpu", "count": 1, "host": "laptop"},
            "versions": {"python": "3.11", "jax": "0.10.0"}, "settings": {"repeats": 3}, "ceilings": None,
            "results": results}


@pytest.mark.parametrize("signum", SIGNALS)
def test_theory_stops_between_rows_and_writes_nothing(signum, tmp_path):
    """JAX: the stop is a flag polled between rows (an exception would be swallowed by JAX's gc
    callback); a partial theory document would read as a whole one, so none is written."""
    cache = tmp_path / "jax-cache"   # a program compiled: the first row is under way
    cmd = Command([*THEORY, "--out", "theory.json"], tmp_path,
                  env={"JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
    cmd.wait_until(lambda: cache.is_dir() and any(cache.iterdir()), "a program compiled")
    code, out, err = cmd.stop(signum)
    assert code == CODES[signum] and out == ""
    line = one_line(err)
    assert line.startswith(f"flurka theory: {signum.name}: stopped after ") and line.endswith(
        " of 64 rows; nothing written to theory.json"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jax-cache"]


@pytest.mark.parametrize("signum", SIGNALS)
def test_speed_stops_between_points_keeping_the_rows_measured(signum, tmp_path):
    cmd = Command([*SPEED, "--out", "speed.json"], tmp_path)
    cmd.wait_until(lambda: len(cmd.lines) >= 1, "a point measured")
    code, out, err = cmd.stop(signum)
    assert code == CODES[signum]
    measured = out.splitlines()
    assert measured and all(line.startswith("[") for line in measured), out   # no "wrote ..."
    assert one_line(err) == (f"flurka speed: {signum.name}: stopped after {len(measured)} of 12 points; "
                             f"{len(measured)} row{'' if len(measured) == 1 else 's'} in speed.json")
    doc = json.loads((tmp_path / "speed.json").read_text())
    assert len(doc["results"]) == len(measured) and doc["settings"]["stopped_by_signal"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["speed.json"]   # no speed.json.tmp


@pytest.mark.parametrize("signum", SIGNALS)
def test_report_stops_leaving_the_earlier_report_whole(signum, tmp_path, results_db):
    out = tmp_path / "report"
    (out / "figures").mkdir(parents=True)
    (out / "index.html").write_text("the earlier report")
    (out / "figures" / "old.png").write_bytes(b"old")
    cmd = Command(["report", "--db", str(results_db), "--out", str(out)], tmp_path)
    cmd.wait_until(lambda: cmd.opened(results_db), "reading the database")
    code, stdout, err = cmd.stop(signum)
    assert (code, stdout) == (CODES[signum], "")
    assert one_line(err) == f"flurka report: {signum.name}: stopped; nothing written to {out}"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["figures", "figures/old.png",
                                                                            "index.html"]
    assert (out / "index.html").read_text() == "the earlier report"


@pytest.mark.parametrize("signum", SIGNALS)
def test_tables_stops_before_printing(signum, tmp_path, results_db):
    cmd = Command(["tables", "--db", str(results_db), "--table", "isoflops"], tmp_path)
    cmd.wait_until(lambda: cmd.opened(results_db), "reading the database")
    code, out, err = cmd.stop(signum)
    assert (code, out) == (CODES[signum], "")
    assert one_line(err) == f"flurka tables: {signum.name}: stopped before the table was printed"


@pytest.mark.parametrize("signum", SIGNALS)
def test_ingest_stops_with_whole_files_in_and_the_rest_rolled_back(signum, tmp_path):
    files = []
    for i in range(4):
        files.append(tmp_path / f"speed{i}.json")
        files[-1].write_text(json.dumps(_speed_document(i)))
    db = tmp_path / "results.db"
    cmd = Command(["ingest", "--db", str(db), "--mlflow-uri", "none", *map(str, files)], tmp_path)
    cmd.wait_until(lambda: len(cmd.lines) >= 1, "a file ingested")   # the next one in its transaction
    code, out, err = cmd.stop(signum)
    assert code == CODES[signum]
    done = out.splitlines()
    assert done == [f"{f}: added 400, already present 0" for f in files[:len(done)]] and len(done) < 4
    line = one_line(err)
    assert line.startswith(f"flurka ingest: {signum.name}: stopped after {len(done)} of 4 files"), line
    with sqlite3.connect(db) as conn:
        (rows,) = conn.execute("select count(*) from speed_measurements").fetchone()
    assert rows == 400 * len(done)   # whole files only: the one in progress rolled back


def test_a_report_stopped_while_it_is_written_leaves_the_earlier_one_whole(tmp_path, results_db, monkeypatch):
    """The report is staged in a folder of its own and moved into place whole: a stop before the
    move leaves ``--out`` as it was (or absent), no staging folder behind."""
    from flurka.reports import build_report, render

    out, fresh = tmp_path / "report", tmp_path / "fresh"
    for name in ("index.html", "report.md", "figures/loss-vs-flops-nmt-small.png", "tables/old.csv"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(f"the earlier {name}")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def stopped(*_args, **_kwargs):   # the last file staged: every other one is in the staging folder
        raise KeyboardInterrupt

    monkeypatch.setattr(render, "page", stopped)
    for target in (out, fresh):
        with pytest.raises(KeyboardInterrupt):
            build_report(f"sqlite:///{results_db}", target)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")] and not fresh.exists()
