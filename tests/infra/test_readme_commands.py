"""Every command the READMEs show is run here, or mapped here to the test (or CI step) that runs it.

Commands are read from README.md and benchmarks/README.md: every line of a ```bash block
(backslash continuations joined, comments dropped), every ```sql and ```python block whole, and
every inline `code` span that starts like a command (flurka, make, python, ray, pip, tfds,
export, .venv/bin/..., .ci/run, experiments/*.py). ``COVERAGE`` says how each one is checked:

  run      run as written, with only the substitutions its entry lists (tiny sizes and steps,
           temporary directories, 127.0.0.1 and free ports, a results database the test fills,
           PostgreSQL from FLURKA_TEST_POSTGRES_URL as well as SQLite)
  parse    parsed by the tool's own parser (argparse, Ray's click commands, tfds's simple_parsing,
           pip's option parser, ``make -n``) and validated without running: commands for a GPU
           or for other hosts; the entry names the test that runs them where one does
  covered  run by another test (named; this file checks that it still exists) or by CI itself

A README command that matches no entry fails ``test_every_readme_command_is_covered`` with what to
do; an entry that no longer matches a command fails ``test_no_stale_coverage_entries``. Entries are
tried in order (specific before general). Two slow tests run what needs a service: ``flurka ui``
serving a sweep's MLflow store, and the token-authenticated Ray cluster (token, head, a worker,
job submission) on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import browser
import pytest
from testsupport import JoiningNode, flurka, free_ports, pids_naming, ray_node_ports, scratch_postgres_database

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCS = ("README.md", "benchmarks/README.md")
RUN_DIR = "runs/uptrain-small"
README_DB = f"sqlite:///{RUN_DIR}/results.db"  # relative: the commands run in a workspace holding runs/
TINY_MODEL = {"model.d_model": 16, "model.num_layers": 1, "model.d_ff": 32, "batch_size": 8, "eval_batches": 1, "warmup_steps": 0}
TINY_SET = [a for k, v in TINY_MODEL.items() for a in ("--set", f"{k}={v}")]
TINY_THEORY = ["--seq-len", "32", "--d-model", "16", "--heads", "2", "--d-k", "8", "--features", "4",
               "--seeds", "0", "--batch", "1"]


# ---------------------------------------------------------------------------------------------
# Reading the commands
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Command:
    doc: str   # README.md or benchmarks/README.md
    line: int
    kind: str  # shell | inline | sql | python | block:<other language>
    text: str  # shell/inline: one line, whitespace collapsed, comments dropped; sql/python: the block

    @property
    def id(self) -> str:
        first = (self.text.strip().splitlines() or [""])[0] if "\n" in self.text or self.kind != "shell" else self.text
        return f"{self.doc}:{self.line}:{first[:70]}"


STARTS_LIKE_A_COMMAND = re.compile(
    r"[A-Z][A-Z0-9_]*=\S+(?:\s|$)"  # an environment assignment (and whatever follows)
    r"|(?:make|flurka|python3?|ray|pip|tfds|export|\.venv/bin/\S+|\.ci/run|experiments/\S+\.py)(?:\s|$)")


def _strip_comment(line: str) -> str:
    """The line up to a ``#`` that starts a shell comment (not inside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _inline_spans(prose: str) -> list[tuple[int, str]]:
    """(offset, text) of every single-backtick code span (may wrap onto the next line)."""
    return [(m.start(), m.group(1)) for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose)]


def extract(doc: str) -> list[Command]:
    lines = (ROOT / doc).read_text().splitlines()
    out: list[Command] = []
    prose: list[tuple[int, str]] = []  # (line number, text) outside fences
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        lang, start = fence.group(1), i + 1
        i += 1
        body: list[tuple[int, str]] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1  # closing fence
        if lang in ("bash", "sh", "shell", "console"):
            pending, first = "", None
            for number, text in body:
                first = first or number
                if text.rstrip().endswith("\\"):
                    pending += _strip_comment(text.rstrip()[:-1]) + " "
                    continue
                command = " ".join((pending + _strip_comment(text)).split())
                if command:
                    out.append(Command(doc, first, "shell", command))
                pending, first = "", None
        elif lang in ("sql", "python"):
            out.append(Command(doc, start + 1, lang, "\n".join(t for _, t in body)))
        else:  # a block of another language: no entry covers it until someone says what it is
            out.append(Command(doc, start, f"block:{lang or 'plain'}", "\n".join(t for _, t in body)))
    text = "\n".join(t for _, t in prose)
    numbers = [n for n, _ in prose]
    for offset, span in _inline_spans(text):
        span = " ".join(span.split())
        if STARTS_LIKE_A_COMMAND.match(span):
            out.append(Command(doc, numbers[text.count("\n", 0, offset)], "inline", span))
    return out


COMMANDS = [c for doc in DOCS for c in extract(doc)]


# ---------------------------------------------------------------------------------------------
# Helpers: running in-process and in subprocesses, free ports, existing tests
# ---------------------------------------------------------------------------------------------


