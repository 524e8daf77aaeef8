"""Ray Tune sweeps of FLuRKA up-training (α, d_k) per variant and benchmark.

``spec`` (what to run, validated), ``branching`` (the plan: base runs and the α branches forked
from them), ``trainable`` (one run inside a Tune trial), ``runner`` (the Tuners, MLflow, results
DB). Importing this package does not import Ray; ``runner.run_sweep`` does.
"""

from flurka.sweeps.branching import Plan, PlannedRun, describe, fork_step, make_plan
from flurka.sweeps.spec import PAPER_ALPHAS, SpecError, SweepSpec, from_args, parse, validate

__all__ = ["PAPER_ALPHAS", "Plan", "PlannedRun", "SpecError", "SweepSpec", "describe", "fork_step", "from_args",
           "make_plan", "parse", "validate"]
