"""A broken sweep spec or store must not start Ray (issue 40): one line on stderr, exit 2, no
traceback, nothing created or changed on disk, ``ray.init`` never called.

``CASES`` is the table: one row per bad input a user can give the sweep. The next case is one
more row: its YAML (or None), its flags, what the one line must say, and (optionally) a setup
that makes the files the case needs before the disk is snapshotted. In the rows ``{tmp}`` is the
test's directory, ``{port}`` a free (closed) port.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from testsupport import free_ports

ROOT = Path(__file__).resolve().parents[2]
BENCH = "benchmarks: [lra-listops-small]\n"


# -- the files some rows need -------------------------------------------------------------------

def _text_file(tmp: Path, name: str = "notdb.db") -> None:
    (tmp / name).write_text("id,loss\n1,0.5\n")            # a CSV, say: no SQLite database


def _corrupt_db(tmp: Path, name: str = "corrupt.db") -> None:
    """A real results database with its first page (the schema) overwritten."""
    from flurka.results import db

    path = tmp / name
    db.upgrade(f"sqlite:///{path}").dispose()
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)
    path.write_bytes(bytes(data))


def _masked_sweep(tmp: Path) -> None:
    """A run dir whose sweep.json stored a password-bearing --results-db, masked."""
    run = tmp / "run"
    run.mkdir()
    (run / "sweep.json").write_text(json.dumps({
        "sweep_id": "uptrain-1", "created_at": "2026-12-01T00:00:00+00:00", "masked": ["results_db"],
        "spec": {"benchmarks": ["lra-listops-small"], "results_db": "postgresql://me@db-host/flurka"}}))


def _stored_sweep(tmp: Path) -> None:
    """A run dir holding a finished 600-step sweep."""
    run = tmp / "run"
    run.mkdir()
    (run / "sweep.json").write_text(json.dumps({
        "sweep_id": "uptrain-2", "created_at": "2026-12-01T00:00:00+00:00", "masked": [],
        "spec": {"benchmarks": ["lra-listops-small"], "steps": 600, "seeds": [0]}}))


def _read_only_dir(tmp: Path) -> None:
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o555)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    yaml: str | None               # the --config file's text (None: no file)
    args: tuple[str, ...]          # flags after --config (``--run-dir {tmp}/run`` is added unless given)
    needle: str                    # what the one line says
    setup: Callable[[Path], None] | None = None
    root_can: bool = False         # root writes anyway (permission bits): skipped as root


CASES = [
    # -- wrong types in the YAML file
    Case("yaml-seeds-float", BENCH + "seeds: 0.5\n", (), "seeds must be integers"),
    Case("yaml-steps-word", BENCH + "steps: twenty\n", (), "steps must be an integer, got 'twenty'"),
    Case("yaml-key-twice", BENCH + "steps: 20\nsteps: 30\n", (), "the key 'steps' is given twice (line 3, column 1)"),
    Case("yaml-nested-key-twice", BENCH + "base: {flurka-rnn: kernel, flurka-rnn: low-rank}\n", (),
         "the key 'flurka-rnn' is given twice"),
    Case("yaml-alphas-word", BENCH + "alphas: half\n", (), "alphas must be numbers"),
    Case("yaml-cpus-word", BENCH + "cpus_per_trial: one\n", (), "cpus_per_trial must be a number"),
    Case("yaml-overrides-list", BENCH + "overrides: [1, 2]\n", (), "overrides must be a mapping"),
    Case("yaml-resume-string", BENCH + "resume: 'yes'\n", (), "resume must be true or false"),
    Case("yaml-benchmarks-number", "benchmarks: 7\n", (), "benchmarks must be names"),
    Case("yaml-override-value", BENCH + "overrides: {learning_rate: -1}\n", (), "learning_rate must be > 0"),
    Case("yaml-unknown-key", BENCH + "learning_rat: 3\n", (), "unknown key 'learning_rat'"),
    # -- files that are no sweep spec
    Case("yaml-malformed", "benchmarks: [lra-listops-small\nseeds: [0]\n", (), "is not valid YAML"),
    Case("yaml-python-tag", "benchmarks: !!python/object/apply:os.system ['touch {tmp}/pwned']\n", (),
         "could not determine a constructor for the tag"),
    Case("yaml-not-a-mapping", "- lra-listops-small\n", (), "must hold a mapping"),
    Case("yaml-missing-file", None, ("--config", "{tmp}/nope.yaml"), "cannot read sweep file"),
    Case("config-unknown-name", None, ("--config", "uptrain-smal"),
         "--config uptrain-smal: no such file, nor a sweep config installed with flurka; "
         "installed: paper-quality-glue, paper-quality-image, paper-quality-lra, paper-quality-mlm, paper-quality-nmt, paper-uptrain, "
         "uptrain-full, uptrain-small"),
    # -- wrong flags
    Case("flag-seeds-float", None, ("--benchmarks", "lra-listops-small", "--seeds", "0.5"),
         "--seeds must be integers"),
    Case("flag-steps-word", None, ("--benchmarks", "lra-listops-small", "--steps", "twenty"),
         "--steps must be an integer"),
    Case("flag-steps-huge", None, ("--benchmarks", "lra-listops-small", "--steps", "100000000000000000000"),
         "--steps must be in [1, 2147483647], got 100000000000000000000"),
    Case("flag-name-path", None, ("--benchmarks", "lra-listops-small", "--name", "../../etc"),
         "--name must be 1-100 letters, digits, '.', '_' or '-' (one folder name), got '../../etc'"),
    Case("flag-name-long", None, ("--benchmarks", "lra-listops-small", "--name", "n" * 600),
         "--name must be 1-100 letters"),
    Case("flag-gpus-word", None, ("--benchmarks", "lra-listops-small", "--gpus-per-trial", "half"),
         "--gpus-per-trial must be a number"),
    Case("flag-num-cpus-zero", None, ("--benchmarks", "lra-listops-small", "--num-cpus", "0"),
         "--num-cpus must be >= 1"),
    Case("flag-max-failures-negative", None, ("--benchmarks", "lra-listops-small", "--max-failures", "-1"),
         "--max-failures must be >= 0"),
    Case("flag-set-no-value", None, ("--benchmarks", "lra-listops-small", "--set", "learning_rate"),
         "--set expects FIELD=VALUE"),
    Case("flag-set-malformed", None, ("--benchmarks", "lra-listops-small", "--set", "attention_options={d_k: 16"),
         "--set attention_options: cannot parse"),
    Case("flag-set-unknown-field", None, ("--benchmarks", "lra-listops-small", "--set", "learning_rat=1e-3"),
         "unknown config field(s) ['learning_rat']"),
    Case("flag-set-batch-cannot-fit", None,
         ("--benchmarks", "lra-listops-small", "--set", "batch_size=100000000"),
         "benchmark 'lra-listops-small': batch_size=100000000 cannot fit: one lra-listops-small "
         "training step needs at least"),
    Case("flag-unknown", None, ("--benchmarks", "lra-listops-small", "--stepz", "3"),
         "unrecognized arguments: --stepz 3"),
    Case("flag-bad-choice", None, ("--benchmarks", "lra-listops-small", "--base", "sparse"),
         "unknown base 'sparse'; valid: low-rank, kernel"),
    # -- directories the sweep cannot write
    Case("compilation-cache-is-a-file", None,
         ("--benchmarks", "lra-listops-small", "--compilation-cache", "{tmp}/cache.bin"),
         "--compilation-cache {tmp}/cache.bin: {tmp}/cache.bin is not a directory",
         setup=lambda t: (t / "cache.bin").write_bytes(b"\0" * 8)),
    Case("run-dir-is-a-file", None, ("--benchmarks", "lra-listops-small", "--run-dir", "{tmp}/afile"),
         "--run-dir {tmp}/afile: {tmp}/afile is not a directory",
         setup=lambda t: (t / "afile").write_text("x")),
    Case("run-dir-under-a-file", None, ("--benchmarks", "lra-listops-small", "--run-dir", "{tmp}/afile/run"),
         "--run-dir {tmp}/afile/run: {tmp}/afile is not a directory",
         setup=lambda t: (t / "afile").write_text("x")),
    Case("run-dir-read-only", None, ("--benchmarks", "lra-listops-small", "--run-dir", "{tmp}/ro/run"),
         "--run-dir {tmp}/ro/run: {tmp}/ro is not writable", setup=_read_only_dir, root_can=True),
    Case("run-dir-cannot-be-created", None, ("--benchmarks", "lra-listops-small", "--run-dir", "/proc/flurka-40/run"),
         "--run-dir /proc/flurka-40/run: cannot create it"),
    # -- stores that are not databases, or do not answer
    Case("results-db-text-file", None, ("--benchmarks", "lra-listops-small", "--results-db", "sqlite:///{tmp}/notdb.db"),
         "cannot open sqlite:///{tmp}/notdb.db: file is not a database", setup=_text_file),
    Case("results-db-corrupt", None, ("--benchmarks", "lra-listops-small", "--results-db", "sqlite:///{tmp}/corrupt.db"),
         "cannot open sqlite:///{tmp}/corrupt.db: database disk image is malformed", setup=_corrupt_db),
    Case("results-db-directory-missing", None,
         ("--benchmarks", "lra-listops-small", "--results-db", "sqlite:///{tmp}/no/such/results.db"),
         "cannot reach sqlite:///{tmp}/no/such/results.db: directory {tmp}/no/such does not exist"),
    Case("mlflow-directory-missing", None,
         ("--benchmarks", "lra-listops-small", "--mlflow-uri", "sqlite:///{tmp}/no/such/mlflow.db"),
         "MLflow store: cannot reach sqlite:///{tmp}/no/such/mlflow.db: directory {tmp}/no/such does not exist"),
    Case("results-db-a-directory", None, ("--benchmarks", "lra-listops-small", "--results-db", "sqlite:///{tmp}"),
         "--results-db {tmp} is not a file"),
    Case("results-db-unreachable-server", None,
         ("--benchmarks", "lra-listops-small", "--results-db", "postgresql://u:secret@127.0.0.1:{port}/x"),
         "cannot reach postgresql://u@127.0.0.1:{port}/x"),
    Case("mlflow-sqlite-text-file", None, ("--benchmarks", "lra-listops-small", "--mlflow-uri", "sqlite:///{tmp}/notdb.db"),
         "MLflow store: cannot open sqlite:///{tmp}/notdb.db: file is not a database", setup=_text_file),
    Case("mlflow-file-store", None, ("--benchmarks", "lra-listops-small", "--mlflow-uri", "file://{tmp}/mlruns"),
         "MLflow store 'file://{tmp}/mlruns': not a database or server; MLflow 3 keeps no new runs in file stores"),
    Case("cpus-beyond-embedded-ray", None,
         ("--benchmarks", "lra-listops-small", "--num-cpus", "2", "--cpus-per-trial", "3"),
         "--cpus-per-trial 3 exceeds the cluster's 2 CPUs"),
    Case("mlflow-server-down", None, ("--benchmarks", "lra-listops-small", "--mlflow-uri", "http://127.0.0.1:{port}"),
         "cannot reach the MLflow server at http://127.0.0.1:{port}"),
    # -- resumes that cannot be
    Case("resume-nothing", None, ("--benchmarks", "lra-listops-small", "--resume"), "no sweep to resume in"),
    Case("run-dir-holds-a-sweep", None, ("--benchmarks", "lra-listops-small", "--steps", "600"),
         "--run-dir {tmp}/run holds sweep uptrain-2 already: add --resume to continue it, --new to "
         "move it aside and start afresh, or give another --run-dir", setup=_stored_sweep),
    Case("new-and-resume", None, ("--benchmarks", "lra-listops-small", "--new", "--resume"),
         "--resume continues the run dir's sweep and --new moves it aside: give one", setup=_stored_sweep),
    Case("new-aside-taken", None, ("--benchmarks", "lra-listops-small", "--new"),
         "--new: {tmp}/run.uptrain-2 exists already; move it, or give another --run-dir",
         setup=lambda t: (_stored_sweep(t), (t / "run.uptrain-2").mkdir())),
    Case("resume-other-steps", None, ("--benchmarks", "lra-listops-small", "--steps", "300", "--resume"),
         "--resume: steps is 300 here but the sweep uptrain-2 ran with 600", setup=_stored_sweep),
    Case("resume-other-seeds", None,
         ("--benchmarks", "lra-listops-small", "--steps", "600", "--seeds", "0,1", "--resume"),
         "--resume: seeds is [0, 1] here but the sweep uptrain-2 ran with [0]", setup=_stored_sweep),
    Case("resume-masked-db-not-given", None, ("--benchmarks", "lra-listops-small", "--resume"),
         "--resume: the sweep's --results-db postgresql://me@db-host/flurka was stored without its password; "
         "give --results-db with the full URL again", setup=_masked_sweep),
]


def _fill(text: str, tmp: Path, port: int) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{port}", str(port))


def _argv(case: Case, tmp: Path, port: int) -> list[str]:
    argv = []
    if case.yaml is not None:
        (tmp / "sweep.yaml").write_text(_fill(case.yaml, tmp, port))
        argv += ["--config", str(tmp / "sweep.yaml")]
    argv += [_fill(a, tmp, port) for a in case.args]
    if "--run-dir" not in argv:
        argv += ["--run-dir", str(tmp / "run")]
    return argv


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, size, mode and mtime: "nothing created or changed"."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (p.is_dir(), st.st_size, st.st_mode, st.st_mtime_ns)
    return out


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if the sweep gets as far as starting (or joining) Ray."""
    import ray

    import flurka.cluster

    def refuse(*_a, **_k):
        raise AssertionError("Ray was started for a spec that should have been refused")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(flurka.cluster, "connect", refuse)
    yield
    assert not ray.is_initialized()