def shell(argv: list[str], cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """A subprocess with this venv's bin first on PATH (``python``, ``flurka``, ``ray`` are ours)."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("RAY_ADDRESS", None)
    if argv and argv[0] in ("python", "python3"):
        argv = [sys.executable, *argv[1:]]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def tokens(cmd: Command) -> list[str]:
    return shlex.split(cmd.text)


def env_prefix(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while argv and re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", argv[0]):
        k, v = argv[0].split("=", 1)
        env[k] = v
        argv = argv[1:]
    return env, argv


def covered_by(ref: str, *needles: str) -> None:
    """The named test (``path::function``) exists and its source mentions ``needles``."""
    path, func = ref.split("::")
    source = (ROOT / path).read_text()
    assert re.search(rf"^def {re.escape(func)}\(", source, re.M), f"{ref} is gone: update COVERAGE"
    for needle in needles:
        assert needle in source, f"{ref} no longer uses {needle!r}: update COVERAGE"


def exec_snippet(code: str, cwd: Path) -> tuple[dict, object]:
    """Run a README Python block; returns its namespace and the value of its last expression."""
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    ns: dict = {"__name__": "__readme__"}
    with contextlib.chdir(cwd):
        exec(compile(tree, "<README>", "exec"), ns)
        value = eval(compile(ast.Expression(last.value), "<README>", "eval"), ns) if last else None
    return ns, value


def substitute(text: str, old: str, new: str) -> str:
    assert old in text, f"the README no longer says {old!r}: update the substitution in COVERAGE"
    return text.replace(old, new)


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float, headers: dict | None = None) -> bytes:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {url} answered:\n{proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=3) as r:
                if r.status == 200:
                    return r.read()
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer in {timeout_s:.0f}s")
        time.sleep(1)


def stop_group(*procs: subprocess.Popen | None, grace_s: float = 60) -> None:
    """Stop processes we started in sessions of their own, and everything they started: SIGTERM,
    ``grace_s`` to exit, then SIGKILL."""
    procs = [p for p in procs if p is not None and p.poll() is None]
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_gone(marker: str, timeout_s: float) -> list[int]:
    """Wait for the processes naming ``marker`` (ours) to exit; SIGKILL and return any left."""
    deadline = time.monotonic() + timeout_s
    while (left := pids_naming(marker)) and time.monotonic() < deadline:
        time.sleep(1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


# ---------------------------------------------------------------------------------------------
# A workspace shaped like what `make sweep` leaves (runs/uptrain-small/...), on SQLite and PostgreSQL
# ---------------------------------------------------------------------------------------------
def make_sweep_record() -> dict:
    """A sweep record shaped like ``make sweep``'s (Table 5 whole, as ``make sweep-full``): nmt-list-small
    BLEU (0-100), every FLuRKA variant at the paper's seven α on a Linformer base, the baselines,
    two seeds."""
    from flurka.sweeps.spec import PAPER_ALPHAS

    def trial(key, attention, bleu, *, bench="nmt-list-small", seed=0, alpha=None, d_k=None, nf=None):
        return {"trial_key": key, "attention": attention, "benchmark": bench, "seed": seed, "status": "ok",
                "steps": 600, "alpha": 0.0 if alpha is None else alpha,
                "base": "linformer" if alpha is not None else None, "d_k": d_k,
                "num_features": nf, "train_flops": 1.2e12, "wall_time_s": 30.0,
                "metrics": {"bleu": bleu, "loss": 0.5 - bleu / 400},
                "curve": [{"step": 75 * i, "loss": 2.4 - 0.1 * i, "train_flops": 1.5e11 * i} for i in range(1, 9)]}

    trials = []
    for seed in (0, 1):
        for mech, bleu in (("full", 94.1), ("linformer", 95.7), ("performer", 93.7), ("rnn", 75.0), ("eva", 95.4)):
            trials.append(trial(f"{mech}-s{seed}", mech, bleu + 0.3 * seed, seed=seed,
                                d_k=16 if mech == "linformer" else None, nf=32 if mech == "performer" else None))
        for v in ("flurka-performer", "flurka-rnn", "flurka-eva"):
            for a in PAPER_ALPHAS:
                trials.append(trial(f"{v}-a{a}-s{seed}", v, 80.0 + 10 * a + 0.3 * seed, seed=seed, alpha=a,
                                    d_k=16, nf=32 if v == "flurka-performer" else None))
    return {"sweep_id": "uptrain-small-readme", "name": "uptrain-small", "created_at": "2025-01-02T03:04:05+00:00",
            "git_commit": None, "environment": {"device": "cpu", "host": "ci", "versions": {"jax": "0.10"}},
            "trials": trials}


@dataclasses.dataclass
class Workspace:
    root: Path            # the commands' working directory: holds runs/uptrain-small/
    pg_url: str | None    # the same results on PostgreSQL (CI), else None

    def urls(self) -> list[str]:
        return [README_DB, *([self.pg_url] if self.pg_url else [])]


@pytest.fixture(scope="module")
def postgres_url():
    """A fresh PostgreSQL database (FLURKA_TEST_POSTGRES_URL; set by .ci/run), dropped afterwards."""
    admin_url = os.environ.get("FLURKA_TEST_POSTGRES_URL")
    if not admin_url:
        if os.environ.get("CI"):
            pytest.fail("FLURKA_TEST_POSTGRES_URL is unset in CI: .ci/run must start PostgreSQL")
        yield None  # SQLite only on a laptop
        return
    with scratch_postgres_database(admin_url, "flurka_readme") as url:
        yield url


@pytest.fixture(scope="module")
def ws(tmp_path_factory, postgres_url) -> Workspace:
    from flurka.results import ingest_sweep, open_results

    root = tmp_path_factory.mktemp("readme-ws")
    (root / RUN_DIR).mkdir(parents=True)
    (root / RUN_DIR / "mlflow.db").write_bytes(b"")
    for url in (f"sqlite:///{root / RUN_DIR / 'results.db'}", postgres_url):
        if url:
            engine = open_results(url)
            ingest_sweep(engine, make_sweep_record())
            engine.dispose()
    return Workspace(root, postgres_url)


@pytest.fixture(scope="module")
def speed_json(ws) -> Path:
    """``python -m flurka.speed --sweep tiny --out speed.json`` (README) in the workspace, on the
    mechanisms full and flurka-rnn at layer scope (the whole tiny sweep is tests/speed's)."""
    cmd = next(c for c in COMMANDS if c.text.startswith("python -m flurka.speed --sweep tiny"))
    proc = shell([*tokens(cmd), "--mechanisms", "full,flurka-rnn", "--scope", "layer", "--modes", "forward",
                  "--repeats", "2",
                  "--warmup", "1"], ws.root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ws.root / "speed.json"


@pytest.fixture(scope="module")
def theory_json(ws) -> Path:
    """``python -m flurka.theory --out theory.json`` (README) in the workspace, at tiny sizes."""
    cmd = next(c for c in COMMANDS if c.text.startswith("python -m flurka.theory --out theory.json"))
    proc = shell([*tokens(cmd), *TINY_THEORY, "--mechanisms", "full,linformer,performer,flurka-performer",
                  "--rank-mechanisms", "performer,flurka-rnn"], ws.root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ws.root / "theory.json"


@pytest.fixture(scope="module")
def trained_run(ws) -> Path:
    """The README's ``flurka train ... --workdir runs/listops-performer --checkpoint-every 200`` in
    the workspace, with 6 steps of a 2-layer d_model 16 model (``--steps``, ``--checkpoint-every``
    and ``--set`` appended)."""
    cmd = next(c for c in COMMANDS if c.kind == "shell" and "--checkpoint-every" in c.text)
    argv = tokens(cmd)[1:]
    code, _, err = flurka([*argv, "--steps", "6", "--checkpoint-every", "6", *TINY_SET,
                           "--set", "model.num_layers=2", "--no-progress"], ws.root)
    assert code == 0, err[-3000:]
    return ws.root / argv[argv.index("--workdir") + 1]


# ---------------------------------------------------------------------------------------------
# Checks, one per kind of command
# ---------------------------------------------------------------------------------------------
class Ctx:
    """What a check may need: fixtures on demand (so a parse check builds no database)."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path):
        self.request, self.tmp = request, tmp_path

    def __getattr__(self, name):
        return self.request.getfixturevalue(name)


def check_make(cmd: Command, ctx: Ctx) -> None:
    """``make -n`` (the Makefile's own expansion, nothing run, the venv stamp taken as fresh); the
    sweep's flags are then validated into a plan without starting Ray."""
    argv = tokens(cmd)
    target = argv[1]
    stamp = Path(sys.prefix) / ".installed"
    proc = shell(["make", "-n", "-o", str(stamp), "-C", str(ROOT), f"VENV={sys.prefix}", *argv[1:]], ROOT, 60)
    assert proc.returncode == 0, proc.stderr
    recipe = proc.stdout
    if target == "sweep-full":
        line = next(l for l in recipe.splitlines() if "flurka sweep" in l)
        spec = check_sweep_args(shlex.split(line.split("flurka sweep", 1)[1]))
        assert len(spec.variants) == 3 and len(spec.alphas) == 7 and len(spec.d_k) == 2
        covered_by("tests/platform/test_sweep_branching.py::"
                   "test_main_job_trains_one_linformer_base_per_d_k_and_seed", "uptrain-full")
    elif target == "sweep":
        line = next(l for l in recipe.splitlines() if "flurka sweep" in l)
        check_sweep_args(shlex.split(line.split("flurka sweep", 1)[1]))
        if "ARGS=" in cmd.text:   # the README's ARGS reach the script as they are
            given = re.search(r"ARGS=(\"[^\"]*\"|\S+)", cmd.text).group(1).strip('"')
            assert line.rstrip().endswith(given), (given, line)
        covered_by("tests/platform/test_sweep_local.py::test_local_sweep_end_to_end", "run_sweep")
        covered_by("tests/platform/test_job_submit.py::test_ray_job_submit_runs_the_sweep", "uptrain_sweep.py")
    elif target == "test":
        assert "ruff check ." in recipe and "-m pytest" in recipe and "not slow" not in recipe
        check_ci(cmd, ctx)
    elif target == "aot":
        check_aot(cmd, recipe)
    elif target == "test-fast":
        assert "ruff check ." in recipe and "-m pytest" in recipe and "not slow" in recipe
        pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
        assert any(m.startswith("slow:") for m in pytest_ini["markers"])
    else:
        raise AssertionError(f"no check for make {target}")


def check_aot(cmd: Command, recipe: str) -> None:
    """``make aot``: the module under XLA's CUDA compiler's path; its flags listed by its own
    parser (``--list``: nothing compiled); tests/speed compiles for an H100 through it."""
    from flurka.speed import aot
    assert "PYTHONPATH=.cuda-aot" in recipe and "-m flurka.speed.aot" in recipe
    given = re.search(r'ARGS="([^"]*)"', cmd.text)
    if given:
        with contextlib.redirect_stdout(io.StringIO()):
            assert aot.main([*shlex.split(given.group(1)), "--list"]) == 0
    covered_by("tests/speed/test_speed_aot.py::test_points_compile_for_an_h100_with_the_memory_they_need",
               '"flurka.speed.aot"', '"--target", "h100"')
    covered_by("tests/speed/test_speed_aot.py::test_fused_kernels_compile_for_an_h100_and_the_default_launch_does_not_spill",
               "compile_tilings")


def check_sweep_args(args: list[str]):
    """The sweep script's own parser and spec validation, and its trial plan (no Ray, no trial)."""
    from flurka.sweeps import spec as S
    from flurka.sweeps.branching import make_plan

    with contextlib.chdir(ROOT):
        spec = S.validate(S.parse(args))
    plan = make_plan(spec)
    assert plan.branches or plan.baselines
    return spec


def check_ci(cmd: Command, ctx: Ctx) -> None:
    """CI is ``.ci/run``: it starts PostgreSQL for these tests and then runs ``make test``."""
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK)
    body = [l.strip() for l in ci.read_text().splitlines() if l.strip() and not l.strip().startswith("#")]
    assert body[-1] == "make test" and any("FLURKA_TEST_POSTGRES_URL" in l for l in body)
    assert any("chromium" in l for l in body)


def check_sweep_script(cmd: Command, ctx: Ctx) -> None:
    argv = tokens(cmd)
    if argv[:2] == ["flurka", "sweep"]:   # the same parser as the script's
        covered_by("tests/platform/test_sweep_bad_input.py::"
                   "test_flurka_sweep_is_the_scripts_parser_and_refuses_alike", '"sweep"')
        argv = argv[1:]
    else:
        argv = argv[1:] if argv[0] == "python" else argv
        assert argv[0] == "experiments/uptrain_sweep.py"
    spec = check_sweep_args(argv[1:])
    assert spec.name == "uptrain-small" and spec.benchmarks == ("nmt-list-small",)
    assert len(spec.seeds) >= 3 and spec.steps == 400 and not spec.full and spec.control
    # observation 3 judged, not given: an α inside the paper's [25 %, 37.5 %], one below it, one above
    assert len(spec.all_alphas) >= 3 and any(0.25 <= a <= 0.375 for a in spec.all_alphas)
    assert min(spec.all_alphas) < 0.25 and max(spec.all_alphas) > 0.375


def check_speed_sweep_mlflow(cmd: Command, ctx: Ctx) -> None:
    covered_by("tests/speed/test_speed_ray.py::test_ray_sweep_runs_points_as_tasks", "--mlflow-uri", "flurka-speed")


def check_python_load_run(cmd: Command, ctx: Ctx) -> None:
    covered_by("tests/platform/test_sweep_local.py::test_local_sweep_end_to_end",
               "mlflow.artifacts.download_artifacts(uri", "load_run(", "flurka.model.")


def check_flops(cmd: Command, ctx: Ctx) -> None:
    from flurka.attention.flops import MECHANISMS

    code, out, err = flurka(tokens(cmd)[1:], ctx.tmp)
    assert code == 0, err
    records = [json.loads(l) for l in out.splitlines()]
    assert [r["mechanism"] for r in records] == list(MECHANISMS)


def _train_config(argv: list[str]):
    """The README's ``flurka train`` flags, as written, through its parser into a validated config."""
    from flurka.configs import get_config
    from flurka.training import cli as train_cli

    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    as_written = parser.parse_args(argv)
    return get_config(as_written.benchmark, **train_cli.overrides(as_written))


def check_train_up(cmd: Command, ctx: Ctx) -> None:
    """Up-training from the command line: the README's flags validated as written, then run with 8
    steps of a 1-layer, d_model 16 model (``--steps 8`` and ``--set`` appended)."""
    argv = tokens(cmd)[1:]
    config = _train_config(argv[1:])
    assert config.alpha == 0.25 and config.base == "low-rank"
    code, out, err = flurka([*argv, "--steps", "8", *TINY_SET, "--no-progress"], ctx.tmp)
    assert code == 0, err[-3000:]
    assert out.startswith("lra-image-small flurka-performer: ok after 8 steps"), out


def check_train_json(cmd: Command, ctx: Ctx) -> None:
    """The same run as the README's Python API block (``run(get_config(...))``, run here with 4 steps
    of a tiny model): validated as written; the CLI's ``--json`` output is tests/training's."""
    argv = tokens(cmd)[1:]
    config = _train_config(argv[1:])
    assert (config.benchmark, config.model.attention, config.steps) == ("lra-listops-small", "flurka-rnn", 200)
    api = next(c for c in COMMANDS if c.kind == "python" and "from flurka.training import run" in c.text)
    assert 'get_config("lra-listops-small", steps=200, model={"attention": "flurka-rnn"})' in api.text
    covered_by("tests/training/test_training_loop.py::test_cli_prints_final_metrics_as_json", '"--json"')


def check_speed_tiny(cmd: Command, ctx: Ctx) -> None:
    doc = json.loads(ctx.speed_json.read_text())
    assert doc["schema"] == "flurka.speed/1" and doc["sweep"] == "tiny"
    assert {(r["mechanism"], r["status"]) for r in doc["results"]} == {("full", "ok"), ("flurka-rnn", "ok")}
    covered_by("tests/speed/test_speed_sweep_tiny.py::test_every_mechanism_runs_forward_and_train")


def check_ingest(cmd: Command, ctx: Ctx) -> None:
    ctx.speed_json  # noqa: B018 - written by the README's speed command
    argv = tokens(cmd)[1:]
    for url in ctx.ws.urls():
        args = [url if a == README_DB else a for a in argv]
        code, out, err = flurka(args, ctx.ws.root)
        assert code == 0, err
        assert re.search(r"speed\.json: added \d+, already present \d+", out), out
        code, out, _ = flurka(args, ctx.ws.root)  # idempotent
        assert code == 0 and "added 0," in out


def check_ingest_record(cmd: Command, ctx: Ctx) -> None:
    """A sweep's record file (what the run dir's sweep-record.json holds) into a fresh database,
    the command's URL and FILE filled in; twice: idempotent (check_ingest covers PostgreSQL)."""
    record = ctx.tmp / "sweep-record.json"
    record.write_text(json.dumps(make_sweep_record()))
    args = [{"URL": f"sqlite:///{ctx.tmp / 'other.db'}", "FILE": str(record)}.get(a, a) for a in tokens(cmd)[1:]]
    code, out, err = flurka(args, ctx.tmp)
    assert code == 0 and re.search(r"sweep-record\.json: added [1-9]\d*, already present 0", out), err
    code, out, _ = flurka(args, ctx.tmp)
    assert code == 0 and "added 0," in out


def check_cpu_benchmark(cmd: Command, ctx: Ctx) -> None:
    tests = {"flurka.speed.plain":
             "tests/speed/test_speed_plain.py::test_the_benchmark_writes_a_ratio_per_mechanism_and_mode",
             "flurka.speed.bare_loop":
             "tests/speed/test_speed_bare_loop.py::test_the_benchmark_writes_both_rates_and_their_ratio"}
    module = tokens(cmd)[2]
    covered_by(tests[module], "main([")
    importlib.import_module(module).main  # noqa: B018 - the module and its entry point exist


def check_theory(cmd: Command, ctx: Ctx) -> None:
    from flurka.reports import sources

    errors, ranks = sources.read_theory(ctx.theory_json)
    assert {r["mechanism"] for r in errors} == {"full", "linformer", "performer", "flurka-performer"}
    assert {r["mechanism"] for r in ranks} == {"performer", "flurka-rnn"}
    covered_by("tests/theory/test_theory_cli.py::test_theory_document_and_the_report_reading_it")


def check_train_workdir(cmd: Command, ctx: Ctx) -> None:
    from flurka.training.restore import checkpoint_meta

    argv = tokens(cmd)[1:]
    config = _train_config(argv[1:])
    assert (config.benchmark, config.model.attention, config.steps, config.checkpoint_every) == (
        "lra-listops-small", "performer", 200, 200)
    step, meta = checkpoint_meta(str(ctx.trained_run))
    assert step == 6 and meta["attention"] == "performer"


def check_train_init_from(cmd: Command, ctx: Ctx) -> None:
    """As written, in the workspace, from the README's trained run (its tiny sizes appended, 2 steps)."""
    argv = tokens(cmd)[1:]
    run_dir = ctx.trained_run.relative_to(ctx.ws.root)
    code, out, err = flurka([*argv, "--steps", "2", *TINY_SET, "--set", "model.num_layers=2", "--json", "--no-progress"],
                            ctx.ws.root)
    assert code == 0, err[-3000:]
    lineage = json.loads(out)["init_from"]
    assert lineage["workdir"] == str(run_dir) and lineage["step"] == 6 and lineage["copied"] > 0


def check_theory_from_run(cmd: Command, ctx: Ctx) -> None:
    """As written, on the README's trained run (tiny), with a small grid appended."""
    from flurka.reports import sources

    run = ctx.trained_run
    proc = shell([*tokens(cmd), "--d-k", "8", "--features", "4", "--seeds", "0", "--batch", "2",
                  "--mechanisms", "full,performer,flurka-performer", "--rank-mechanisms", "performer"],
                 ctx.ws.root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = ctx.ws.root / tokens(cmd)[tokens(cmd).index("--out") + 1]
    doc = json.loads(out.read_text())
    assert doc["config"]["inputs"].startswith(f"captured: {run.name} (lra-listops-small, performer")
    errors, ranks = sources.read_theory(out)
    assert {(r["mechanism"], r["layer"]) for r in errors} == {
        (m, layer) for m in ("full", "performer", "flurka-performer") for layer in (0, 1)}
    assert {r["trained"] for r in ranks} == {True}
    covered_by("tests/theory/test_theory_trained.py::test_cli_from_run_writes_per_layer_rows")


def check_theory_gpu(cmd: Command, ctx: Ctx) -> None:
    """The GPU-size theory run: parsed and validated (every layer built abstractly), not computed."""
    from flurka.theory import cli as theory_cli

    argv = tokens(cmd)[3:]
    parser = argparse.ArgumentParser()
    theory_cli.add_arguments(parser)
    args = parser.parse_args(argv)
    plan = theory_cli.plan(args)
    assert args.out.startswith("benchmarks/") and plan["d_k"] and plan["m"]
    covered_by("tests/theory/test_theory_cli.py::test_fresh_process_without_ray_mlflow_or_sql")


def check_tables(cmd: Command, ctx: Ctx) -> None:
    argv = tokens(cmd)[1:]
    for url in ctx.ws.urls():
        code, out, err = flurka([url if a == README_DB else a for a in argv], ctx.ws.root)
        assert code == 0, err
        assert "| flurka-performer" in out and "| flurka-rnn" in out and "12.5%" in out and "87.5%" in out


def check_tables_every(cmd: Command, ctx: Ctx) -> None:
    """``--table a|b|... --format x|y|z``: every table and format through the real parser, run on the
    make-sweep workspace (exit 0 with rows, or 1 with a one-line "no ..." where it holds no such
    results: most of these are the paper's GPU-size tables); tests/results runs each on a database
    that has them all."""
    from flurka.results import cli as tables_cli

    argv = tokens(cmd)[1:]
    names = argv[argv.index("--table") + 1].split("|")
    formats = argv[argv.index("--format") + 1].split("|")
    assert set(names) == set(tables_cli.TABLES), "the README's list of tables is not flurka tables' list"
    for name in names:
        for fmt in formats:
            code, out, err = flurka(["tables", "--db", README_DB, "--table", name, "--format", fmt], ctx.ws.root)
            assert code in (0, 1), err
            if code == 1:
                assert len(err.strip().splitlines()) == 1 and "no " in err, err
            else:
                assert out.strip()
    covered_by("tests/results/test_results_cli.py::test_markdown_latex_csv")


def check_report(cmd: Command, ctx: Ctx) -> None:
    argv = tokens(cmd)[1:]
    out_dir = ctx.tmp / "report"
    if "--theory" in argv:
        ctx.theory_json  # noqa: B018 - written by the README's theory command
    argv = [{"URL": README_DB, "DIR": str(out_dir), "runs/report": str(out_dir)}.get(a, a) for a in argv]
    code, out, err = flurka(argv, ctx.ws.root)
    assert code == 0, err
    index = (out_dir / "index.html").read_text()
    assert "Up-training" in index
    tables = {p.stem for p in (out_dir / "tables").glob("*.csv")}
    assert "uptraining-nmt-list-small" in tables
    if "--theory" in argv:
        assert {"error-0-table", "rank-0-table"} <= tables
    covered_by("tests/reports/test_report_browser.py::test_every_table_has_rows_and_every_figure_renders")


def check_ui(cmd: Command, ctx: Ctx) -> None:
    """``--dry-run`` here (the command it would start: MLflow on 127.0.0.1:5000, the run dir's
    store); test_flurka_ui_serves_the_runs [slow] starts it and reads a sweep's runs over HTTP."""
    argv = tokens(cmd)
    assert argv[0] in ("flurka", ".venv/bin/flurka") and (BIN / "flurka").exists()
    code, out, err = flurka([*argv[1:], "--dry-run"], ctx.ws.root)
    assert code == 0, err
    started = shlex.split(out.splitlines()[0])
    assert started[1:4] == ["-m", "mlflow", "ui"]
    assert started[started.index("--host") + 1] == "127.0.0.1" and started[started.index("--port") + 1] == "5000"
    assert started[started.index("--backend-store-uri") + 1] == f"sqlite:///{ctx.ws.root / RUN_DIR / 'mlflow.db'}"
    covered_by("tests/infra/test_readme_commands.py::test_flurka_ui_serves_the_runs", "ui_cmd")


def check_main_job_output(cmd: Command, ctx: Ctx) -> None:
    """The README quotes the main job's summary: its title, Table 5's header and the three
    observation lines must be what runner.summary prints."""
    lines = cmd.text.splitlines()
    assert lines[0].startswith("Up-training α, nmt-list-small: BLEU (char, 0–100), higher is better")
    assert [c.strip() for c in lines[1].split("|")[1:7]] == ["variant", "base", "d_k", "kernel constituent",
                                                            "kernel", "low-rank"]
    assert lines[1].rstrip(" |").endswith("no attention")          # the floor, a column of the table
    assert "Table 5's observations, nmt-list-small, BLEU (char, 0–100):" in lines
    for i in (1, 2, 3):
        assert any(line.startswith(f"({i}) ") for line in lines)
    covered_by("tests/platform/test_sweep_tables.py::test_summary_prints_metric_and_loss_tables_and_the_observations",
               "Table 5's observations")


def check_nmt_list_example(cmd: Command, ctx: Ctx) -> None:
    """The README's nmt-list-small example is one the task trains on, as written."""
    from flurka.data import nmt_list

    source, target = cmd.text.strip().split("   ->   ")
    train, _ = nmt_list.examples()
    assert (source, target) in train


def check_pretrain_block(cmd: Command, ctx: Ctx) -> None:
    """The README's ``pretrain:`` lines, as a sweep file: validated, and planned in two phases
    (each fine-tuning run from a pre-training run of its mechanism and seed; flurka-eva, kept at
    the pre-training's length, among them)."""
    from flurka.sweeps.branching import make_plan
    from flurka.sweeps.spec import parse, validate

    path = ctx.tmp / "chain.yaml"
    path.write_text(cmd.text + "\nvariants: [flurka-rnn, flurka-eva]\nalphas: [0.0]\nseeds: [0]\n")
    spec = validate(parse(["--config", str(path), "--run-dir", str(ctx.tmp / "run")]))
    assert spec.pretrain["benchmark"] == "mlm-wikitext103" and spec.pretrain["full_length"] == ("flurka-eva",)
    plan = make_plan(spec)
    sources = {r.key for r in plan.pretrain.runs}
    assert sources and {r.benchmark for r in plan.pretrain.runs} == {"mlm-wikitext103"}
    assert all(r.init_from in sources for r in plan.baselines + plan.branches)
    assert {r.attention for r in plan.branches} == {"flurka-rnn", "flurka-eva"}


def check_quality_table_nmt_list(cmd: Command, ctx: Ctx) -> None:
    """The command's flags parse, and the README's nmt-list-small table is what ``--summarize``
    prints from the recorded runs (each README row's cells in that row)."""
    from flurka.training import quality_table

    recorded = ROOT / "benchmarks/results/cpu/2026-12-06-nmt-list/quality.jsonl"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert quality_table.main(tokens(cmd)[3:] + ["--summarize", str(recorded)]) == 0
    printed: dict[str, str] = {}                  # the mechanism table comes first; paired rows later
    for r in out.getvalue().splitlines():
        if r.startswith("| "):
            printed.setdefault(r.split(" | ")[0], r)
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| mechanism | char. BLEU | exact match (%) | eval loss |"):].split("\n\n")[0]
    rows = table.splitlines()[2:]
    assert len(rows) == 10
    for row in rows:
        name, *cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(f"| {c} |" in printed[f"| {name}"] for c in cells), row


def check_subcommand(cmd: Command, ctx: Ctx) -> None:
    """``flurka X [--flag [value]]...`` / ``python -m M`` named in prose: the subcommand (module)
    exists, answers --help, and knows each flag (and value, where it has choices)."""
    argv = tokens(cmd)
    if argv[0] != "flurka":
        assert importlib.util.find_spec(argv[2]) is not None
        return
    from flurka.cli import SUBCOMMANDS

    assert argv[1] in SUBCOMMANDS
    code, out, _ = flurka([argv[1], "--help"], ctx.tmp)
    assert code == 0 and out.startswith("usage: ")
    parser = argparse.ArgumentParser()
    importlib.import_module(SUBCOMMANDS[argv[1]][0]).add_arguments(parser)
    actions = {o: a for a in parser._actions for o in a.option_strings}
    for i, arg in enumerate(argv[2:], 2):
        if arg.startswith("--"):
            assert arg in actions, f"flurka {argv[1]} has no {arg}"
            if actions[arg].choices and i + 1 < len(argv):
                assert argv[i + 1] in actions[arg].choices


def check_sql(cmd: Command, ctx: Ctx) -> None:
    import sqlalchemy as sa

    from flurka.results import connect

    for url in ctx.ws.urls():
        engine = connect(url if url != README_DB else f"sqlite:///{ctx.ws.root / RUN_DIR / 'results.db'}")
        with engine.connect() as conn:
            rows = conn.execute(sa.text(cmd.text.strip().rstrip(";"))).mappings().all()
        engine.dispose()
        assert len(rows) == 3 * 7, rows  # every FLuRKA variant at the seven α, no baseline
        assert {r["seeds"] for r in rows} == {2} and all(0 <= r["bleu"] <= 100 for r in rows)
        assert [(r["attention"], r["alpha"]) for r in rows] == sorted((r["attention"], r["alpha"]) for r in rows)


def check_pandas(cmd: Command, ctx: Ctx) -> None:
    for url in ctx.ws.urls():
        code = cmd.text if url == README_DB else substitute(cmd.text, f'"{README_DB}"', repr(url))
        ns, _ = exec_snippet(code, ctx.ws.root)
        bleu = ns["bleu"]
        assert set(bleu.index) == {"full", "linformer", "performer", "rnn", "eva"}   # no α branch
        assert (bleu["count"] == 2).all()
        assert bleu.loc["rnn", "mean"] == pytest.approx(75.15) and bleu.loc["rnn", "std"] > 0


def check_python_attention(cmd: Command, ctx: Ctx) -> None:
    ns, _ = exec_snippet(cmd.text, ctx.tmp)
    assert ns["y"].shape == (2, 1000, 256)


def check_python_flops(cmd: Command, ctx: Ctx) -> None:
    _, (forward, fewer) = exec_snippet(cmd.text, ctx.tmp)
    assert forward > 0 and fewer == {"linformer": True, "rnn": True}


def check_python_train(cmd: Command, ctx: Ctx) -> None:
    code = substitute(cmd.text, "steps=200,", f"steps=4, **{TINY_MODEL!r},")
    _, (status, metrics, train_flops) = exec_snippet(code, ctx.tmp)
    assert status == "ok" and 0 <= metrics["accuracy"] <= 1 and train_flops > 0


def _ray_command(argv: list[str]):
    from ray.scripts.scripts import cli

    command, rest = cli, argv[1:]
    while rest and hasattr(command, "commands") and rest[0] in command.commands:
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def ray_parse(argv: list[str]):
    """Parse with Ray's own click command (unknown options fail); returns the parsed params."""
    import click

    command, rest = _ray_command(argv)
    placeholders = {"<head>": "127.0.0.1", "<private-ip>": "10.0.0.2", "<token>": "0" * 32}
    rest = [re.sub("|".join(map(re.escape, placeholders)), lambda m: placeholders[m.group(0)], a) for a in rest]
    try:
        return command.make_context(command.name, rest).params
    except click.UsageError as exc:
        raise AssertionError(f"ray {' '.join(argv[1:])}: {exc}") from None


def _check_auth_env(env: dict[str, str]) -> None:
    from ray._private.authentication.authentication_token_setup import AUTH_MODE_ENV_VAR

    assert AUTH_MODE_ENV_VAR == "RAY_AUTH_MODE"
    assert set(env) <= set(RAY_AUTH_VARS), f"unknown Ray variables {set(env) - set(RAY_AUTH_VARS)}"
    assert env.get("RAY_AUTH_MODE", "token") in ("token", "disabled")


def check_ray(cmd: Command, ctx: Ctx) -> None:
    """Ray's own parser for the flags; the slow token-auth test runs the sequence on 127.0.0.1."""
    env, argv = env_prefix(tokens(cmd))
    if ">" in argv:   # a redirection is the shell's, not Ray's
        argv = argv[:argv.index(">")]
    if argv[:2] == ["flurka", "submit"]:   # ray job submit with the same arguments (after stamping the source)
        argv = ["ray", "job", *argv[1:]]
    _check_auth_env(env)
    params = ray_parse(argv if argv[1:] != ["up"] else [*argv, "infra/ray/cluster-aws-gpu.yaml"])
    sub = " ".join(argv[1:3])
    if sub == "get-auth-token --generate":
        assert params["generate"] is True
    elif argv[1] == "start":
        assert env.get("RAY_AUTH_MODE") == "token"
        assert params["head"] or params["address"] == "127.0.0.1:6379"
    elif sub == "job submit":
        runtime_env = json.loads(params["runtime_env_json"])
        assert {".venv", ".git", "runs"} <= set(runtime_env["excludes"])
        entry = list(params["entrypoint"])
        assert entry[:2] == ["python", "experiments/uptrain_sweep.py"]
        spec = check_sweep_args(entry[2:])
        assert spec.gpus_per_trial == 0.5
        covered_by("tests/platform/test_job_submit.py::test_ray_job_submit_runs_the_sweep",
                   "experiments/uptrain_sweep.py", "--runtime-env-json", "--working-dir", '"flurka"), "submit"')
    elif argv[1] == "up":
        assert Path(params["cluster_config_file"]).name == "cluster-aws-gpu.yaml"
        covered_by("tests/infra/test_infra_files.py::test_ray_cluster_config_passes_rays_validation")
        return
    covered_by("tests/infra/test_readme_commands.py::test_token_auth_cluster_path", "get-auth-token")


def check_ray_fragment(cmd: Command, ctx: Ctx) -> None:
    """``ray start`` / ``ray job submit [--flag ...]`` named in prose: Ray has the command and flags."""
    argv = tokens(cmd)
    command, rest = _ray_command(argv)
    assert command.name == argv[-1 - len(rest)] and not hasattr(command, "commands")
    names = {o for p in command.params for o in getattr(p, "opts", [])}
    for arg in rest:
        if arg.startswith("--"):
            assert arg in names, f"ray {command.name} has no {arg}"


def check_tool(cmd: Command, ctx: Ctx) -> None:
    """A tool named in prose (``make``, ``flurka``): installed where the README says."""
    assert (BIN / cmd.text).exists() if cmd.text == "flurka" else shutil.which(cmd.text)


def check_export(cmd: Command, ctx: Ctx) -> None:
    argv = tokens(cmd)
    assert argv[0] == "export"
    _check_auth_env(dict(a.split("=", 1) for a in argv[1:]))
    assert shell(["bash", "-n", "-c", cmd.text], ctx.tmp).returncode == 0
    covered_by("tests/infra/test_readme_commands.py::test_token_auth_cluster_path", "RAY_AUTH_TOKEN_PATH")


def check_chmod(cmd: Command, ctx: Ctx) -> None:
    assert shell(["bash", "-n", "-c", cmd.text], ctx.tmp).returncode == 0
    covered_by("tests/infra/test_readme_commands.py::test_token_auth_cluster_path", "chmod", "0o600")


def check_dev_head(cmd: Command, ctx: Ctx) -> None:
    """The prose's loopback-only dev head: what the job-submission test starts, every port of it
    checked on loopback with ss."""
    covered_by("tests/platform/test_job_submit.py::test_ray_job_submit_runs_the_sweep",
               'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"', 'RAY_AUTH_MODE="disabled"', '"--node-ip-address", "127.0.0.1"',
               '"--dashboard-host", "127.0.0.1"', 'listening(lambda pid: os.getsid(pid) == head.pid)',
               'assert not off_loopback(sockets)')


def check_tfds(cmd: Command, ctx: Ctx) -> None:
    """tfds's own parser for ``tfds build`` (building needs TensorFlow and the data: not here)."""
    import simple_parsing
    from tensorflow_datasets.scripts.cli import build

    argv = tokens(cmd)
    assert argv[:2] == ["tfds", "build"] and (BIN / "tfds").exists()
    rest = [a.replace("NAME", "glue/cola").replace("$FLURKA_DATA_DIR", str(ctx.tmp)) for a in argv[2:]]
    args = simple_parsing.parse(build.Args, args=rest)
    assert args.positional_datasets == ["glue/cola"] and args.generation.file_format == "array_record"
    assert str(args.paths.data_dir) == str(ctx.tmp / "tfds")
    covered_by("tests/data/test_data_tfds.py::test_glue", "tfds")
    covered_by("tests/data/test_data_contract.py::test_missing_data_is_a_clear_instant_error")


def check_pip(cmd: Command, ctx: Ctx) -> None:
    """pip's own option parser, and the extra named exists in pyproject.toml."""
    from pip._internal.commands import create_command

    argv = tokens(cmd)
    options, _ = create_command("install").parse_args(argv[2:])
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for editable in options.editables:
        assert editable.startswith(".")
        for extra in re.findall(r"\[([^\]]+)\]", editable):
            assert extra in extras
    covered_by("tests/infra/test_infra_files.py::test_dockerfile_installs_with_the_readme_install_step")


def check_speed_gpu(cmd: Command, ctx: Ctx) -> None:
    """A GPU sweep: its points listed by its own parser (``--list``, nothing measured)."""
    argv = tokens(cmd)
    if argv[1] == "-m":
        from flurka.speed.__main__ import main
        rest = argv[3:]
    else:
        main, rest = _load_script(argv[1]).main, argv[2:]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*rest, "--list"]) == 0
    points = out.getvalue().splitlines()
    assert points and all("bfloat16" in p for p in points)
    assert rest[rest.index("--out") + 1].startswith("benchmarks/")


def _load_script(rel: str):
    spec = importlib.util.spec_from_file_location(f"readme_{Path(rel).stem}", ROOT / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_gpu_session(cmd: Command, ctx: Ctx) -> None:
    """The one-call GPU lease script: its parser knows every flag the README gives (``--help``);
    tests/speed runs it as a CPU dry run (``--tiny``)."""
    argv = tokens(cmd)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        _load_script(argv[1]).main(["--help"])
    assert info.value.code == 0
    for arg in argv[2:]:
        if arg.startswith("--"):
            assert arg in out.getvalue(), f"{argv[1]} has no {arg}"
    covered_by("tests/speed/test_speed_gpu_session.py::test_dry_run_checks_and_writes_ingestable_documents",
               '"--tiny"')


def check_input_pipeline(cmd: Command, ctx: Ctx) -> None:
    """The input-pipeline benchmark, as the README gives it but on one shipped set with a short
    budget: it writes its JSON (device, versions, a row with serial and threaded examples/s)."""
    argv = tokens(cmd)
    out = ctx.tmp / "input-pipeline.json"
    _load_script(argv[1]).main(["--out", str(out), "--benchmarks", "nmt-list-small", "--processes", "",
                                "--budget-s", "0.2"])
    doc = json.loads(out.read_text())
    assert doc["device"]["platform"] == "cpu" and doc["versions"]["jax"]
    (row,) = doc["results"]
    assert row["benchmark"] == "nmt-list-small" and row["serial"]["examples_per_s"] > 0
    assert row["delivered_examples_per_s"] > 0


def check_gpu_lease(cmd: Command, ctx: Ctx) -> None:
    """The one-call lease script: tests/speed starts it (driver --help through it, flags checked)."""
    assert (ROOT / "benchmarks" / "gpu_lease.sh").is_file()
    covered_by("tests/speed/test_speed_gpu_session.py::test_lease_script_runs_the_driver_with_flags_it_knows",
               "gpu_lease.sh")


def check_speed_ray_cpu(cmd: Command, ctx: Ctx) -> None:
    """The Ray speed sweep's CPU check: its points listed here (``--list``, no Ray started)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _load_script(tokens(cmd)[1]).main([*tokens(cmd)[2:], "--list"]) == 0
    assert out.getvalue().strip()
    covered_by("tests/speed/test_speed_ray.py::test_ray_sweep_runs_points_as_tasks",
               '"--sweep", "tiny", "--cpu"', '"--num-cpus", "2"')


# ---------------------------------------------------------------------------------------------
# The table: README command -> how it is checked
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Cover:
    kinds: tuple[str, ...]
    pattern: str  # shell/inline: re.fullmatch on the command; sql/python: re.search in the block
    how: str      # run | parse | covered
    check: Callable[[Command, Ctx], None]
    note: str
    slow: bool = False

    def matches(self, cmd: Command) -> bool:
        if cmd.kind not in self.kinds:
            return False
        find = re.search if cmd.kind in ("sql", "python") else re.fullmatch
        return bool(find(self.pattern, cmd.text, re.S))


SH, IN = ("shell",), ("inline",)
ANY = ("shell", "inline")
COVERAGE: list[Cover] = [
    # -- set-up -------------------------------------------------------------------------------
    Cover(ANY, r"make sweep( ARGS=.*)?", "covered", check_make,
          "make -n (recipe = flurka sweep --config uptrain-small, ARGS passed through) + spec and "
          "trial plan validated; the sweep runs (tiny) in tests/platform/test_sweep_local.py and, as "
          "the same script, test_job_submit.py [slow]"),
    Cover(ANY, r"make sweep-full", "parse", check_make,
          "make -n (recipe = flurka sweep --config uptrain-full) + spec and trial plan validated "
          "(3 variants x 7 alpha x 2 d_k x 3 seeds, one Linformer base per d_k and seed)"),
    Cover(ANY, r"make test", "covered", check_make, "CI: .ci/run ends with `make test`; make -n runs pytest"),
    Cover(IN, r"make test-fast", "parse", check_make, "make -n: pytest -m 'not slow'; marker registered"),
    Cover(ANY, r'make aot( ARGS="[^"]*")?', "covered", check_make,
          "make -n (PYTHONPATH=.cuda-aot, python -m flurka.speed.aot), ARGS parsed with --list; "
          "tests/speed/test_speed_aot.py compiles points and kernels for an H100 through it [slow]"),
    Cover(IN, r"\.ci/run", "covered", check_ci, "CI itself (PostgreSQL + Chromium, then make test)"),
    Cover(IN, r"(python )?(experiments/uptrain_sweep\.py|flurka sweep) --config uptrain-small", "parse",
          check_sweep_script, "the sweep's parser + SweepSpec.validate + plan (what make sweep runs)"),
    # -- MLflow UI ----------------------------------------------------------------------------
    Cover(SH, r"(\.venv/bin/)?flurka ui --run-dir runs/uptrain-small", "run", check_ui,
          "--dry-run in a workspace (MLflow on 127.0.0.1:5000, the run dir's store); started on a free "
          "port, serving a sweep's runs, by test_flurka_ui_serves_the_runs [slow]"),
    # -- Ray cluster --------------------------------------------------------------------------
    Cover(SH, r"ray get-auth-token --generate > /dev/null", "parse", check_ray,
          "Ray's click parser; run (HOME in a tmp dir) by test_token_auth_cluster_path [slow]"),
    Cover(SH, r"chmod 600 ~/\.ray/auth_token", "parse", check_chmod,
          "bash -n; run on the generated token (then 0600) by test_token_auth_cluster_path [slow]"),
    Cover(SH, r"RAY_AUTH_MODE=token ray start --head --dashboard-host <private-ip>", "parse", check_ray,
          "Ray's click parser; run with 127.0.0.1 and free ports by test_token_auth_cluster_path [slow]"),
    Cover(SH, r"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/\.ray/auth_token ray start --address <head>:6379",
          "parse", check_ray,
          "Ray's click parser; a worker joins the token-auth head with a token file in "
          "test_token_auth_cluster_path [slow]"),
    Cover(SH, r"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/\.ray/auth_token", "parse", check_export,
          "bash -n; the names are Ray's auth variables; used by test_token_auth_cluster_path [slow]"),
    Cover(SH, r"flurka submit --address http://<head>:8265 .*-- python experiments/uptrain_sweep\.py .*", "parse",
          check_ray, "flurka submit = ray job submit: Ray's click parser, runtime-env JSON, entrypoint through the sweep's parser + "
          "validation; submitted with the token by test_token_auth_cluster_path [slow]; the sweep "
          "through job submission: tests/platform/test_job_submit.py [slow]"),
    Cover(IN, r"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled", "covered",
          check_dev_head, "the loopback-only dev head of tests/platform/test_job_submit.py, every port checked with ss [slow]"),
    Cover(IN, r"ray (start|job submit)( --[\w-]+( [^-\s]\S*)?)*", "parse", check_ray_fragment,
          "named in prose: Ray has the command and each flag"),
    Cover(IN, r"make|flurka", "parse", check_tool, "named in prose: installed (make on PATH, flurka in the venv)"),
    Cover(IN, r"ray up", "parse", check_ray,
          "Ray's click parser with infra/ray/cluster-aws-gpu.yaml; tests/infra validates the YAML with Ray"),
    # -- queries ------------------------------------------------------------------------------
    Cover(("sql",), r"SELECT t\.attention, t\.alpha, COUNT\(\*\) AS seeds", "run", check_sql,
          "on a make-sweep-shaped results DB, SQLite and PostgreSQL"),
    Cover(("python",), r"from flurka\.results import connect", "run", check_pandas,
          "exec in the workspace (SQLite as written; PostgreSQL by URL substitution)"),
    Cover(SH, r"flurka tables --db sqlite:///runs/uptrain-small/results\.db --table uptraining .*", "run",
          check_tables, "in the workspace, SQLite as written and PostgreSQL"),
    Cover(IN, r"flurka tables --db URL --table \S+ --format \S+", "run", check_tables_every,
          "every table x format through the parser on the workspace DB; tests/results on a full DB"),
    Cover(ANY, r"flurka report --db (URL|sqlite:///runs/uptrain-small/results\.db) --out (DIR|runs/report)"
               r"( --theory theory\.json)?", "run", check_report,
          "in the workspace (with the README's theory.json); the browser test opens a full report"),
    Cover(IN, r"flurka [a-z]+( --[a-z-]+( [a-z][\w-]*)?)*", "run", check_subcommand,
          "a subcommand named in prose: --help, and its parser knows each flag (and value)"),
    # -- Python API ---------------------------------------------------------------------------
    Cover(("python",), r"from flurka\.attention import MECHANISMS, make_attention", "run", check_python_attention,
          "exec as written"),
    Cover(("python",), r"from flurka\.attention import flops\b", "run", check_python_flops, "exec as written"),
    Cover(("python",), r"from flurka\.training import run", "run", check_python_train,
          "exec with steps=200 -> steps=4 and a 1-layer d_model 16 model", slow=True),
    Cover(IN, r"experiments/speed_sweep\.py --mlflow-uri URI", "covered", check_speed_sweep_mlflow,
          "tests/speed/test_speed_ray.py: a tiny Ray speed sweep logs its document as an MLflow run [slow]"),
    Cover(("python",), r"from flurka\.training import load_run", "covered", check_python_load_run,
          "tests/platform/test_sweep_local.py: a sweep's best-trial model downloaded and loaded back"),
    # -- command line -------------------------------------------------------------------------
    Cover(SH, r"flurka flops --seq-len 55500 .* --json", "run", check_flops, "in-process, as written"),
    Cover(SH, r"flurka train --benchmark lra-listops-small --attention flurka-rnn --steps 200 --json", "parse",
          check_train_json, "flags -> validated config; the same config runs here as the Python API block "
          "[slow]; the CLI's --json: tests/training/test_training_loop.py"),
    Cover(SH, r"flurka train --benchmark \S+ --attention \S+ .*--alpha .*", "run", check_train_up,
          "README flags validated as written, then run with 8 steps of a 1-layer d_model 16 model", slow=True),
    Cover(SH, r"python -m flurka\.speed --sweep tiny --out speed\.json", "run", check_speed_tiny,
          "subprocess in the workspace on full + flurka-rnn, forward, layer scope; every mechanism: tests/speed"),
    Cover(SH, r"python -m flurka\.theory --out theory\.json", "run", check_theory,
          "subprocess in the workspace with tiny sizes appended; rows read by the report's loader"),
    Cover(SH, r"flurka train --benchmark \S+ --attention \S+ --steps \d+ --workdir \S+ --checkpoint-every \d+",
          "run", check_train_workdir, "README flags validated as written, then run with 6 steps of a 2-layer "
          "d_model 16 model into the workspace (the next command's run)", slow=True),
    Cover(SH, r"flurka train --benchmark \S+ --attention \S+ --init-from \S+ --seed \d+", "run", check_train_init_from,
          "in the workspace from the previous command's run (tiny), 2 steps; its lineage in the result", slow=True),
    Cover(IN, r"flurka train --init-from RUN_DIR", "covered",
          lambda cmd, ctx: covered_by("tests/training/test_training_init_from.py::"
                                      "test_the_trunk_is_loaded_exactly_and_the_head_is_new", "init_from"),
          "the trunk loaded exactly, the head new, other architectures refused; runs:/ URIs too"),
    Cover(SH, r"python -m flurka\.theory --from-run \S+ --out \S+\.json", "run", check_theory_from_run,
          "subprocess in the workspace on that run, a small grid appended; per-layer rows read by the "
          "report's loader", slow=True),
    Cover(IN, r"flurka ingest --db URL FILE", "run", check_ingest_record,
          "a sweep record into a fresh SQLite database, twice"),
    Cover(SH, r"flurka ingest --db sqlite:///runs/uptrain-small/results\.db speed\.json", "run", check_ingest,
          "the README speed command's file, SQLite and PostgreSQL, twice (idempotent)"),
    Cover(SH, r"python -m flurka\.speed\.(plain|bare_loop)( --[a-z]+ \S+)*", "covered",
          check_cpu_benchmark, "the module's test runs main() at tiny size and reads its JSON"),
    Cover(IN, r"python -m flurka\.training\.quality_table --benchmarks nmt-list-small --seeds 0,1,2,3,4 --control",
          "run", check_quality_table_nmt_list, "flags parsed; the README table is --summarize of the recorded runs"),
    Cover(("block:text",), r"NORWAY; .*", "run", check_nmt_list_example, "a training example, as written"),
    Cover(("block:yaml",), r"benchmarks: \[glue-sst2, glue-rte\].*", "run", check_pretrain_block,
          "a sweep file with the README's lines: validated and planned in two phases"),
    Cover(IN, r"python -m flurka\.(speed|theory|training\.quality_table)( --seeds [0-9,]+)?", "run",
          check_subcommand, "the module exists"),
    Cover(("block:text",), r"Up-training α, nmt-list-small: .*", "covered", check_main_job_output,
          "what make sweep printed: the summary's headings and observation lines, in its order "
          "(tests/platform/test_sweep_tables.py prints it from a database)"),
    # -- data ---------------------------------------------------------------------------------
    Cover(IN, r"tfds build NAME .*", "parse", check_tfds,
          "tfds's own build parser (needs TensorFlow + data to run); reading TFDS data: tests/data"),
    Cover(IN, r"pip install -e \S+( --no-deps)?", "parse", check_pip, "pip's parser; the extra exists"),
    # -- benchmarks/README.md: GPU commands -----------------------------------------------------
    Cover(SH, r"python -m flurka\.speed --sweep (n-sweep|dk-sweep|dmodel-sweep|flash-compare|claims-boundary) --dtype bfloat16 "
              r"--out benchmarks/\S+\.json", "parse", check_speed_gpu, "GPU: --list (its points), nothing measured"),
    Cover(SH, r"python experiments/speed_sweep\.py --sweep n-sweep --dtype bfloat16 --out benchmarks/\S+\.json",
          "parse", check_speed_gpu, "GPU via Ray: --list through the script's parser"),
    Cover(SH, r"python experiments/speed_sweep\.py --sweep tiny --cpu --num-cpus 2 --out /tmp/tiny\.json", "covered",
          check_speed_ray_cpu, "tests/speed/test_speed_ray.py [slow] runs it (two mechanisms); --list here"),
    Cover(IN, r"python benchmarks/gpu_session\.py --out DIR( --[a-z-]+( [\w.,'-]+)?)+", "covered", check_gpu_session,
          "GPU lease script: its --help knows the flags; tests/speed/test_speed_gpu_session.py runs it (--tiny)"),
    Cover(SH, r"python benchmarks/input_pipeline\.py --out benchmarks/results/cpu/DIR/input-pipeline\.json", "run",
          check_input_pipeline, "one shipped set, 0.2 s a mode, into a tmp dir (the full run: under 3 min)"),
    Cover(IN, r"OUT=DIR bash benchmarks/gpu_lease\.sh", "covered", check_gpu_lease,
          "the lease script: tests/speed/test_speed_gpu_session.py starts it (--help) and checks its flags"),
    Cover(SH, r"python -m flurka\.theory --seq-len \d+ .* --out benchmarks/\S+\.json", "parse",
          check_theory_gpu, "GPU size: parsed and validated (layers built abstractly), not computed"),
]


def _cover_of(cmd: Command) -> Cover:
    """The first entry that matches (the table is ordered: specific patterns before general ones)."""
    found = [c for c in COVERAGE if c.matches(cmd)]
    if not found:
        raise AssertionError(
            f"{cmd.doc}:{cmd.line}: `{cmd.text[:200]}` is not covered. Add an entry to COVERAGE in "
            f"tests/infra/test_readme_commands.py that runs it here (tiny sizes, tmp dirs, 127.0.0.1) or "
            f"names the existing test that runs it.")
    return found[0]


def _params():
    out = []
    for cmd in COMMANDS:
        slow = next((c.slow for c in COVERAGE if c.matches(cmd)), False)
        out.append(pytest.param(cmd, id=cmd.id, marks=[pytest.mark.slow] if slow else []))
    return out


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------
def test_commands_are_read():
    kinds = {c.kind for c in COMMANDS}
    assert {"shell", "inline", "sql", "python"} <= kinds
    assert sum(c.doc == "README.md" for c in COMMANDS) >= 25
    assert sum(c.doc == "benchmarks/README.md" for c in COMMANDS) >= 6


def test_every_readme_command_is_covered():
    problems = []
    for cmd in COMMANDS:
        try:
            _cover_of(cmd)
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)


def test_no_stale_coverage_entries():
    used = {id(_cover_of(cmd)) for cmd in COMMANDS if any(c.matches(cmd) for c in COVERAGE)}
    stale = [c.pattern for c in COVERAGE if id(c) not in used]
    assert not stale, f"COVERAGE entries that match no README command (remove or update them): {stale}"


def test_extraction_catches_a_new_command(tmp_path, monkeypatch):
    """A command added to a README without an entry is reported, with what to do."""
    doc = tmp_path / "NEW.md"
    doc.write_text("Run `ray down --yes cluster.yaml` first.\n\n"
                   "```bash\nflurka flops --seq-len 9 --d-model 8 --heads 2 "
                   "--d-k 4 --json\nmake deploy   # new\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    cmds = extract("NEW.md")
    assert [(c.kind, c.text) for c in cmds] == [
        ("shell", "flurka flops --seq-len 9 --d-model 8 --heads 2 --d-k 4 --json"), ("shell", "make deploy"),
        ("inline", "ray down --yes cluster.yaml")]
    with pytest.raises(AssertionError, match="is not covered. Add an entry to COVERAGE"):
        _cover_of(cmds[1])
    with pytest.raises(AssertionError, match="not covered"):
        _cover_of(cmds[2])
    doc.write_text("```yaml\nkey: value\n```\n")  # a block of a language nobody has classified
    (block,) = extract("NEW.md")
    assert block.kind == "block:yaml"
    with pytest.raises(AssertionError, match="not covered"):
        _cover_of(block)


@pytest.mark.parametrize("cmd", _params())
def test_readme_command(cmd, request, tmp_path):
    _cover_of(cmd).check(cmd, Ctx(request, tmp_path))


# ---------------------------------------------------------------------------------------------
# The README's paths end to end (slow)
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_flurka_ui_serves_the_runs(tmp_path, chromium_binary):
    """The README's ``flurka ui --run-dir runs/uptrain-small`` (``--port`` a free one instead of 5000)
    serves a sweep's MLflow store on 127.0.0.1: its experiment and runs over MLflow's REST API; the
    page it names opens, in a new user's Chromium, on the sweep's runs in the model-training view
    (issue 59: MLflow 3 lands on GenAI traces); a SIGTERM to flurka ui (not its group) stops every
    server process it started (issue 59: they kept the port)."""
    from mlflow.tracking import MlflowClient

    from flurka.tracking.mlflow_runs import experiment_id

    store = tmp_path / RUN_DIR / "mlflow.db"
    store.parent.mkdir(parents=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = experiment_id(client, "uptrain-small", (tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment, run_name="lra-listops-small:flurka-rnn:a0.5")
    client.log_param(run.info.run_id, "config.alpha", "0.5")
    client.log_metric(run.info.run_id, "accuracy", 0.31)
    client.set_terminated(run.info.run_id)
    client.set_experiment_tag(experiment, "mlflow.note.content", "**Sweep x**: the result, 80.6 ± 6.4 (n=3)")
    ui_cmd = next(c for c in COMMANDS if c.kind == "shell" and c.text.startswith("flurka ui"))
    (port,) = free_ports(1)
    ui = subprocess.Popen([str(BIN / "flurka"), *tokens(ui_cmd)[1:], "--port", str(port)], cwd=tmp_path,
                          env={**os.environ, "MLFLOW_WORKERS": "1"},  # one server process, not 4: 2 cores
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert b"<html" in wait_http(f"{base}/", ui, 240).lower()
        body = wait_http(f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=uptrain-small", ui, 30)
        assert json.loads(body)["experiment"]["experiment_id"] == experiment
        body = wait_http(f"{base}/ajax-api/2.0/mlflow/runs/get?run_id={run.info.run_id}", ui, 30)
        got = json.loads(body)["run"]
        assert got["info"]["run_name"] == "lra-listops-small:flurka-rnn:a0.5"
        metrics = {m["key"]: m["value"] for m in got["data"]["metrics"]}
        assert metrics == {"accuracy": 0.31}
        lines = iter(ui.stdout.readline, "")
        url = next(line for line in lines if line.startswith("MLflow UI on ")).split()[3]
        assert url == f"{base}/#/experiments/{experiment}?workflowType=machine_learning"
        dom = browser.chromium(chromium_binary, tmp_path, "--virtual-time-budget=30000", "--window-size=1400,1000",
                               "--dump-dom", url, timeout=120).stdout
        assert "<title>Runs - " in dom, dom[:500]                    # the runs page, not GenAI's overview
        assert "lra-listops-small:flurka-rnn:a0.5" in dom            # its table lists the run
        assert "80.6 ± 6.4 (n=3)" in dom                             # the description: the sweep's result
        assert "Detect Issues" not in dom and "Token Usage" not in dom
        os.kill(ui.pid, signal.SIGTERM)           # flurka ui alone: it stops the server it started
        assert ui.wait(60) == 143
        assert not wait_gone(str(store), 5), "MLflow UI processes outlived flurka ui's SIGTERM"
        assert "flurka ui: stopped the MLflow server" in ui.stdout.read()
    finally:
        stop_group(ui)
        assert not wait_gone(str(store), 60), "MLflow UI processes outlived the stop"


@pytest.mark.slow
def test_token_auth_cluster_path(tmp_path):
    """The README's cluster commands on 127.0.0.1: ``ray get-auth-token --generate`` (HOME in a tmp
    dir), the token-auth head and a worker joining it with the token, a job submission refused
    without the token and accepted with it (the README's sweep submission; this machine has no GPU,
    so the sweep's preflight refuses ``--gpus-per-trial 0.5`` as documented, from inside the job)."""
    shell_cmds = [c for c in COMMANDS if c.kind == "shell" and c.doc == "README.md"]
    by = {name: next(c for c in shell_cmds if re.fullmatch(p, c.text)) for name, p in {
        "generate": r"ray get-auth-token --generate > /dev/null", "chmod": r"chmod 600 .*",
        "head": r"RAY_AUTH_MODE=token ray start --head .*",
        "worker": r"RAY_AUTH_MODE=token .*ray start --address .*", "export": r"export .*",
        "submit": r"flurka submit .*"}.items()}
    home = tmp_path / "home"
    home.mkdir()
    temp_dir = tempfile.mkdtemp(prefix="frt-", dir="/tmp")  # short: unix sockets live here
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base_env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0",
                    RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")   # else a SIGTERMed node waits 30 s to drain

    gen = shell(["bash", "-c", by["generate"].text.replace("ray ", f"{BIN / 'ray'} ", 1)], tmp_path, 120,
                base_env)
    assert gen.returncode == 0 and not gen.stdout.strip(), gen.stderr[-2000:]   # nothing printed
    token_file = home / ".ray" / "auth_token"
    token = token_file.read_text().strip()
    assert len(token) >= 16
    assert shell(["bash", "-c", by["chmod"].text], tmp_path, 30, base_env).returncode == 0
    assert token_file.stat().st_mode & 0o777 == 0o600   # owner-only, as the README makes it

    def token_home(name: str) -> Path:
        """Another machine's home with the token file copied there, owner-only."""
        other = tmp_path / name / ".ray"
        other.mkdir(parents=True)
        shutil.copy(token_file, other / "auth_token")
        (other / "auth_token").chmod(0o600)
        return other.parent

    head_ports, ports = ray_node_ports(head=True)
    worker_ports, _ = ray_node_ports(head=False, avoid=(ports["min-worker-port"], ports["max-worker-port"]))
    gcs, dash = ports["port"], ports["dashboard-port"]
    head_env, head_argv = env_prefix(tokens(by["head"]))
    head_argv = [a.replace("<private-ip>", "127.0.0.1") for a in head_argv]  # the test's private interface
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    head = subprocess.Popen(
        [str(BIN / "ray"), *head_argv[1:], *common, *head_ports, "--include-dashboard", "true",
         "--temp-dir", temp_dir],
        env={**base_env, **head_env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    worker = None
    try:
        version = f"http://127.0.0.1:{dash}/api/version"
        wait_http(version, head, 180, {"Authorization": f"Bearer {token}"})
        with pytest.raises(urllib.error.HTTPError) as no_token:  # the dashboard wants the token
            urllib.request.urlopen(version, timeout=10)
        assert no_token.value.code in (401, 403)
        worker_env, worker_argv = env_prefix(tokens(by["worker"]))
        worker_home = token_home("worker-home")
        worker_env = {k: v.replace("~", str(worker_home), 1) for k, v in worker_env.items()}
        worker_argv = [a.replace("<head>:6379", f"127.0.0.1:{gcs}") for a in worker_argv]
        worker = JoiningNode(lambda: subprocess.Popen(
            [str(BIN / "ray"), *worker_argv[1:], *common, *worker_ports],
            env={**base_env, "HOME": str(worker_home), **worker_env}, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))

        client_env = {k: v for k, v in base_env.items()}
        client_env["HOME"] = str(tmp_path)  # the client has no token file yet
        submit = tokens(by["submit"])
        submit = [a.replace("http://<head>:8265", f"http://127.0.0.1:{dash}").replace("/shared/runs/uptrain-small",
                                                                                      str(tmp_path / "run"))
                  for a in submit]
        submit[submit.index("--working-dir") + 1] = str(ROOT)
        refused = shell([*submit[:submit.index("--")], "--no-wait", "--", "python", "-c", "print(1)"], tmp_path, 120,
                        client_env)
        assert refused.returncode != 0, refused.stdout[-2000:]
        assert "auth" in (refused.stdout + refused.stderr).lower()

        exported = dict(a.split("=", 1) for a in tokens(by["export"])[1:])
        client_home = token_home("client-home")
        client_env["HOME"] = str(client_home)
        client_env.update({k: v.replace("~", str(client_home), 1) for k, v in exported.items()})
        assert "RAY_AUTH_TOKEN" not in client_env   # the file, not the token, in the environment
        job = shell(submit, tmp_path, 300, client_env)
        logs = job.stdout + job.stderr
        assert "uptrain_sweep: error:" in logs and "GPU" in logs, logs[-4000:]
        assert job.returncode != 0  # FAILED: the preflight, one line, exit 2, before any trial
        assert not (tmp_path / "run" / "tune").exists()

        deadline = time.monotonic() + 90
        while True:  # meanwhile the worker node has joined the head with the token
            status = shell(["ray", "status", "--address", f"127.0.0.1:{gcs}"], tmp_path, 60, client_env)
            if status.stdout.count("node_") >= 2 or time.monotonic() > deadline:
                break
            worker.check()
            time.sleep(2)
        assert status.stdout.count("node_") >= 2, (status.stdout + status.stderr)[-3000:]
    finally:
        stop_group(worker and worker.proc, head, grace_s=5)  # a throwaway cluster: SIGKILL after 5 s
        leftovers = wait_gone(temp_dir, 10)   # only processes of this test's two nodes
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not leftovers, f"node processes survived the stop: {leftovers}"
