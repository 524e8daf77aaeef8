"""The branching plan: which runs a sweep executes, and the compute it saves."""

from __future__ import annotations

import pytest

from flurka.results.quality_tables import PAPER_BEST_ALPHA
from flurka.configs import switch_step
from flurka.sweeps.branching import describe, make_plan
from flurka.sweeps.spec import PAPER_ALPHAS, SweepSpec, validate


def _plan(**kw):
    spec = validate(SweepSpec(benchmarks=("lra-listops",), **kw))
    return spec, make_plan(spec, steps={"lra-listops": 800}, d_ks={"lra-listops": tuple(spec.d_k) or (128,)})


def test_seven_point_grid_needs_at_most_065_of_the_steps():
    _, plan = _plan(variants=("flurka-performer",), base="kernel", baselines=False)
    c = plan.compute()
    assert c["uptrain_steps_independent"] == 7 * 800
    # one base run to 0.875 T, then Σ (1 - α) T over the branches: 0.875 + 3.5 = 4.375 of 7
    assert c["uptrain_steps_executed"] == 700 + sum(800 - round(a * 800) for a in PAPER_ALPHAS)
    assert c["uptrain_compute_ratio"] == pytest.approx(4.375 / 7) and c["uptrain_compute_ratio"] <= 0.65
    # the plan's line says what trains from scratch, what forks, and the saving (issue 59: "3600 of
    # 3600 steps of independent runs (1.000×)" said none of it)
    assert describe(plan) == ("plan: 0 baselines and 1 separate base run from scratch, 7 α branches (7 forked "
                              "from their base's checkpoint at step α·T); up-training trains 3500 steps, 62% of "
                              "the 5600 of every α from scratch")


def test_low_rank_base_is_shared_by_variants():
    _, plan = _plan(base="low-rank", baselines=False)
    assert len(plan.bases) == 1 and plan.bases[0].attention == "linformer"
    assert len(plan.branches) == 3 * 7
    assert {b.base_key for b in plan.branches} == {plan.bases[0].key}
    assert plan.compute()["uptrain_compute_ratio"] == pytest.approx((700 + 3 * 3.5 * 800) / (21 * 800))


def test_kernel_base_per_variant_and_d_k():
    _, plan = _plan(base="kernel", d_k=(32, 64), seeds=(0, 1), baselines=False)
    # the kernel base has no d_k: one per (variant, seed), shared by both d_k
    assert sorted(b.attention for b in plan.bases) == sorted(["performer", "rnn", "eva"] * 2)
    assert len(plan.branches) == 3 * 2 * 2 * 7
    for br in plan.branches:
        base = next(b for b in plan.bases if b.key == br.base_key)
        assert base.attention == br.attention.removeprefix("flurka-") and base.seed == br.seed
        assert br.start_step == switch_step(br.alpha, br.steps) and br.start_step in base.fork_steps


def test_base_checkpoints_at_every_fork_and_stops_at_the_last():
    _, plan = _plan(variants=("flurka-rnn",), alphas=(0.25, 0.5), base="low-rank", baselines=False)
    (base,) = plan.bases
    assert base.fork_steps == (200, 400) and base.stop_step == 400 and base.executed_steps == 400


def test_baselines_as_in_table_5():
    _, plan = _plan(d_k=(32, 64))
    got = sorted((r.attention, r.d_k) for r in plan.baselines)
    assert got == sorted([("full", None), ("linformer", 32), ("linformer", 64), ("linformer", 1),
                          ("performer", None), ("rnn", None), ("eva", None)])
    _, plan = _plan(d_k=(32,), control=False)
    assert ("linformer", 1) not in {(r.attention, r.d_k) for r in plan.baselines}


def test_the_control_is_one_linformer_run_at_d_k_1_per_seed():
    """The no-attention control (each table's floor row): a baseline per (benchmark, seed), nothing
    forks from it, and it is left out with the other baselines."""
    _, plan = _plan(variants=("flurka-rnn",), alphas=(0.5,), d_k=(8, 16), seeds=(0, 1, 2))
    control = [r for r in plan.baselines if (r.attention, r.d_k) == ("linformer", 1)]
    assert sorted(r.seed for r in control) == [0, 1, 2] and not any(r.fork_steps for r in control)
    assert all(r.executed_steps == 800 for r in control)
    _, plan = _plan(variants=("flurka-rnn",), alphas=(0.5,), baselines=False)
    assert not plan.baselines


def test_base_and_alphas_per_variant():
    """The paper's appendix: Linformer-RNN up-trained from its kernel constituent, the others from
    Linformer, each at α of its own: each branch forks from its own base at its own α."""
    _, plan = _plan(base={"flurka-rnn": "kernel"}, alphas={"flurka-rnn": (0.64,), "flurka-performer": (0.8,)},
                    d_k=(32,), full=False)
    got = {(b.attention, b.alpha): b for b in plan.branches}
    assert set(got) == {("flurka-rnn", 0.64), ("flurka-performer", 0.8)} | {("flurka-eva", a) for a in PAPER_ALPHAS}
    assert got[("flurka-rnn", 0.64)].base == "rnn" and got[("flurka-performer", 0.8)].base == "linformer"
    bases = {r.key: r for r in plan.forked_from}
    assert bases[got[("flurka-rnn", 0.64)].base_key].attention == "rnn"
    assert bases[got[("flurka-rnn", 0.64)].base_key].fork_steps == (512,)
    assert bases[got[("flurka-performer", 0.8)].base_key].attention == "linformer"
    assert 640 in bases[got[("flurka-performer", 0.8)].base_key].fork_steps


