"""Sweep specs: every mistake is one line before anything runs; YAML and flags agree."""

from __future__ import annotations

import pytest

from flurka.sweeps.spec import PAPER_ALPHAS, SpecError, SweepSpec, parse, validate


def _err(spec: SweepSpec) -> str:
    with pytest.raises(SpecError) as info:
        validate(spec)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_paper_alpha_grid():
    assert PAPER_ALPHAS == (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)


def test_unknown_benchmark_names_valid_ones():
    msg = _err(SweepSpec(benchmarks=("lra-nope",)))
    assert "lra-nope" in msg and "lra-listops" in msg


def test_unknown_variant_names_valid_ones():
    msg = _err(SweepSpec(benchmarks=("lra-listops",), variants=("flurka-softmax",)))
    assert "flurka-softmax" in msg and "flurka-performer" in msg and "flurka-eva" in msg


def test_constituent_is_not_a_variant():
    assert "performer" in _err(SweepSpec(benchmarks=("lra-listops",), variants=("performer",)))


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_alpha_outside_unit_interval(alpha):
    assert "outside [0, 1]" in _err(SweepSpec(benchmarks=("lra-listops",), alphas=(0.5, alpha)))


def test_d_k_longer_than_sequence():
    msg = _err(SweepSpec(benchmarks=("lra-listops",), d_k=(64, 4096)))
    assert "d_k=4096" in msg and "2000" in msg


@pytest.mark.parametrize("field,value,needle", [
    ("base", "sparse", "low-rank"), ("search", "random", "optuna"), ("scheduler", "pbt", "asha"),
    ("num_samples", 0, "num-samples"), ("cpus_per_trial", 0, "cpus-per-trial"),
    ("gpus_per_trial", 1.5, "gpus-per-trial"), ("seeds", (), "seeds"),
])
def test_other_bad_fields(field, value, needle):
    assert needle in _err(SweepSpec(benchmarks=("lra-listops",), **{field: value}))


def test_valid_spec_fills_defaults():
    spec = validate(SweepSpec(benchmarks=("lra-listops",)))
    assert spec.variants == ("flurka-performer", "flurka-rnn", "flurka-eva")
    assert spec.alphas == PAPER_ALPHAS


def test_yaml_and_flags(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("benchmarks: [lra-listops, lra-image]\nvariants: flurka-eva\nalphas: [0.25, 0.5]\n"
                    "d-k: 32\nseeds: [0, 1]\ngpus_per_trial: 0.25\noverrides: {batch_size: 4}\n")
    spec = parse(["--config", str(path), "--alphas", "0.125,0.75", "--set", "steps=4000"])
    assert spec.benchmarks == ("lra-listops", "lra-image")
    assert spec.variants == ("flurka-eva",)
    assert spec.alphas == (0.125, 0.75)           # the flag wins over the file
    assert spec.d_k == (32,) and spec.seeds == (0, 1) and spec.gpus_per_trial == 0.25
    assert spec.overrides == {"batch_size": 4, "steps": 4000}
    validate(spec)


def test_unknown_yaml_key(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("benchmarks: [lra-listops]\nlearning_rat: 3\n")
    with pytest.raises(SpecError, match="learning_rat"):
        parse(["--config", str(path)])


def test_missing_benchmarks():
    with pytest.raises(SpecError, match="benchmarks"):
        parse([])


def test_compilation_cache_under_the_run_dir_unless_given_or_off(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    spec = parse(["--benchmarks", "lra-listops", "--run-dir", str(tmp_path / "run")])
    assert spec.compilation_cache_dir == str((tmp_path / "run" / "jax-cache").resolve())
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "users"))     # JAX's own variable
    assert spec.compilation_cache_dir == str((tmp_path / "users").resolve())
    spec = parse(["--benchmarks", "lra-listops", "--compilation-cache", str(tmp_path / "cache")])
    assert spec.compilation_cache_dir == str((tmp_path / "cache").resolve())
    assert parse(["--benchmarks", "lra-listops", "--compilation-cache", "off"]).compilation_cache_dir is None


def test_base_and_alphas_per_variant_from_yaml_and_flags(tmp_path):
    """The paper's appendix, written down: a base (and optionally α) per variant; a variant not
    named keeps the defaults (low-rank, the paper's α grid)."""
    path = tmp_path / "sweep.yaml"
    path.write_text("benchmarks: [lra-listops]\nbase: {flurka-rnn: kernel}\n"
                    "alphas: {flurka-rnn: [0.64], flurka-eva: [0.25, 0.8]}\n")
    spec = validate(parse(["--config", str(path)]))
    assert [spec.base_of(v) for v in spec.variants] == ["low-rank", "kernel", "low-rank"]
    assert spec.alphas_of("flurka-rnn") == (0.64,) and spec.alphas_of("flurka-eva") == (0.25, 0.8)
    assert spec.alphas_of("flurka-performer") == PAPER_ALPHAS
    assert spec.all_alphas == tuple(sorted({*PAPER_ALPHAS, 0.64, 0.8}))
    flags = validate(parse(["--benchmarks", "lra-listops", "--base", "flurka-rnn=kernel,flurka-eva=kernel"]))
    assert flags.base == {"flurka-rnn": "kernel", "flurka-eva": "kernel"} and flags.base_of("flurka-performer") == "low-rank"
    assert validate(parse(["--benchmarks", "lra-listops", "--base", "kernel"])).base_of("flurka-eva") == "kernel"


@pytest.mark.parametrize("field,value,needle", [
    ("base", {"flurka-rnn": "sparse"}, "base of flurka-rnn 'sparse'"),
    ("base", {"performer": "kernel"}, "'performer' is not one of the sweep's variants"),
    ("alphas", {"flurka-rnn": (1.5,)}, "α=1.5 of flurka-rnn is outside [0, 1]"),
    ("alphas", {"flurka-rnn": ()}, "--alphas of flurka-rnn is empty"),
    ("alphas", {"flurka-rnn": (0.5, 0.5)}, "duplicates"),
])
def test_bad_values_per_variant(field, value, needle):
    assert needle in _err(SweepSpec(benchmarks=("lra-listops",), **{field: value}))


def test_a_search_over_alpha_needs_one_alpha_list():
    msg = _err(SweepSpec(benchmarks=("lra-listops",), search="optuna", alphas={"flurka-rnn": (0.5,)}))
    assert "one α list" in msg


def test_a_per_variant_value_of_the_wrong_type_is_one_line():
    with pytest.raises(SpecError, match="base must be a string, or a mapping"):
        parse(["--benchmarks", "lra-listops", "--base", "flurka-rnn="])
