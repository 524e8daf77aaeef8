"""Issue 60: a corrupt checkpoint under ``--resume`` was six ``UnicodeDecodeError`` tracebacks,
each α branch retried on a failure no retry can mend, and then only "failed". Now the trial ends at
once, the driver names the damaged file in one line, and the results DB and MLflow keep why."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest
import sqlalchemy as sa

from flurka.sweeps.spec import SweepSpec

BASE = "base/lra-listops-small/linformer/s0/T16/dk16"
BRANCH = "branch/lra-listops-small/flurka-rnn/s0/T16/dk16/a0.25-linformer"      # forks at step 4
HEALTHY = "branch/lra-listops-small/flurka-rnn/s0/T16/dk16/a0.5-linformer"      # forks at step 8


def _counting_callback(log: Path, stop: Path):
    """The sweep's MLflow callback, writing each trial's starts, retries and errors to ``log``;
    a SIGTERM to the driver once the base run is done while ``stop`` exists (the sweep stops after
    its first phase, for --resume). Files, not a dict: a restored Tuner unpickles its callback,
    and cloudpickle then rebinds this class's methods to a copy of whatever they close over."""
    from flurka.tracking import callback as cb

    class Counting(cb.MLflowTrialCallback):
        def _note(self, event: str, trial) -> None:
            with open(log, "a") as f:
                f.write(f"{event} {self.resolve(trial.config)['run']['key']}\n")

        def on_trial_start(self, iteration, trials, trial, **info):
            super().on_trial_start(iteration, trials, trial, **info)
            self._note("start", trial)

        def on_trial_recover(self, iteration, trials, trial, **info):
            self._note("recover", trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            super().on_trial_error(iteration, trials, trial, **info)
            self._note("error", trial)

        def on_trial_complete(self, iteration, trials, trial, **info):
            super().on_trial_complete(iteration, trials, trial, **info)
            if self.resolve(trial.config)["run"]["key"] == BASE and stop.exists():
                stop.unlink()
                os.kill(os.getpid(), signal.SIGTERM)

    return Counting


@pytest.mark.slow
def test_corrupt_base_checkpoint_on_resume_fails_its_branch_once(tmp_path, tiny_overrides, mlflow_runs,
                                                                  monkeypatch, capfd):
    from flurka.sweeps import runner
    from flurka.sweeps.runner import SweepInterrupted, run_sweep, summary
    from flurka.sweeps.trainable import checkpoint_dir

    log, stop = tmp_path / "attempts.log", tmp_path / "stop"
    stop.touch()
    monkeypatch.setattr(runner, "MLflowTrialCallback", _counting_callback(log, stop))
    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.25, 0.5), steps=16,
                     overrides=tiny_overrides, baselines=False, checkpoint_every=4, max_failures=2,
                     run_dir=str(tmp_path / "run"), num_cpus=1, name="corrupt")
    with pytest.raises(SweepInterrupted, match="terminated in the first phase"):
        run_sweep(spec)

    # The fork checkpoint of the 0.25 branch overwritten (the UnicodeDecodeError)
    damaged = checkpoint_dir(tmp_path / "run", BASE) / "4" / "meta" / "metadata"
    assert damaged.is_file()
    damaged.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    line = f"corrupt checkpoint {damaged}: not UTF-8 text (byte 0x89 at offset 0 of 264)"
    assert not stop.exists()
    capfd.readouterr()
    log.unlink()

    out = run_sweep(dataclasses.replace(spec, resume=True))
    captured = capfd.readouterr()
    printed = captured.out + captured.err

    assert out.failed == [BRANCH] and out.failures == {BRANCH: line}
    assert sorted(out.results) == [BASE, HEALTHY]                  # its sibling forks from step 8, unharmed
    events = log.read_text().splitlines()
    assert [e for e in events if e.endswith(BRANCH)] == [f"start {BRANCH}"]   # one attempt: no retry, no error
    ours = [s for s in printed.splitlines() if "corrupt checkpoint" in s]
    assert ours == [f"[flurka] {line}; not retried, failed: flurka-rnn a=0.25 dk=16 s0"], printed
    assert "Traceback" not in printed and "UnicodeDecodeError" not in printed, printed
    assert f"1 failed: {BRANCH}" in summary(out)

    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text("select trial_key, status from trials")).all())
    engine.dispose()
    assert rows == {BRANCH: f"failed: {line}", HEALTHY: "ok"}

    _, runs = mlflow_runs(out.mlflow_uri, "corrupt")
    (failed,) = [r for r in runs if r.data.tags.get("flurka.trial_key") == BRANCH]
    assert failed.info.status == "FAILED"
    assert failed.data.tags["flurka.status"] == f"failed: {line}"