def _sweep_main(argv: list[str], capsys) -> tuple[int, str, str]:
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import uptrain_sweep
    finally:
        sys.path.pop(0)
    try:
        code = uptrain_sweep.main(argv)
    except SystemExit as exc:          # argparse's errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_sweep_is_one_line_before_ray_and_writes_nothing(case, tmp_path, capsys, no_ray, monkeypatch):
    if case.root_can and os.geteuid() == 0:
        pytest.skip("root writes into a read-only (mode 0555) directory: nothing to refuse")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port = free_ports(1)[0]
    if case.setup is not None:
        case.setup(tmp_path)
    argv = _argv(case, tmp_path, port)
    before = _snapshot(tmp_path)
    code, out, err = _sweep_main(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err and out == ""
    assert _fill(case.needle, tmp_path, port) in lines[0], lines[0]
    assert "secret" not in err                   # a password in a URL is never shown
    assert _snapshot(tmp_path) == before         # nothing created (run dir, DB files, pwned), nothing changed
    (tmp_path / "ro").exists() and (tmp_path / "ro").chmod(0o755)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("yaml-seeds-float", "results-db-text-file")],
                         ids=lambda c: c.id)
def test_the_users_command_in_a_fresh_process(case, tmp_path):
    """The command as typed: stderr is the one line, whatever the imports print."""
    port = free_ports(1)[0]
    if case.setup is not None:
        case.setup(tmp_path)
    argv = _argv(case, tmp_path, port)
    before = _snapshot(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "JAX_COMPILATION_CACHE_DIR")}
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "uptrain_sweep.py"), *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("uptrain_sweep: error: "), proc.stderr[-2000:]
    assert _fill(case.needle, tmp_path, port) in proc.stderr
    assert _snapshot(tmp_path) == before


