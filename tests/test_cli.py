"""The ``flurka`` console script's own surface: its version, and help for every sweep flag."""

from __future__ import annotations

import argparse
import importlib.metadata

import pytest
from testsupport import flurka

from flurka.cli import SUBCOMMANDS


def test_version_is_the_installed_package(tmp_path):
    code, out, _ = flurka(["--version"], tmp_path)
    assert (code, out.strip()) == (0, f"flurka {importlib.metadata.version('flurka')}")


def test_every_sweep_flag_says_what_it_does():
    """A flag without help is a flag a user has to read the source for (issue 59)."""
    from flurka.sweeps.spec import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert not bare, f"sweep flags without help: {bare}"


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_a_flag_argparse_refuses_is_one_line_in_every_subcommand(command, tmp_path):
    """Issue 60: argparse's 6-16 line usage block was the answer to a typo in five subcommands."""
    code, out, err = flurka([command, "--no-such-flag", "x" * 1000], tmp_path)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"flurka {command}: error: ")
    assert "x" * 81 not in line                       # the 1000-character value, where named, cut to 80


def test_an_unknown_flag_is_named_by_the_subcommand_with_its_value_cut(tmp_path):
    code, _, err = flurka(["ui", "--no-such-flag", "x" * 1000], tmp_path)
    assert code == 2
    assert err == f"flurka ui: error: unrecognized arguments: --no-such-flag {'x' * 80}…\n"


def test_a_missing_subcommand_is_one_line(tmp_path):
    code, _, err = flurka([], tmp_path)
    assert code == 2 and err.count("\n") == 1 and err.startswith("flurka: error: ")


def test_ui_on_a_tracking_server_says_open_it_and_starts_nothing(tmp_path):
    """Issue 58: flurka ui --backend-store-uri http://… was two tracebacks from MLflow's UI."""
    code, out, err = flurka(["ui", "--backend-store-uri", "http://ml:secret@127.0.0.1:1/"], tmp_path)
    assert (code, err) == (0, "")
    assert out == "flurka ui: http://ml@127.0.0.1:1/ is already a tracking server: open it in a browser\n"


@pytest.mark.parametrize("argv,flag", [
    (["train", "--benchmark", "lra-listops-small", "--steps", "2", "--workdir", "{out}"], "--workdir"),
    (["theory", "--out", "{out}"], "--out"),
    (["speed", "--sweep", "tiny", "--out", "{out}"], "--out"),
    (["report", "--out", "{out}"], "--out"),
])
def test_an_output_that_cannot_be_written_is_one_line_before_any_compute(argv, flag, tmp_path):
    """Issue 60: an output under a file was a traceback after the work (theory, train's
    checkpoints) or never checked (train without --checkpoint-every)."""
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "out"
    code, stdout, err = flurka([a.replace("{out}", str(out)) for a in argv], tmp_path)
    assert (code, stdout) == (2, ""), err
    prefix = f"flurka {argv[0]}: " + ("" if argv[0] == "report" else "error: ")   # report's lines, as tables'
    assert err.splitlines() == [f"{prefix}{flag} {out}: {tmp_path / 'afile'} is not a directory"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_train_workdir_holds_the_run_without_checkpoint_every(tmp_path):
    """--workdir alone used to save nothing while the user believed the run could resume."""
    code, _, err = flurka(["train", "--benchmark", "lra-listops-small", "--steps", "2", "--set", "model.d_model=16",
                           "--set", "model.d_ff=32", "--set", "model.num_layers=1", "--set", "eval_batches=1",
                           "--workdir", str(tmp_path / "w"), "--no-progress"], tmp_path)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "w" / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]


def test_a_reader_that_leaves_early_is_no_error(tmp_path):
    """``python -m flurka.speed --sweep n-sweep --list | head -1``: the listing stops where the reader
    left, exit 0, no BrokenPipeError traceback; a broken pipe that is not standard output's stays an
    error (tested through the check itself)."""
    import subprocess
    import sys

    from flurka import cli

    proc = subprocess.Popen([sys.executable, "-m", "flurka.speed", "--sweep", "n-sweep", "--list"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    first = proc.stdout.readline()
    proc.stdout.close()                      # the reader leaves after one line
    _, err = proc.communicate(timeout=120)
    assert first.startswith("0 Point(") and proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert not cli._stdout_reader_gone()     # pytest's own stdout: open
