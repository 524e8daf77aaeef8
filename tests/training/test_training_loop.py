"""The loop end to end on tiny models: resume bit for bit, divergence, FLOP accounting, CLI."""

import argparse
import json
import math

import pytest
from training_helpers import tiny

from flurka.training import flops as flops_lib
from flurka.training import run


class Stop(Exception):
    pass


def _stop_at(step):
    def callback(kind, entry):
        if kind == "train" and entry["step"] == step:
            raise Stop
    return callback


def _strip(result):
    return {k: v for k, v in result.items() if k not in ("wall_time_s", "time_split")}


def test_resume_from_checkpoint_is_bit_for_bit(tmp_path, digits):
    # random features + dropout: both must come back identically after the restart
    config = tiny(steps=8, eval_every=4, model=dict(attention="flurka-performer"))
    straight = run(config, dataset=digits)
    ckpt = config.replace(workdir=str(tmp_path / "run"), checkpoint_every=3)
    with pytest.raises(Stop):                       # "crash" after step 5: checkpoint at 3
        run(ckpt, dataset=digits, callback=_stop_at(5))
    resumed = run(ckpt, dataset=digits)
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in straight["history"]]
    assert _strip(resumed) | {"config": None} == _strip(straight) | {"config": None}
    assert len(straight["history"]) == 8 and straight["eval_history"][0]["step"] == 4
    # and a finished run's workdir just gives the same result back
    assert _strip(run(ckpt, dataset=digits))["final_metrics"] == straight["final_metrics"]


def test_checkpoints_at_the_interval_and_at_the_named_steps(tmp_path, digits):
    """checkpoint_steps (where branches fork) are saved besides every checkpoint_every-th step: a
    500-step base forking at 62, 188 and 438 had saved every 2nd step (their gcd with T/8)."""
    from flurka.training.checkpoints import Checkpointer

    config = tiny(steps=10, workdir=str(tmp_path / "run"), checkpoint_every=4, checkpoint_steps=(3, 7), model=dict(attention="rnn"))
    assert run(config, dataset=digits)["status"] == "ok"
    assert sorted(Checkpointer(str(tmp_path / "run" / "checkpoints")).steps()) == [3, 4, 7, 8, 10]


def test_a_classification_run_reports_its_chance_line(digits):
    """The eval split's most frequent class, as a share of it: the accuracy no model may claim."""
    result = run(tiny(steps=2, eval_batches=0, model=dict(attention="rnn")), dataset=digits)
    assert result["final_metrics"]["majority_accuracy"] == pytest.approx(digits.class_distribution("eval").max())
    assert result["final_metrics"]["majority_accuracy"] < 0.15                # ten digit classes


def _sums_to_wall(split, wall):
    assert split and all(v >= 0 for v in split.values()), split
    assert sum(split.values()) == pytest.approx(wall, rel=0.03, abs=0.02), (split, wall)


def test_time_split_covers_the_wall_time(tmp_path, digits):
    # up-training (base, hand-over, variant: each phase's first step apart), evals, checkpoints,
    # a callback
    config = tiny(base="kernel", alpha=0.5, steps=8, eval_every=4, log_every=2, workdir=str(tmp_path / "run"),
                  checkpoint_every=3, model=dict(attention="flurka-rnn"))
    phases = {"compile/rnn", "compile/rnn-to-flurka-rnn", "compile/flurka-rnn"}
    with pytest.raises(Stop) as stopped:            # stopped from the callback after step 6
        run(config, dataset=digits, callback=_stop_at(6))
    assert set(stopped.value.time_split) >= {"data", "compile/rnn", "checkpoints", "report"}
    result = run(config, dataset=digits, callback=lambda kind, entry: None)   # resumed from step 6
    split = result["time_split"]
    assert set(split) == {"data", "setup", *phases, "train_steps", "eval", "checkpoints", "report"}, split
    _sums_to_wall(split, result["wall_time_s"])     # wall and split both carry the first attempt
    # resumed at step 3 (the checkpoint), still in the base phase: its first step there adds on
    assert split["compile/rnn"] > stopped.value.time_split["compile/rnn"]
    plain = run(tiny(model=dict(attention="full")), dataset=digits)
    assert set(plain["time_split"]) == {"data", "setup", "compile/full", "train_steps", "eval", "checkpoints"}
    _sums_to_wall(plain["time_split"], plain["wall_time_s"])


