"""The README's cluster path end to end: a Ray head node on free ports (own temp dir, dashboard
on loopback, auth disabled: a loopback-only dev cluster), ``ray job submit`` of a tiny sweep,
the up-training table in the job's logs; the head is stopped by its process group, never
``ray stop``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from testsupport import pids_naming, ray_node_ports

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXCLUDES = [".venv", ".git", "runs", "**/__pycache__", ".pytest_cache", ".ruff_cache", "*.db"]
TINY = ["--benchmarks", "lra-listops-small", "--variants", "flurka-rnn", "--alphas", "0.5", "--steps", "4",
        "--no-baselines", "--name", "job",
        *[a for k, v in dict(warmup_steps=0, eval_every=0, log_every=2, batch_size=8, eval_batches=1, d_model=16,
                             d_ff=32, num_layers=1).items() for a in ("--set", f"{k}={v}")]]


def _wait_http(url: str, head: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if head.poll() is not None:
            raise AssertionError(f"ray start exited with {head.returncode}:\n{head.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"dashboard at {url} did not come up in {timeout_s:.0f}s")
        time.sleep(1)


@pytest.mark.slow
def test_ray_job_submit_runs_the_sweep(tmp_path):
    temp_dir = tempfile.mkdtemp(prefix="frk-", dir="/tmp")       # short: unix sockets live here
    port_flags, ports = ray_node_ports(head=True)
    dash = ports["dashboard-port"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               RAY_USAGE_STATS_ENABLED="0")
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", *port_flags,
         "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
         "--num-cpus", "2", "--temp-dir", temp_dir, "--disable-usage-stats"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        address = f"http://127.0.0.1:{dash}"
        _wait_http(f"{address}/api/version", head, 180)
        run_dir = tmp_path / "run"
        job = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(ROOT),
             "--runtime-env-json", json.dumps({"excludes": EXCLUDES}), "--",
             "python", "experiments/uptrain_sweep.py", *TINY, "--run-dir", str(run_dir)],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=480)
        logs = job.stdout + job.stderr
        assert job.returncode == 0, logs[-4000:]
        assert "succeeded" in logs, logs[-4000:]
        assert "Up-training α, lra-listops-small" in logs and "| flurka-rnn" in logs, logs[-4000:]
        assert "Trials: 2 finished, 0 stopped early, 0 failed" in logs
        assert (run_dir / "mlflow.db").exists() and (run_dir / "results.db").exists()
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)                  # `ray start --block` stops what it started
            try:
                head.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
                head.wait(10)
        time.sleep(2)
        leftovers = pids_naming(temp_dir)
        for pid in leftovers:                                    # only processes of this head node
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not leftovers, f"head node processes survived the stop: {leftovers}"
