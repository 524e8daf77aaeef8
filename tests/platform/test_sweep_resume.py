"""``--resume``: a sweep whose driver is SIGKILLed mid-way is restored (``Tuner.restore``);
finished trials are not re-run, and MLflow and the results DB hold every trial once. Ctrl-C
stops a sweep in one line, from which ``--resume`` goes on; SIGTERM, with exit 143."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from testsupport import pids_naming

ROOT = Path(__file__).resolve().parents[2]


def _sweep(run_dir: Path, *extra: str, alphas: str = "0.25,0.5", **popen) -> subprocess.Popen:
    args = [sys.executable, str(ROOT / "experiments" / "uptrain_sweep.py"), "--benchmarks", "lra-listops-small",
            "--variants", "flurka-rnn", "--alphas", alphas, "--steps", "16", "--no-baselines",
            "--checkpoint-every", "4", "--num-cpus", "1", "--name", "resume", "--run-dir", str(run_dir),
            *[a for k, v in dict(warmup_steps=0, eval_every=0, log_every=2, batch_size=8, eval_batches=1,
                                 **{"model.d_model": 16, "model.d_ff": 32, "model.num_layers": 1}).items() for a in ("--set", f"{k}={v}")],
            *extra]
    return subprocess.Popen(args, cwd=ROOT, text=True, start_new_session=True,
                            **{"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, **popen})


def _wait_for(predicate, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"sweep ended (rc {proc.returncode}) before the interruption:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("sweep did not reach the interruption point in time")
        time.sleep(0.2)


@pytest.mark.slow
def test_resume_restores_an_interrupted_sweep(mlflow_runs):
    from mlflow.tracking import MlflowClient

    tmp = Path(tempfile.mkdtemp(prefix="frk-", dir="/tmp"))   # short: the embedded Ray's sockets live here
    run_dir = tmp / "run"
    try:
        proc = _sweep(run_dir)
        tune = run_dir / "tune"
        # Interrupt once the base run is done and the branches' experiment has saved its state.
        _wait_for(lambda: any(tune.glob("*-branches/experiment_state*.json")), proc, 420)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        time.sleep(3)
        for pid in pids_naming(str(run_dir)):                   # the driver's own Ray, if still alive
            os.kill(pid, signal.SIGKILL)

        (first,) = tune.glob("*-first")
        (base_trial,) = [p for p in first.iterdir() if (p / "result.json").exists()]
        base_results = (base_trial / "result.json").read_text()
        base_ckpts = run_dir / "work" / "base__lra-listops-small__linformer__s0__T16__dk16" / "checkpoints"
        before = {p: p.stat().st_mtime_ns for p in base_ckpts.rglob("*")}
        uri = f"sqlite:///{run_dir / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("resume")
        (base_run,) = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("flurka.kind") == "base"]
        assert base_run.info.run_name == "linformer dk=16 s0 base"
        assert base_run.info.status == "FINISHED"
        assert not (run_dir / "results.db").exists() or _count(run_dir) == 0   # nothing ingested yet

        resumed = _sweep(run_dir, "--resume")
        out, _ = resumed.communicate(timeout=480)
        assert resumed.returncode == 0, out
        assert "restoring first phase" in out and "restoring branches phase" in out and "Up-training α, lra-listops-small" in out

        # The finished base run was not run again: Tune results and checkpoints untouched.
        assert (base_trial / "result.json").read_text() == base_results
        assert {p: p.stat().st_mtime_ns for p in base_ckpts.rglob("*")} == before

        client, runs = mlflow_runs(uri, "resume")
        nested = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        keys = sorted(r.data.tags["flurka.trial_key"] for r in nested)   # found again by key, not by name
        assert keys == sorted({"base/lra-listops-small/linformer/s0/T16/dk16",
                               "branch/lra-listops-small/flurka-rnn/s0/T16/dk16/a0.25-linformer",
                               "branch/lra-listops-small/flurka-rnn/s0/T16/dk16/a0.5-linformer"})
        assert sorted(r.info.run_name for r in nested) == [
            "flurka-rnn a=0.25 dk=16 s0", "flurka-rnn a=0.5 dk=16 s0", "linformer dk=16 s0 base"]
        assert len(runs) == 4                                  # + the one sweep (parent) run
        for r in runs:
            if "mlflow.parentRunId" in r.data.tags:
                assert r.info.status == "FINISHED", r.info.run_name
                steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
                assert steps == sorted(set(steps)) and steps[-1] in (4, 8, 16), (r.info.run_name, steps)
        base_again = client.get_run(base_run.info.run_id)
        assert base_again.info.end_time == base_run.info.end_time
        assert _count(run_dir) == 2                            # the two branches, once each
    finally:
        for pid in pids_naming(str(run_dir)):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _stopped_in_the_branches(stop):
    """A sweep stopped by ``stop(proc)`` while its branches wait on the one CPU: yields (run dir,
    exit code, its output, its own lines on stderr), after checking no traceback was printed;
    what is left of it is killed after."""
    tmp = Path(tempfile.mkdtemp(prefix="frk-", dir="/tmp"))   # short: the embedded Ray's sockets live here
    run_dir = tmp / "run"
    try:
        proc = _sweep(run_dir, alphas="0.25,0.5,0.75", stderr=subprocess.PIPE)
        _wait_for(lambda: any((run_dir / "tune").glob("*-branches/experiment_state*.json")), proc, 420)
        stop(proc)
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in out + err, out + err
        yield run_dir, proc.returncode, out + err, [line for line in err.splitlines() if line.startswith("uptrain_sweep:")]
    finally:
        for pid in pids_naming(str(run_dir)):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_ctrl_c_stops_in_one_line_and_resume_finishes():
    """Ctrl-C (SIGINT to the sweep's process group, as a terminal sends it) while the branches
    wait on the one CPU: exit 130, the sweep's one line naming the phase and --resume, no
    traceback; the same command with --resume then trains the branches and prints the table."""
    with _stopped_in_the_branches(lambda proc: os.killpg(proc.pid, signal.SIGINT)) as (run_dir, code, out, ours):
        assert code == 130, out
        assert len(ours) == 1 and ours[0].startswith("uptrain_sweep: interrupted in the branches phase: "), out
        assert "never started" in ours[0] and "--resume" in ours[0], ours

        resumed = _sweep(run_dir, "--resume", alphas="0.25,0.5,0.75")
        out, _ = resumed.communicate(timeout=480)
        assert resumed.returncode == 0, out
        assert "restoring branches phase" in out and "Up-training α, lra-listops-small" in out
        assert _count(run_dir) == 3                            # the three branches, once each


@pytest.mark.slow
def test_sigterm_stops_in_one_line_with_exit_143():
    """SIGTERM to the driver alone (``kill PID``, a scheduler ending the job), which Ray's own
    handler turned into a native stack dump and exit 134 (issue 60): the sweep stops as Ctrl-C
    stops it, in one line naming --resume, exit 143, and no process of its cluster left behind."""
    with _stopped_in_the_branches(lambda proc: os.kill(proc.pid, signal.SIGTERM)) as (run_dir, code, out, ours):
        assert code == 143, out
        assert len(ours) == 1 and "branches phase" in ours[0] and "--resume" in ours[0], out
        deadline = time.monotonic() + 30
        while pids_naming(str(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not pids_naming(str(run_dir)), "the sweep's Ray processes outlived its driver"


def _count(run_dir: Path) -> int:
    with sa.create_engine(f"sqlite:///{run_dir / 'results.db'}").connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM trials")).scalar()


def test_an_interrupted_phase_is_one_line_and_exit_130(monkeypatch, capsys):
    """Tune stopped early (Ctrl-C) leaves trials that never started, without a config: the sweep
    says so in one line with the way on (--resume) and exits 130, not with a traceback."""
    import argparse
    from types import SimpleNamespace

    from flurka.sweeps import cli, runner

    ran = [SimpleNamespace(config={"cfg": {}}), SimpleNamespace(config=None), SimpleNamespace(config=None)]
    with pytest.raises(runner.SweepInterrupted, match=r"branches phase: 2 of 3 trials never started; "
                                                       r"runs/x keeps what finished.*--resume"):
        runner.check_all_started(ran, "branches", "runs/x")
    runner.check_all_started(ran[:1], "first", "runs/x")       # every trial started: nothing to say

    def interrupted(spec):
        runner.check_all_started(ran, "first", spec.run_path)

    monkeypatch.setattr(runner, "run_sweep", interrupted)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--config", "uptrain-small"])) == 130
    err = capsys.readouterr().err
    assert err.startswith("flurka sweep: interrupted in the first phase") and err.count("\n") == 1, err
    assert "Traceback" not in err
