"""Branching up-training: the plan of which runs a sweep executes.

The paper trains every α of Table 5 from scratch: 7 runs of T steps per variant. But the first
α·T steps of an up-training run are a plain run of the base model, identical for every α (same
seed, same batches, same schedule). So per (base model, d_k, benchmark, seed) the sweep trains
the base once, to max(α)·T, checkpointing at every α·T, and each α *branch* forks from the base
checkpoint at α·T and trains the FLuRKA variant for the remaining (1-α)·T steps.

For the paper's 7-point grid that is 0.875·T + Σ(1-α)·T = 4.375·T instead of 7·T: 0.625× the
steps. With ``--base low-rank`` the Linformer base is shared by all three variants, saving more.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from flurka.configs import switch_step
from flurka.configs.overrides import nested
from flurka.catalogue.mechanisms import CONTROL, KERNEL_OF, LOW_RANK, base_family, base_mechanism
from flurka.sweeps.spec import FULL, SweepSpec, benchmark_config, d_k_of, pretrain_spec, seq_len_of

KINDS = ("baseline", "base", "branch")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One Tune trial. ``steps`` is the run's T (its schedule length); it executes the steps
    ``[start_step, stop_step)``."""

    kind: str                          # "baseline" | "base" | "branch" (a baseline may also be a base)
    benchmark: str
    attention: str                     # mechanism trained (the variant, for a branch)
    seed: int
    steps: int
    d_k: int | None = None
    alpha: float | None = None         # branch: fraction of steps on the base model
    base: str | None = None            # branch: the base mechanism
    fork_steps: tuple[int, ...] = ()   # steps where branches fork from this run (kept checkpoints)
    base_key: str | None = None        # branch: the base run it forks from
    start_step: int = 0
    stop_step: int | None = None       # base: max(fork_steps); else steps
    init_from: str | None = None       # fine-tuning: the key of the pre-training run it starts from
    max_len: int | None = None         # fine-tuning at the pre-training's length (pretrain full_length)

    @property
    def key(self) -> str:
        parts = [self.kind, self.benchmark, self.attention, f"s{self.seed}", f"T{self.steps}"]
        if self.d_k is not None:
            parts.append(f"dk{self.d_k}")
        if self.alpha is not None:
            parts.append(f"a{self.alpha:g}-{self.base}")
        return "/".join(parts)

    @property
    def executed_steps(self) -> int:
        return (self.stop_step if self.stop_step is not None else self.steps) - self.start_step

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["key"] = self.key
        return d

    def overrides(self, sweep_overrides: dict[str, Any], steps: int | None) -> dict[str, Any]:
        """The ``get_config`` overrides that make this run of its benchmark what it trains: the
        sweep's (its phase's, ``steps`` where given), then the run's mechanism, seed, d_k, α and
        base, and its length; not where it writes or starts from (:mod:`flurka.sweeps.trainable`)."""
        o = dict(sweep_overrides)
        if steps is not None:
            o["steps"] = steps
        o.update({"model.attention": self.attention, "seed": self.seed})
        if self.d_k is not None:
            o["model.attention_options.d_k"] = self.d_k
        if self.kind == "branch" and self.init_from is None:   # fine-tuning trains its mechanism throughout
            o.update(alpha=self.alpha, base=base_family(self.base))
        if self.max_len is not None:
            o.update({"max_len": self.max_len, "dataset_options.max_len": self.max_len})
        return nested(o)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PlannedRun":
        fields = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in fields}
        d["fork_steps"] = tuple(d.get("fork_steps") or ())
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Plan:
    baselines: tuple[PlannedRun, ...]
    bases: tuple[PlannedRun, ...]
    branches: tuple[PlannedRun, ...]
    pretrain: "Plan | None" = None     # a chained sweep's pre-training plan, run before this one

    @property
    def runs(self) -> tuple[PlannedRun, ...]:
        """Every planned run, the pre-training plan's first."""
        pre = self.pretrain.runs if self.pretrain is not None else ()
        return pre + self.baselines + self.bases + self.branches

    def stages(self, baselines_beside_branches: bool = False,
               workers: int | None = None) -> tuple[tuple[str, tuple[PlannedRun, ...]], ...]:
        """The sweep's Tune experiments in order, named: :meth:`phases` ("first", "branches"),
        after the pre-training plan's ("pretrain", "pretrain-branches") in a chained sweep."""
        first, second = self.phases(baselines_beside_branches, workers)
        stages = (("first", first), ("branches", second))
        if self.pretrain is None:
            return stages
        pre_first, pre_second = self.pretrain.phases(baselines_beside_branches, workers)
        return (("pretrain", pre_first), ("pretrain-branches", pre_second)) + stages

    def phases(self, baselines_beside_branches: bool = False,
               workers: int | None = None) -> tuple[tuple[PlannedRun, ...], tuple[PlannedRun, ...]]:
        """The sweep's two Tune experiments: first the runs branches fork from, then the branches.

        A baseline nothing forks from (the kernel constituent, with a low-rank base; the
        no-attention control) depends on nothing and is needed by nothing, so with
        ``baselines_beside_branches`` it runs in the second experiment, longest runs first, beside
        the short branches. Given the cluster's ``workers`` (trials at a time), those baselines
        that fit the first experiment's idle workers move there instead: each, longest first,
        while it leaves the first experiment's length unchanged (three bases on two workers
        leave one idle for a whole run). A search over the branches (Optuna) or an early-stopping
        scheduler (ASHA) sees only branches there, so they keep every baseline first."""
        if not baselines_beside_branches:
            return self.baselines + self.bases, self.branches
        forked = {r.key for r in self.forked_from}
        beside = sorted((r for r in self.baselines if r.key not in forked), key=lambda r: -r.executed_steps)
        first = [r for r in self.baselines if r.key in forked] + list(self.bases)
        if workers:
            for run in list(beside):
                if _makespan([*first, run], workers) <= _makespan(first, workers):
                    first.append(run)
                    beside.remove(run)
        return tuple(first), tuple(sorted(beside + list(self.branches), key=lambda r: -r.executed_steps))

    @property
    def forked_from(self) -> tuple[PlannedRun, ...]:
        """The runs branches fork from (separate base runs, or baselines doubling as bases)."""
        return tuple(r for r in self.baselines + self.bases if r.fork_steps)

    def compute(self) -> dict[str, float]:
        """Train steps of up-training (the base up to its last fork + every branch after its fork)
        vs the same branches each trained from scratch, as in the paper."""
        executed = sum(max(r.fork_steps) for r in self.forked_from) + sum(r.executed_steps for r in self.branches)
        independent = sum(r.steps for r in self.branches)
        out = {"uptrain_steps_executed": executed, "uptrain_steps_independent": independent,
               "baseline_steps": sum(r.executed_steps for r in self.baselines),
               "total_steps": sum(r.executed_steps for r in self.baselines + self.bases + self.branches)}
        if self.pretrain is not None:   # both plans' steps; the pre-training's alone beside them
            pre = self.pretrain.compute()
            out = {k: v + pre[k] for k, v in out.items()}
            out["pretrain_steps"] = pre["total_steps"]
        out["uptrain_compute_ratio"] = (out["uptrain_steps_executed"] / out["uptrain_steps_independent"]
                                        if out["uptrain_steps_independent"] else 1.0)
        return out