# -- one parser for --set, in `flurka train` and the sweep ----------------------------------------

SET_VALUES = [
    # (the text after FIELD=, the value both commands must read)
    ("1e6", 1e6),
    ("3e-4", 3e-4),
    ("16", 16),
    ("cosine", "cosine"),
    ("'cosine'", "cosine"),
    ("off", "off"),                    # not YAML 1.1's False
    ("true", True),
    ("False", False),
    ("null", None),
    ("None", None),
    ("[1, 2]", [1, 2]),
    ("{'d_k': 16}", {"d_k": 16}),
    ("{d_k: 16}", {"d_k": 16}),        # a YAML flow mapping, as a sweep file writes it
]


@pytest.mark.parametrize("text,value", SET_VALUES, ids=[t for t, _ in SET_VALUES])
def test_set_means_the_same_in_train_and_the_sweep(text, value):
    import argparse

    from flurka.sweeps.spec import parse
    from flurka.training import cli as train_cli

    p = argparse.ArgumentParser()
    train_cli.add_arguments(p)
    trained = train_cli.overrides(p.parse_args(["--benchmark", "lra-listops-small", "--set", f"field={text}"]))
    swept = parse(["--benchmarks", "lra-listops-small", "--set", f"field={text}"]).overrides
    assert trained == swept == {"field": value}
    assert type(trained["field"]) is type(value)


