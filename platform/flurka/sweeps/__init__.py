"""Ray Tune sweeps of FLuRKA up-training (α, d_k) per variant and benchmark.

``spec`` (what to run, validated), ``branching`` (the plan: base runs and the α branches forked
from them), ``trainable`` (one run inside a Tune trial), ``runner`` (the Tuners, MLflow, results
DB), ``cli`` (``flurka sweep``). Importing this package does not import Ray; :func:`run_sweep`
does.

    from flurka.sweeps import SweepSpec, run_sweep
    outcome = run_sweep(SweepSpec(benchmarks=("nmt-small",), variants=("flurka-performer",),
                                  alphas=(0.375,), seeds=(0, 1, 2), run_dir="runs/mine"))
    outcome.tables["uptraining_nmt-small"]      # Table 5's shape, mean ± CI over the seeds
"""

from flurka.sweeps.branching import Plan, PlannedRun, describe, make_plan
from flurka.sweeps.spec import PAPER_ALPHAS, SpecError, SweepSpec, from_args, parse, validate


def run_sweep(spec: SweepSpec):
    """Run ``spec`` (:func:`flurka.sweeps.runner.run_sweep`): returns the sweep's outcome (its
    id, run dir, stores, per-trial results, failed / skipped trials, tables, time split)."""
    from flurka.sweeps.runner import run_sweep as run   # Ray, MLflow, JAX: specs and plans import without them

    return run(spec)


__all__ = ["PAPER_ALPHAS", "Plan", "PlannedRun", "SpecError", "SweepSpec", "describe", "from_args",
           "make_plan", "parse", "run_sweep", "validate"]
