"""Failures that must stop a sweep before any trial, with one line; and `flurka ui`."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from flurka.cluster import ClusterError, check_reachable, check_resources, worker_env
from flurka.results import DatabaseUnreachable
from flurka.sweeps.runner import preflight
from flurka.sweeps.spec import SweepSpec
from flurka.tracking import cli as ui_cli
from testsupport import free_ports

ROOT = Path(__file__).resolve().parents[2]


def test_unreachable_cluster_is_one_line():
    port = free_ports(1)[0]
    with pytest.raises(ClusterError) as info:
        check_reachable(f"127.0.0.1:{port}", timeout_s=1)
    assert "unreachable" in str(info.value) and "\n" not in str(info.value)


def test_gpus_requested_where_none_exist():
    with pytest.raises(ClusterError, match="no GPUs"):
        check_resources({"CPU": 2.0}, cpus_per_trial=1, gpus_per_trial=0.25)
    check_resources({"CPU": 2.0, "GPU": 1.0}, cpus_per_trial=1, gpus_per_trial=0.25)
    with pytest.raises(ClusterError, match="CPUs"):
        check_resources({"CPU": 2.0}, cpus_per_trial=4, gpus_per_trial=0)


def test_fractional_gpus_share_memory():
    assert worker_env(0.25).get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false"
    assert worker_env(1.0) == {}


def _script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "uptrain_sweep.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_unreachable_results_db_fails_in_preflight(tmp_path):
    spec = SweepSpec(benchmarks=("lra-listops-small",), run_dir=str(tmp_path / "run"),
                     results_db="sqlite:////nonexistent/dir/results.db")
    with pytest.raises(DatabaseUnreachable, match="cannot reach") as info:
        preflight(spec)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("args,needle", [
    (["--benchmarks", "lra-nope"], "unknown benchmark 'lra-nope'"),
    (["--benchmarks", "lra-listops-small", "--address", "127.0.0.1:{port}"], "unreachable"),
])
def test_bad_sweeps_fail_before_any_trial(tmp_path, args, needle):
    args = [a.replace("{port}", str(free_ports(1)[0])) for a in args]
    proc = _script(*args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()   # nothing left that a plain rerun would refuse


def test_flurka_ui_binds_loopback(tmp_path):
    (tmp_path / "mlflow.db").write_bytes(b"")
    parser = argparse.ArgumentParser()
    ui_cli.add_arguments(parser)
    cmd = ui_cli.command(parser.parse_args(["--run-dir", str(tmp_path), "--port", "5123"]))
    assert cmd[1:4] == ["-m", "mlflow", "ui"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "5123"
    assert cmd[cmd.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path / 'mlflow.db'}"
    missing = parser.parse_args(["--run-dir", str(tmp_path / "nothing")])
    assert ui_cli.run(missing) == 2


def test_new_moves_the_previous_sweep_aside_once_every_check_passed(tmp_path, capsys):
    """``--new`` on a run dir that holds a sweep: the old run dir becomes <run-dir>.<sweep id>,
    whole, and the new sweep starts in an empty one; a bad spec moves nothing."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    (run / "sweep.json").write_text(json.dumps({"sweep_id": "uptrain-7", "spec": {}}))
    (run / "results.db").write_bytes(b"")
    bad = SweepSpec(benchmarks=("lra-listops-small",), run_dir=str(run), new=True,
                    results_db="sqlite:////nonexistent/dir/results.db")
    with pytest.raises(DatabaseUnreachable):
        preflight(bad)
    assert (run / "sweep.json").exists() and not (tmp_path / "run.uptrain-7").exists()
    spec, _, engine = preflight(SweepSpec(benchmarks=("lra-listops-small",), run_dir=str(run), new=True))
    engine.dispose()
    aside = tmp_path / "run.uptrain-7"
    assert sorted(p.name for p in aside.iterdir()) == ["results.db", "sweep.json"]
    assert not (run / "sweep.json").exists()
    assert f"moved the previous sweep to {aside}" in capsys.readouterr().out