def test_no_branching_is_the_papers_way():
    _, plan = _plan(variants=("flurka-eva",), branching=False, baselines=False)
    assert not plan.bases and all(b.start_step == 0 for b in plan.branches)
    assert plan.compute()["uptrain_compute_ratio"] == 1.0


def test_keys_are_unique():
    _, plan = _plan(d_k=(32, 64), seeds=(0, 1))
    keys = [r.key for r in plan.baselines + plan.bases + plan.branches]
    assert len(keys) == len(set(keys))


def test_baseline_doubles_as_base_when_baselines_run():
    _, plan = _plan(variants=("flurka-performer",), base="low-rank")
    assert not plan.bases
    (base,) = plan.forked_from
    assert base.kind == "baseline" and base.attention == "linformer" and base.stop_step is None
    assert base.fork_steps == tuple(round(a * 800) for a in PAPER_ALPHAS)
    assert plan.compute()["uptrain_compute_ratio"] == pytest.approx(4.375 / 7)


def test_alpha_without_an_inner_fork_step_trains_independently():
    _, plan = _plan(variants=("flurka-eva",), alphas=(0.0, 0.5, 1.0), baselines=False)
    starts = {b.alpha: (b.start_step, b.base_key is not None) for b in plan.branches}
    assert starts == {0.0: (0, False), 0.5: (400, True), 1.0: (0, False)}


@pytest.mark.parametrize("config", ["uptrain-small", "uptrain-full"])
def test_main_job_trains_one_linformer_base_per_d_k_and_seed(config):
    """The main job (make sweep) and Table 5 whole (make sweep-full): the Linformer baseline of
    each (benchmark, d_k, seed) is the base every variant's α branches fork from, so no variant
    trains a base of its own; full attention is left out (not a constituent)."""
    from flurka.sweeps.spec import from_args

    spec = validate(from_args({"config": config}))   # the installed sweep file of that name
    plan = make_plan(spec)
    assert len(spec.seeds) >= 3 and not plan.bases and spec.control
    linformer = {(r.benchmark, r.d_k, r.seed): r for r in plan.baselines if r.attention == "linformer" and r.d_k != 1}
    assert len(linformer) == len(spec.benchmarks) * len(spec.d_k) * len(spec.seeds)
    kernels = {(r.benchmark, r.attention, r.seed): r for r in plan.baselines if r.d_k is None}
    for br in plan.branches:
        if spec.base_of(br.attention) == "low-rank":
            base = linformer[(br.benchmark, br.d_k, br.seed)]
        else:   # the paper's Linformer-RNN: from its kernel constituent
            base = kernels[(br.benchmark, br.attention.removeprefix("flurka-"), br.seed)]
        assert br.base_key == base.key and br.start_step in base.fork_steps
    assert len(plan.branches) == sum(len(spec.alphas_of(v)) for v in spec.variants) * len(spec.d_k) * len(spec.seeds)
    assert any(PAPER_BEST_ALPHA[0] <= a <= PAPER_BEST_ALPHA[1] for a in spec.all_alphas) and len(spec.all_alphas) >= 3


def test_a_branch_forks_only_from_a_base_that_reached_its_fork_step():
    """``runner.unforkable``: a branch is skipped when its base failed, was stopped early, or
    diverged at or before the branch's fork step; a base that diverged after it still serves."""
    from flurka.sweeps.runner import unforkable

    plan = make_plan(validate(SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",),
                                        alphas=(0.25, 0.75), steps=40, full=False)))
    low, high = sorted(plan.branches, key=lambda r: r.start_step)
    base = low.base_key
    assert base == high.base_key and (low.start_step, high.start_step) == (10, 30)
    ok = {base: {"status": "ok", "steps": 40}}
    assert unforkable(plan, ok, [], []) == {}
    assert unforkable(plan, {}, [base], []) == {r.key: f"base {base} failed" for r in (low, high)}
    assert unforkable(plan, {}, [], [base]) == {r.key: f"base {base} stopped early"
                                               for r in (low, high)}
    diverged = {base: {"status": "diverged at step 20", "steps": 20}}
    assert unforkable(plan, diverged, [], []) == {high.key: f"base {base} diverged at step 20"}


