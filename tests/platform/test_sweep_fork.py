"""A branch forked from the base checkpoint at α·T is the independent up-training run."""

from __future__ import annotations

import numpy as np
import pytest

from flurka import training
from flurka.sweeps.branching import make_plan
from flurka.sweeps.spec import SweepSpec, validate
from flurka.sweeps.trainable import build_config, train_overrides

@pytest.mark.slow
def test_forked_branch_equals_independent_run(tmp_path, tiny_overrides):
    spec = validate(SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-performer",), alphas=(0.5,),
                              steps=8, overrides=tiny_overrides, baselines=True, run_dir=str(tmp_path)))
    plan = make_plan(spec)
    (branch,) = plan.branches
    base = next(r for r in plan.baselines if r.key == branch.base_key)   # the Linformer baseline doubles as base
    assert base.attention == "linformer" and base.fork_steps == (4,) and branch.start_step == 4

    def cfg(run):
        o = train_overrides(run, spec.overrides, run_dir=str(tmp_path), steps=spec.steps,
                            checkpoint_every=None)
        return build_config({"run": run.to_dict(), "train": o})[1]

    training.run(cfg(base))
    forked = training.run(cfg(branch))
    independent = training.run(cfg(branch).replace(base_checkpoint=None, workdir=None, checkpoint_every=0))
    assert forked["status"] == independent["status"] == "ok"
    got = [(h["step"], h["loss"]) for h in forked["history"]]
    want = [(h["step"], h["loss"]) for h in independent["history"]]
    assert [s for s, _ in got] == [s for s, _ in want] == [2, 4, 6, 8]
    np.testing.assert_array_equal([l for _, l in got], [l for _, l in want])
    assert forked["final_metrics"] == independent["final_metrics"]