def _makespan(runs, workers: int) -> int:
    """The steps the longest of ``workers`` queues holds when ``runs`` are dealt longest first to
    the least loaded one (how Tune's queue fills free workers): an experiment's length, in steps."""
    queues = [0] * max(1, int(workers))
    for run in sorted(runs, key=lambda r: -r.executed_steps):
        queues[queues.index(min(queues))] += run.executed_steps
    return max(queues)


def _steps_of(spec: SweepSpec, benchmark: str) -> int:
    return int(benchmark_config(benchmark, spec).steps)


def _d_ks(spec: SweepSpec, benchmark: str) -> tuple[int, ...]:
    return tuple(spec.d_k) or (d_k_of(benchmark_config(benchmark, spec)),)


def make_plan(spec: SweepSpec, *, steps: dict[str, int] | None = None,
              d_ks: dict[str, tuple[int, ...]] | None = None) -> Plan:
    """The runs of a validated spec. ``steps``/``d_ks`` per benchmark default to the configs'.

    With baselines on, they are the constituents (and full attention, and the no-attention control
    where the spec asks), and the base of the up-training *is* the base mechanism's baseline run (a
    plain run of the same seed and schedule), checkpointed at the fork steps: it costs nothing
    extra. Without them a separate base run stops after the last fork step. α with no step
    strictly inside the run (α·T rounds to 0 or T) has nothing to fork and trains independently.
    """
    if spec.pretrain:
        return _chained_plan(spec, steps=steps, d_ks=d_ks)
    return _plan(spec, steps=steps, d_ks=d_ks)


def _identity(run: PlannedRun) -> tuple:
    """What a fine-tuning run shares with the pre-training run it starts from."""
    return (run.kind == "branch", run.attention, run.d_k, run.alpha, run.base, run.seed)


def _chained_plan(spec: SweepSpec, *, steps=None, d_ks=None) -> Plan:
    """The pre-training plan, and the fine-tuning runs (no forks) each starting from its match;
    those of a mechanism in ``full_length`` at the pre-training's sequence length."""
    pre_spec = pretrain_spec(spec)
    pre = _plan(pre_spec)
    started = {_identity(r): r.key for r in pre.baselines + pre.branches}
    fine = _plan(spec, steps=steps, d_ks=d_ks, forking=False)
    long = seq_len_of(benchmark_config(pre_spec.benchmarks[0], pre_spec))
    full_length = set(spec.pretrain.get("full_length") or ())

    def chained(run: PlannedRun) -> PlannedRun:
        n = seq_len_of(benchmark_config(run.benchmark, spec))
        return dataclasses.replace(run, init_from=started[_identity(run)],
                                   max_len=long if run.attention in full_length and n < long else None)

    return Plan(tuple(map(chained, fine.baselines)), (), tuple(map(chained, fine.branches)), pretrain=pre)


