"""Issue 60: a damaged checkpoint is named in one line (which file, and why), not a
``UnicodeDecodeError`` traceback; a checkpoint that does not fit the model stays Orbax's error."""

import os
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

from flurka.training.checkpoints import Checkpointer, CorruptCheckpoint

STATE = {"params": {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}, "opt": jnp.arange(3.0)}


def _saved(path):
    with Checkpointer(path) as ck:
        ck.save(2, STATE, {"step": 2, "attention": "rnn"})
    return path


def _data_file(step_dir):
    """One of the state item's array files (OCDBT data, named by hash)."""
    return next(os.path.join(step_dir, "state", "d", f) for f in sorted(os.listdir(os.path.join(step_dir, "state", "d"))))


@pytest.mark.parametrize("damage, part, reason", [
    ("garbage", "meta/metadata", r"not UTF-8 text \(byte 0xff at offset 0 of 10\)"),
    ("half", "meta/metadata", r"not valid JSON \(.*: line 1 column \d+ of \d+ bytes\)"),
    ("empty", "state/_METADATA", r"empty \(0 bytes\)"),
    ("deleted", "meta/metadata", r"missing"),
    ("half", "data", r"wrong size \(OUT_OF_RANGE: .*\)"),
    ("deleted", "data", r"missing \(NOT_FOUND\)"),
])
def test_damaged_step_names_its_file(tmp_path, damage, part, reason):
    step_dir = str(_saved(tmp_path / "ck") / "2")
    path = _data_file(step_dir) if part == "data" else os.path.join(step_dir, part)
    if damage == "garbage":
        open(path, "wb").write(b"\xff\xfe\x00garbage")
    elif damage == "half":
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    elif damage == "empty":
        open(path, "wb").close()
    else:
        os.remove(path)
    with Checkpointer(tmp_path / "ck") as ck, pytest.raises(CorruptCheckpoint) as err:
        ck.restore(2, STATE)
    assert err.value.path == path
    assert str(err.value) == f"corrupt checkpoint {path}: {err.value.reason}"
    assert "\n" not in str(err.value)
    assert re.fullmatch(reason, err.value.reason), err.value.reason


def test_a_checkpoint_of_another_model_is_no_corruption(tmp_path):
    _saved(tmp_path / "ck")
    other = {**STATE, "params": {"w": jnp.ones((4, 5)), "b": jnp.zeros(4)}}
    with Checkpointer(tmp_path / "ck") as ck, pytest.raises(ValueError, match="not compatible") as err:
        ck.restore(2, other)
    assert not isinstance(err.value, CorruptCheckpoint)


def test_flurka_train_resuming_a_corrupt_checkpoint_says_which_file(tmp_path):
    """``flurka train --workdir W`` resuming from a checkpoint whose metadata was overwritten:
    exit 2 and one line naming the file, no traceback (was a UnicodeDecodeError traceback)."""
    from flurka.training import get_config, run

    workdir = tmp_path / "run"
    tiny = dict(batch_size=4, eval_every=0, eval_batches=1, warmup_steps=0)
    run(get_config("lra-listops-small", steps=2, workdir=str(workdir), checkpoint_every=2, **tiny,
                   model=dict(attention="rnn", d_model=16, d_ff=32, num_layers=1)))
    damaged = workdir / "checkpoints" / "2" / "meta" / "metadata"
    assert damaged.is_file()
    damaged.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))

    env = {**{k: v for k, v in os.environ.items() if k != "FLURKA_DEBUG"}, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "flurka.cli", "train", "--benchmark", "lra-listops-small", "--attention", "rnn",
         "--steps", "4", "--workdir", str(workdir), "--checkpoint-every", "2", "--no-progress",
         "--compilation-cache", "off", *[a for k, v in tiny.items() for a in ("--set", f"{k}={v}")],
         "--set", "model.d_model=16", "--set", "model.d_ff=32", "--set", "model.num_layers=1"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("flurka train:")]
    assert ours == [f"flurka train: error: corrupt checkpoint {damaged}: not UTF-8 text "
                    "(byte 0x89 at offset 0 of 264)"], proc.stderr
