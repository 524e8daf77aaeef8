"""``flurka sweep`` (and ``python experiments/uptrain_sweep.py``, the same parser): a Ray Tune
sweep of FLuRKA up-training α and d_k from a YAML spec and flags, its tables printed at the end.

    flurka sweep --config uptrain-small          # what make sweep runs (an installed sweep file)
    flurka sweep --config uptrain-small --resume
    flurka sweep --config my_sweep.yaml          # a file of your own, same keys

From Python the same is ``flurka.sweeps.run_sweep(spec)`` with a
:class:`~flurka.sweeps.SweepSpec`. A bad spec, an unreachable store or cluster, or a GPU request
on a GPU-less cluster is one line and exit 2 before any trial (before Ray starts, but for the
checks a connected cluster answers: its size, whether its nodes share the run dir); a sweep with
failed or skipped trials exits 1.
"""

from __future__ import annotations

import argparse
import sys

from flurka.sweeps import spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    spec.add_arguments(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (trials, steps per benchmark and in all), each trial's training "
                             "FLOPs and its predicted time on the cards with step times on record, and start "
                             "nothing: no Ray, no store, no file")
    parser.add_argument("--step-times", default=None, metavar="FILE|DIR",
                        help="--dry-run: the speed harness's JSON documents the predicted time reads (default: "
                             "benchmarks/results/ of this checkout)")
    parser.add_argument("--gpus", type=int, default=None, metavar="N",
                        help="--dry-run: the cards the predicted wall time assumes (default 8)")


def dry_run(sweep: spec.SweepSpec, *, step_times: str | None = None, gpus: int | None = None) -> str:
    """The validated spec's plan, in a few lines: what ``run_sweep`` would train, each trial's
    training FLOPs and its predicted time (:mod:`flurka.sweeps.forecast`), nothing started."""
    from flurka.sweeps.branching import describe, make_plan   # the configs (no Ray)
    from flurka.sweeps.forecast import forecast_lines         # the FLOP model (JAX, not Ray)

    sweep = spec.validate(sweep)
    plan = make_plan(sweep)
    runs = plan.runs
    lines = [f"{sweep.name}: dry run, nothing started", describe(plan)]
    pre = {r.key for r in plan.pretrain.runs} if plan.pretrain is not None else set()
    for benchmark in spec.benchmarks_of(sweep):
        mine = [r for r in runs if r.benchmark == benchmark]
        config = spec.benchmark_config(benchmark, sweep)
        phase = ("phase 1, pre-training" if mine and mine[0].key in pre else
                 "phase 2, fine-tuning from phase 1" if pre else "")
        longer = {r.attention: r.max_len for r in mine if r.max_len is not None}   # pretrain full_length
        at = "".join(f" ({', '.join(sorted(longer))}: N = {n}, the pre-training's)" for n in set(longer.values()))
        lines.append(f"  {benchmark}: {f'{phase}; ' if phase else ''}{len(mine)} trials, T = {config.steps} steps at "
                     f"batch {config.batch_size}, d_model {config.model.d_model}, {config.model.num_layers} layers, "
                     f"N = {config.max_len}{at}; {sum(r.executed_steps for r in mine)} steps to train")
    compute = plan.compute()
    lines.append(f"in all: {len(runs)} trials, {compute['total_steps']} training steps over {len(sweep.seeds)} seed(s)"
                 + (f" ({compute['pretrain_steps']} of them pre-training)" if pre else ""))
    lines += forecast_lines(sweep, plan, step_times=step_times, gpus=gpus)
    return "\n".join(lines)


def run(args: argparse.Namespace, prog: str = "flurka sweep") -> int:
    args = argparse.Namespace(**vars(args))
    plan_only = getattr(args, "dry_run", False)
    step_times, gpus = vars(args).pop("step_times", None), vars(args).pop("gpus", None)
    vars(args).pop("dry_run", None)
    try:
        sweep = spec.validate(spec.from_args(args))   # before the driver's stack: a bad spec answers at once
        if gpus is not None and gpus < 1:
            raise spec.SpecError(f"--gpus must be a positive integer, got {gpus}")
        if plan_only:
            print(dry_run(sweep, step_times=step_times, gpus=gpus))
            return 0
    except (spec.SpecError, FileNotFoundError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    # The driver's stack (Ray Tune, MLflow, SQLAlchemy, JAX: seconds to import): --help and a
    # spec that does not parse answer without it.
    from flurka.cluster import ClusterError
    from flurka.results import DatabaseUnreachable
    from flurka.sweeps import runner

    try:
        outcome = runner.run_sweep(sweep)
    except (spec.SpecError, ClusterError, DatabaseUnreachable, FileNotFoundError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except runner.SweepInterrupted as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    print(runner.summary(outcome, verbose=sweep.verbose), flush=True)
    return 1 if outcome.failed or outcome.skipped else 0