def _plan(spec: SweepSpec, *, steps: dict[str, int] | None = None,
          d_ks: dict[str, tuple[int, ...]] | None = None, forking: bool = True) -> Plan:
    """:func:`make_plan` of one benchmark list (``forking=False``: every branch from step 0)."""
    steps = steps or {b: _steps_of(spec, b) for b in spec.benchmarks}
    d_ks = d_ks or {b: _d_ks(spec, b) for b in spec.benchmarks}
    baselines: dict[str, PlannedRun] = {}
    bases: dict[str, PlannedRun] = {}
    branches: list[PlannedRun] = []

    def add_forks(table: dict[str, PlannedRun], run: PlannedRun, forks: list[int], stop: bool) -> str:
        prior = table.get(run.key, run)
        merged = tuple(sorted(set(prior.fork_steps) | set(forks)))
        table[run.key] = dataclasses.replace(prior, fork_steps=merged, stop_step=max(merged) if stop else None)
        return run.key

    for bench, seed in itertools.product(spec.benchmarks, spec.seeds):
        T = steps[bench]
        if spec.baselines and spec.control:
            mech, dk = CONTROL
            run = PlannedRun("baseline", bench, mech, seed, T, d_k=dk)
            baselines.setdefault(run.key, run)
        for d_k in d_ks[bench]:
            if spec.baselines:
                reference = [(FULL, None)] if spec.full else []
                for mech, dk in [*reference, (LOW_RANK, d_k), *[(KERNEL_OF[v], None) for v in spec.variants]]:
                    run = PlannedRun("baseline", bench, mech, seed, T, d_k=dk)
                    baselines.setdefault(run.key, run)
            for variant in spec.variants:
                base = base_mechanism(variant, spec.base_of(variant))
                base_dk = d_k if base == LOW_RANK else None
                alphas = spec.alphas_of(variant)
                forks = sorted(s for s in {switch_step(a, T) for a in alphas} if 0 < s < T)   # inside the run: no range(T)
                base_key = None
                if spec.branching and forks and forking:
                    if spec.baselines:
                        base_key = add_forks(baselines, PlannedRun("baseline", bench, base, seed, T, d_k=base_dk),
                                             forks, stop=False)
                    else:
                        base_key = add_forks(bases, PlannedRun("base", bench, base, seed, T, d_k=base_dk),
                                             forks, stop=True)
                for alpha in alphas:
                    start = switch_step(alpha, T)
                    forked = base_key is not None and 0 < start < T
                    branches.append(PlannedRun("branch", bench, variant, seed, T, d_k=d_k, alpha=alpha, base=base,
                                               base_key=base_key if forked else None,
                                               start_step=start if forked else 0))
    return Plan(tuple(baselines.values()), tuple(bases.values()), tuple(branches))


def independent_equivalent(run: PlannedRun) -> PlannedRun:
    """The same branch trained the paper's way (from step 0, no fork) — what a fork must equal."""
    return dataclasses.replace(run, base_key=None, start_step=0)


def describe(plan: Plan) -> str:
    """The plan in one line: what is trained from scratch, what forks, and what forking saves; a
    chained sweep's in two parts, pre-training then fine-tuning."""
    if plan.pretrain is not None:
        fine = dataclasses.replace(plan, pretrain=None)
        pre_bench = plan.pretrain.runs[0].benchmark if plan.pretrain.runs else "?"
        return (f"plan: phase 1, pre-training on {pre_bench}: {describe(plan.pretrain).removeprefix('plan: ')}; "
                f"phase 2, fine-tuning, {len(fine.runs)} runs each from the phase-1 run of its mechanism, α, d_k "
                f"and seed: {describe(fine).removeprefix('plan: ')}")
    c = plan.compute()
    forked = sum(r.base_key is not None for r in plan.branches)

    def n(count: int, noun: str, plural: str = "s") -> str:
        return f"{count} {noun}{'' if count == 1 else plural}"

    return (f"plan: {n(len(plan.baselines), 'baseline')} and {n(len(plan.bases), 'separate base run')} from "
            f"scratch, {n(len(plan.branches), 'α branch', 'es')} ({forked} forked from their base's checkpoint "
            f"at step α·T); up-training trains {c['uptrain_steps_executed']} steps, "
            f"{c['uptrain_compute_ratio']:.0%} of the {c['uptrain_steps_independent']} of every α from scratch")


__all__ = ["PlannedRun", "Plan", "make_plan", "describe", "independent_equivalent", "KINDS"]