def test_divergence_ends_the_run_with_history_kept(digits):
    config = tiny(learning_rate=1e5, grad_clip=None, steps=40, warmup_steps=0, schedule="constant", log_every=1,
                  model=dict(attention="full"))
    result = run(config, dataset=digits)
    assert result["status"].startswith("diverged at step "), result["status"]
    k = int(result["status"].rsplit(" ", 1)[1])
    assert 1 < k <= 40 and result["steps"] == k
    assert [h["step"] for h in result["history"]] == list(range(1, k))
    assert all(math.isfinite(h["loss"]) for h in result["history"])
    json.dumps(result, allow_nan=False)             # strictly JSON-serializable


def test_flops_accumulate_linearly(digits):
    config = tiny(steps=6, log_every=2, eval_every=3, model=dict(attention="flurka-rnn"))
    result = run(config, dataset=digits)
    batch = next(digits.train_batches(config.batch_size))
    per_step = flops_lib.train_step_flops(config, digits.info, {k: v.shape for k, v in batch.items()})
    assert per_step == 3 * flops_lib.forward_flops(config, digits.info, {k: v.shape for k, v in batch.items()})
    assert [h["train_flops"] for h in result["history"]] == [2 * per_step, 4 * per_step, 6 * per_step]
    assert [e["train_flops"] for e in result["eval_history"]] == [3 * per_step, 6 * per_step]
    assert result["train_flops"] == 6 * per_step
    # the count is the mechanism's: another attention logs another per-step count
    shapes = {k: v.shape for k, v in batch.items()}
    lin, full = (flops_lib.train_step_flops(config.replace(model=dict(attention=m)), digits.info, shapes)
                 for m in ("linformer", "full"))
    assert 0 < lin != full and per_step not in (lin, full)


def _cli(argv):
    from flurka.training import cli
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def test_cli_prints_final_metrics_as_json(capsys):
    code = _cli(["--benchmark", "lra-image-small", "--attention", "rnn", "--steps", "3", "--json",
                 "--no-progress", "--set", "model.d_model=16", "--set", "model.num_layers=1", "--set", "batch_size=8",
                 "--set", "eval_batches=1", "--d-k", "8"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "ok" and out["steps"] == 3
    assert out["attention"] == "rnn" and 0.0 <= out["final_metrics"]["accuracy"] <= 1.0
    assert out["config"]["model"]["attention_options"]["d_k"] == 8


def test_cli_rejects_bad_input_in_one_line(capsys):
    code = _cli(["--benchmark", "lra-image-small", "--attention", "softmax", "--steps", "3"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "valid: full, flash, linformer" in err


def test_a_stop_between_steps_checkpoints_that_step_and_the_rerun_resumes(tmp_path, digits):
    """Issue 60: Ctrl-C in `flurka train` was a traceback with nothing saved at the interrupt.
    ``stop`` (what the CLI's signal handler sets) ends the run after the step it is on, saved,
    and the same config resumes from there to the uninterrupted run's result."""
    import threading

    from flurka.training.loop import Stopped

    config = tiny(steps=6, workdir=str(tmp_path / "w"), checkpoint_every=6)
    stop = threading.Event()

    def set_stop(kind, entry):
        if kind == "train" and entry["step"] == 2:
            stop.set()

    with pytest.raises(Stopped) as info:
        run(config.replace(log_every=1), dataset=digits, callback=set_stop, stop=stop)
    assert (info.value.step, info.value.saved) == (2, True)
    assert sorted(p.name for p in (tmp_path / "w" / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
    resumed = run(config.replace(log_every=1), dataset=digits)
    straight = run(config.replace(log_every=1, workdir=None, checkpoint_every=0), dataset=digits)
    assert resumed["steps"] == 6 and resumed["final_metrics"] == straight["final_metrics"]


@pytest.mark.slow
def test_sigint_to_flurka_train_is_one_line_and_exit_130(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    work = tmp_path / "w"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flurka.cli", "train", "--benchmark", "lra-listops-small", "--attention", "rnn",
         "--steps", "100000", "--workdir", str(work), "--checkpoint-every", "5", "--no-progress",
         "--set", "model.d_model=16", "--set", "model.d_ff=32", "--set", "model.num_layers=1", "--set", "eval_every=0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 240
    while not (work / "checkpoints" / "5").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    first, last = err.strip().splitlines()
    assert first == "flurka train: SIGINT: stopping after this step (again to stop now)"
    assert last.startswith("flurka train: stopped at step ") and "the same command resumes from it" in last
    step = int(last.split("stopped at step ")[1].split()[0])
    assert (work / "checkpoints" / str(step)).exists() and out == ""