def test_learning_rate_1e6_is_the_float_in_flags_and_yaml(tmp_path):
    from flurka.sweeps.spec import parse, validate

    path = tmp_path / "sweep.yaml"
    path.write_text(BENCH + "overrides: {learning_rate: 1e6, warmup_steps: 0}\n")
    from_yaml = parse(["--config", str(path)])
    from_flag = parse(["--benchmarks", "lra-listops-small", "--set", "learning_rate=1e6", "--set", "warmup_steps=0"])
    assert from_yaml.overrides == from_flag.overrides == {"learning_rate": 1e6, "warmup_steps": 0}
    validate(from_flag)                          # accepted, as `flurka train --set learning_rate=1e6` is


def test_train_refuses_a_malformed_set_in_one_line(capsys):
    from flurka.cli import main

    assert main(["train", "--benchmark", "lra-listops-small", "--set", "attention_options={d_k: 16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--set attention_options: cannot parse" in err


def test_flurka_sweep_is_the_scripts_parser_and_refuses_alike(tmp_path, capsys, no_ray):
    """Issue 41: ``flurka sweep`` runs what ``experiments/uptrain_sweep.py`` runs (one parser,
    one run); a bad spec is the same one line under its own name, before Ray."""
    import subprocess

    from flurka.cli import main

    argv = ["--benchmarks", "lra-listops-small", "--seeds", "0.5", "--run-dir", str(tmp_path / "r")]
    assert main(["sweep", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("flurka sweep: error: command line: --seeds must be integers (a list, or "
                   "comma-separated), got '0.5'")
    assert _sweep_main(argv, capsys)[1:] == ("", err.replace("flurka sweep", "uptrain_sweep") + "\n")
    assert not (tmp_path / "r").exists()
    # the Python API is importable without Ray, as the package promises
    code = ("import sys, flurka.sweeps as s; assert callable(s.run_sweep); "
            "assert 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_gpus_beyond_the_embedded_ray_are_one_line_before_it_starts(tmp_path, capsys, no_ray, monkeypatch):
    """Issue 60: the GPU count Ray would detect is asked before Ray starts (here: none visible)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code, out, err = _sweep_main(["--benchmarks", "lra-listops-small", "--gpus-per-trial", "1",
                                  "--run-dir", str(tmp_path / "run")], capsys)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "--gpus-per-trial 1 requested but the Ray cluster has no GPUs" in err
    assert list(tmp_path.iterdir()) == []
