"""Property tests of the sweep spec and the ``--set`` parser (hypothesis): random flag values and
random sweep YAML documents either plan, or end in one short line (a SpecError / ValueError, or
argparse's exit 2) — never a traceback from deeper down, never a file written before the plan.

The case table of known bad inputs stays in test_sweep_bad_input.py; this file looks for the
cases nobody listed. What it checks is what the driver does before Ray starts: parse, validate,
check the paths, plan (``runner.preflight`` minus creating the run dir and its stores).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flurka.configs import BENCHMARKS, get_config
from flurka.configs.overrides import parse_assignments
from flurka.catalogue.mechanisms import FLURKA
from flurka.sweeps import spec as S
from flurka.sweeps.branching import make_plan

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LONGEST_LINE = 1200  # a message names the key and the valid choices (48 config fields), and cuts
TYPED = re.compile(r"\S{101,}")   # what the user typed (no run of 100 characters without a space)

# Text that is nearly right more often than random: valid names and numbers next to junk.
WORDS = st.sampled_from(["nmt-small", "lra-listops-small", "glue-foo", *FLURKA, "flurka-x", "low-rank", "kernel",
                         "0", "1", "-1", "0.5", "1e20", "2147483648", "nan", "inf", "", " ", ",", "=", "{", "'",
                         "d_k=8", "steps=3", "attention_options={'d_k': 4}", "x" * 300, "../../etc", "ü", "\x00"])
TEXT = st.one_of(WORDS, st.text(max_size=40), st.lists(WORDS, min_size=1, max_size=4).map(",".join))
FLAGS = ["--benchmarks", "--variants", "--alphas", "--d-k", "--base", "--num-samples", "--seeds", "--steps", "--set",
         "--e-init", "--cpus-per-trial", "--gpus-per-trial", "--max-failures", "--name", "--checkpoint-every",
         "--num-cpus", "--search", "--scheduler"]
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
              st.floats(allow_nan=True, allow_infinity=True), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12)
YAML_KEYS = st.one_of(st.sampled_from(sorted(S._FIELDS - {"run_dir", "resume", "new", "address", "mlflow_uri",
                                                           "results_db", "compilation_cache"})), TEXT)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _outcome(argv: list[str], root: Path) -> str:
    """Parse, validate, check the paths and plan as the driver does before anything is created:
    "planned" or "refused" (one line); anything else fails the test."""
    before = _files(root)
    try:
        sweep = S.validate(S.parse(argv))
        S.check_paths(sweep)
        plan = make_plan(sweep)
    except SystemExit as exc:              # argparse: its one line, exit 2
        assert exc.code == 2
        outcome = "refused"
    except ValueError as exc:              # SpecError and the configs' one-line ValueErrors
        text = str(exc)
        assert text and "\n" not in text and len(text) <= LONGEST_LINE and not TYPED.search(text), repr(text[:200])
        assert "Traceback" not in text
        outcome = "refused"
    else:
        assert plan.branches or plan.baselines, "a valid spec plans at least one run"
        outcome = "planned"
    assert _files(root) == before, "nothing is written before the plan"
    return outcome


@SETTINGS
@given(flags=st.lists(st.tuples(st.sampled_from(FLAGS), TEXT), max_size=5),
       benchmarks=st.one_of(st.just("nmt-small"), TEXT))
def test_random_flags_plan_or_refuse_in_one_line(flags, benchmarks):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        argv = ["--benchmarks", benchmarks, "--run-dir", str(root / "run")]
        for flag, value in flags:
            argv += [flag, value]
        _outcome(argv, root)


@SETTINGS
@given(doc=st.dictionaries(YAML_KEYS, JSONISH, max_size=6), benchmarks=st.one_of(st.just(["nmt-small"]), JSONISH))
def test_random_sweep_files_plan_or_refuse_in_one_line(doc, benchmarks):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "sweep.yaml"
        path.write_text(yaml.safe_dump({"benchmarks": benchmarks, **doc}, allow_unicode=True))
        _outcome(["--config", str(path), "--run-dir", str(root / "run")], root)


def test_a_valid_spec_plans():
    """The properties above are not vacuous: the main job's own sweep file plans."""
    with tempfile.TemporaryDirectory() as tmp:
        assert _outcome(["--config", "uptrain-small", "--run-dir", os.path.join(tmp, "run")], Path(tmp)) == "planned"


@SETTINGS
@given(items=st.lists(TEXT, max_size=4))
def test_set_assignments_parse_or_refuse_in_one_line(items):
    """``--set`` (train and sweep): each item FIELD=VALUE becomes a value, or one ValueError line;
    what it parses to, given to a benchmark config, builds it or is one ValueError line."""
    try:
        overrides = parse_assignments(items)
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) <= LONGEST_LINE and not TYPED.search(str(exc))
        return
    assert all(isinstance(k, str) and k for k in overrides)
    try:
        config = get_config("nmt-small", **overrides)
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) <= LONGEST_LINE and not TYPED.search(str(exc)), repr(str(exc)[:200])
    else:
        assert config.benchmark == "nmt-small" and config.steps <= 2**31 - 1
        assert not (isinstance(config.learning_rate, float) and math.isnan(config.learning_rate))


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_every_benchmark_plans_from_flags(benchmark):
    with tempfile.TemporaryDirectory() as tmp:
        assert _outcome(["--benchmarks", benchmark, "--steps", "16", "--run-dir", os.path.join(tmp, "run")],
                        Path(tmp)) == "planned"
