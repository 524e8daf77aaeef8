"""The non-grid paths: Optuna choosing among the planned α branches, ASHA stopping the poor ones."""

from __future__ import annotations

import pytest

from flurka.sweeps.runner import run_sweep
from flurka.sweeps.spec import SweepSpec


@pytest.mark.slow
def test_optuna_search_with_asha(tmp_path, tiny_overrides):
    alphas = (0.25, 0.5, 0.75)
    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=alphas, steps=16,
                     overrides=tiny_overrides, baselines=False, run_dir=str(tmp_path / "run"), num_cpus=2,
                     search="optuna", scheduler="asha", num_samples=4, name="optuna-asha")
    out = run_sweep(spec)
    assert not out.failed
    branches = {k: r for k, r in out.results.items() if k.startswith("branch/")}
    # Optuna drew 4 samples from the 3 planned branches: every sample is one of them (it found its
    # base checkpoint); a repeat reuses the branch's run key, so 1..3 distinct branches.
    seen = set(branches) | {k for k in out.stopped if k.startswith("branch/")}
    assert 1 <= len(seen) <= 3 and all(k.rsplit("/a", 1)[1].split("-")[0] in {"0.25", "0.5", "0.75"} for k in seen)
    # ASHA (grace period T/4 = 4 steps) stops the worse branches early; at least the first branch
    # to reach each rung goes on, so some branch finishes all 16 steps with its final metric.
    assert branches, f"every branch was stopped: {out.stopped}"
    for key, r in branches.items():
        assert r["steps"] == 16 and r["attention"] == "flurka-rnn" and r["config"]["alpha"] in alphas
        assert "accuracy" in r["final_metrics"]