def test_best_trials_picks_the_best_finished_run_per_benchmark():
    """The model a sweep logs: per benchmark the finished non-base trial with the best final
    task metric (higher accuracy, lower perplexity); bases, failed runs and missing values never."""
    from flurka.sweeps.runner import best_trials

    def result(metric, value, status="ok"):
        return {"config": {"metrics": [metric]}, "final_metrics": {metric: value}, "status": status}

    results = {"a": result("accuracy", 0.5), "b": result("accuracy", 0.7), "c": result("accuracy", 0.9),
               "d": result("accuracy", 0.95, "diverged"), "e": result("perplexity", 12.0),
               "f": result("perplexity", 9.0), "g": {"config": {"metrics": ["perplexity"]}, "final_metrics": {}}}
    runs = {"a": ("branch", "x"), "b": ("baseline", "x"), "c": ("base", "x"), "d": ("branch", "x"),
            "e": ("branch", "y"), "f": ("baseline", "y"), "g": ("branch", "y")}
    runs = {k: {"kind": kind, "benchmark": b} for k, (kind, b) in runs.items()}
    assert best_trials(results, runs) == {"x": "b", "y": "f"}


def test_phases_put_what_branches_fork_from_first():
    _, plan = _plan(variants=("flurka-performer",), alphas=(0.375, 0.75), d_k=(8, 16), seeds=(0, 1, 2), full=False,
                    control=False)
    first, second = plan.phases()
    assert first == plan.baselines + plan.bases and second == plan.branches
    first, second = plan.phases(baselines_beside_branches=True)
    # the first experiment trains only the Linformer bases (one per d_k and seed: an even count)
    assert sorted((r.attention, r.d_k, r.seed) for r in first) == sorted(
        ("linformer", dk, s) for dk in (8, 16) for s in (0, 1, 2))
    assert all(r.fork_steps == (300, 600) for r in first)
    # the second: the Performer baselines first (the longest), then the branches, longest first
    assert [r.attention for r in second[:3]] == ["performer"] * 3
    assert [r.executed_steps for r in second] == [800] * 3 + [500] * 6 + [200] * 6
    assert {r.key for r in first + second} == {r.key for r in plan.baselines + plan.bases + plan.branches}
    assert len(first + second) == len(plan.baselines + plan.bases + plan.branches)


def test_phases_keep_a_kernel_base_first():
    _, plan = _plan(variants=("flurka-rnn",), alphas=(0.5,), base="kernel", full=False, control=False)
    first, second = plan.phases(baselines_beside_branches=True)
    # the RNN baseline doubles as the base: it stays first; Linformer forks nothing: beside the branches
    assert [r.attention for r in first] == ["rnn"] and [r.attention for r in second] == ["linformer", "flurka-rnn"]


def test_phases_fill_the_first_experiments_idle_workers():
    """Three bases on two workers leave one idle for a run's length: a baseline nothing forks from
    (the control, here) moves into the first experiment when it makes it no longer; with three
    workers the bases fill it, and nothing moves."""
    _, plan = _plan(variants=("flurka-performer",), alphas=(0.375, 0.75), d_k=(16,), seeds=(0, 1, 2), full=False)
    first, second = plan.phases(baselines_beside_branches=True, workers=2)
    assert sorted((r.attention, r.d_k) for r in first) == [("linformer", 1)] + [("linformer", 16)] * 3
    assert [r.attention for r in second[:5]] == ["performer", "linformer", "performer", "linformer", "performer"]
    assert {r.key for r in first + second} == {r.key for r in plan.baselines + plan.branches}
    first, _ = plan.phases(baselines_beside_branches=True, workers=3)
    assert sorted((r.attention, r.d_k) for r in first) == [("linformer", 16)] * 3
    from flurka.cluster import concurrent_trials

    assert concurrent_trials({"CPU": 2.0}, 1, 0) == 2 and concurrent_trials({"CPU": 16.0, "GPU": 1.0}, 1, 0.5) == 2
    assert concurrent_trials({"CPU": 1.0}, 2, 0) == 1


def test_the_main_jobs_base_saves_at_its_forks_and_every_200th_step(tmp_path):
    """Not at their gcd: with 500 steps and forks at 62, 188 and 438, that was every 2nd step (250
    Orbax saves per base; the main job's checkpoints took longer than its training). Its sweep file
    sets the retry checkpoints' interval (200 of 400 steps: 8 saves a trial took 3 s of ~55)."""
    from flurka.sweeps.spec import from_args
    from flurka.sweeps.trainable import train_overrides

    spec = validate(from_args({"config": "uptrain-small"}))
    base = next(r for r in make_plan(spec).baselines if r.fork_steps)
    o = train_overrides(base, spec.overrides, run_dir=str(tmp_path), steps=spec.steps,
                        checkpoint_every=spec.checkpoint_every)
    assert base.fork_steps == tuple(switch_step(a, 400) for a in (0.125, 0.375, 0.875)) == (50, 150, 350)
    assert o["checkpoint_every"] == 200 and o["checkpoint_steps"] == (50, 150, 350)
    o = train_overrides(base, spec.overrides, run_dir=str(tmp_path), steps=spec.steps, checkpoint_every=None)
    assert o["checkpoint_every"] == 400 // 8     # the default where a sweep file names none
