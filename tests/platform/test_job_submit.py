"""The README's cluster path end to end: a Ray head node on free ports (own temp dir, auth
disabled, every port on loopback, checked with ``ss -ltnp``: a loopback-only dev cluster), ``flurka submit`` (``ray job submit``
that stamps the commit) of a tiny sweep from a copy of the tree with a local edit, the up-training
table in the job's logs; the head is stopped by its process group, never ``ray stop``.

Issue 58: the edit is what runs, in the driver and in the Tune trials' workers (not the installed
flurka), and the submitted commit, dirty, is what MLflow and the results DB record."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from testsupport import listening, off_loopback, ray_node_ports, stop_ray_node, wait_ray_node

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXCLUDES = [".venv", ".git", "runs", "**/__pycache__", ".pytest_cache", ".ruff_cache", "*.db"]
TINY = ["--benchmarks", "lra-listops-small", "--variants", "flurka-rnn", "--alphas", "0.5", "--steps", "4",
        "--no-baselines", "--name", "job",
        *[a for k, v in dict(warmup_steps=0, eval_every=0, log_every=2, batch_size=8, eval_batches=1,
                             **{"model.d_model": 16, "model.d_ff": 32, "model.num_layers": 1}).items() for a in ("--set", f"{k}={v}")]]


MARKER = "flurka-job-marker"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _edited_copy(tmp_path: Path) -> tuple[Path, str]:
    """ROOT copied as a fresh one-commit checkout, then edited: the trainable's module (imported by
    the driver and by every trial's worker) prints where it runs from. Returns (tree, HEAD)."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*EXCLUDES, ".cuda-aot", ".hypothesis"))
    env = {**os.environ, **GIT_ENV}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "submitted"]):
        subprocess.run(["git", *cmd], cwd=tree, env=env, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True).stdout.strip()
    with open(tree / "platform" / "flurka" / "sweeps" / "trainable.py", "a") as f:
        f.write(f"\nprint('{MARKER}', __file__, flush=True)\n")
    return tree, head


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.status == 200


@pytest.mark.slow
def test_ray_job_submit_runs_the_sweep(tmp_path):
    temp_dir = tempfile.mkdtemp(prefix="frk-", dir="/tmp")       # short: unix sockets live here
    port_flags, ports = ray_node_ports(head=True)
    dash = ports["dashboard-port"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               RAY_USAGE_STATS_ENABLED="0",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",       # the node IP stays 127.0.0.1: all on loopback
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")   # else a SIGTERMed node waits 30 s to drain
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", *port_flags,
         "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
         "--num-cpus", "2", "--temp-dir", temp_dir, "--disable-usage-stats"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        address = f"http://127.0.0.1:{dash}"
        wait_ray_node(head, lambda: _answers(f"{address}/api/version"), f"the dashboard at {address}", 180)
        run_dir = tmp_path / "run"
        tree, head_sha = _edited_copy(tmp_path)
        job = subprocess.run(
            [str(BIN / "flurka"), "submit", "--address", address, "--working-dir", str(tree),
             "--runtime-env-json", json.dumps({"excludes": EXCLUDES}), "--",
             "python", "experiments/uptrain_sweep.py", *TINY, "--run-dir", str(run_dir)],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=480)
        logs = job.stdout + job.stderr
        assert job.returncode == 0, logs[-4000:]
        # a loopback-only head (README): every port its processes (workers too, after the job)
        # listen on is on 127.0.0.1
        sockets = listening(lambda pid: os.getsid(pid) == head.pid)   # the node's processes: its session
        assert {"gcs_server", "raylet"} <= {name for name, _ in sockets}, sockets
        assert f"127.0.0.1:{dash}" in {address for _, address in sockets}
        assert not off_loopback(sockets), f"listening off loopback: {off_loopback(sockets)}"
        assert "succeeded" in logs, logs[-4000:]
        assert "Up-training α, lra-listops-small" in logs and "| flurka-rnn" in logs, logs[-4000:]
        assert "Trials: 2 finished, 0 stopped early, 0 failed" in logs
        assert (run_dir / "mlflow.db").exists() and (run_dir / "results.db").exists()
        # the edit runs, from the job's unpacked working dir: in the driver and in the trials' workers
        marks = [line for line in logs.splitlines() if MARKER in line]
        driver = [m for m in marks if "pid=" not in m]
        workers = [m for m in marks if re.search(r"pid=\d+", m)]      # Ray's prefix on a worker's lines
        assert driver and workers, logs[-4000:]
        for m in marks:
            assert "working_dir_files" in m and str(ROOT) not in m and str(tree) not in m, m
        assert "flurka sweep: warning" not in logs, logs[-4000:]
        # what was submitted is what is recorded: the copy's HEAD, dirty
        assert f"flurka submit: source {head_sha[:12]}-dirty" in logs
        assert not (tree / ".flurka-source.json").exists()          # the stamp went with the upload only
        record = json.loads((run_dir / "sweep-record.json").read_text())
        assert record["git_commit"] == f"{head_sha[:12]}-dirty"
        with sqlite3.connect(run_dir / "results.db") as db:
            assert db.execute("SELECT git_commit FROM sweeps").fetchall() == [(f"{head_sha[:12]}-dirty",)]
        with sqlite3.connect(run_dir / "mlflow.db") as db:
            tags = db.execute("SELECT run_uuid, key, value FROM tags WHERE key IN "
                              "('mlflow.source.git.commit', 'flurka.git_dirty')").fetchall()
            params = db.execute("SELECT value FROM params WHERE key = 'git_commit'").fetchall()
        runs = {r for r, _, _ in tags}
        assert len(runs) >= 3                                      # the parent and its two trials
        assert sorted(tags) == sorted([(r, "mlflow.source.git.commit", head_sha) for r in runs]
                                      + [(r, "flurka.git_dirty", "true") for r in runs])
        assert params and set(params) == {(f"{head_sha[:12]}-dirty",)}
    finally:
        leftovers = stop_ray_node(head, temp_dir)
    assert not leftovers, f"head node processes survived the stop: {leftovers}"
