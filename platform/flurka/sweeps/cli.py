"""``flurka sweep`` (and ``python experiments/uptrain_sweep.py``, the same parser): a Ray Tune
sweep of FLuRKA up-training α and d_k from a YAML spec and flags, its tables printed at the end.

    flurka sweep --config uptrain-small          # what make sweep runs (an installed sweep file)
    flurka sweep --config uptrain-small --resume
    flurka sweep --config my_sweep.yaml          # a file of your own, same keys

From Python the same is ``flurka.sweeps.run_sweep(spec)`` with a
:class:`~flurka.sweeps.SweepSpec`. A bad spec, an unreachable store or cluster, or a GPU request
on a GPU-less cluster is one line and exit 2 before any trial (all but the cluster's checks
before Ray starts); a sweep with failed or skipped trials exits 1.
"""

from __future__ import annotations

import argparse
import sys

from flurka.sweeps import spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    spec.add_arguments(parser)


def run(args: argparse.Namespace, prog: str = "flurka sweep") -> int:
    try:
        sweep = spec.from_args(args)
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
