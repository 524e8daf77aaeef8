"""The main job: Ray Tune sweep of FLuRKA up-training α and d_k, tracked in MLflow.

    python experiments/uptrain_sweep.py --config experiments/uptrain_small.yaml
    ray job submit --working-dir . -- python experiments/uptrain_sweep.py --config experiments/uptrain_small.yaml

Without ``--address`` / ``RAY_ADDRESS`` it starts its own local Ray; MLflow and the results DB
default to SQLite files in ``--run-dir``. Bad specs (malformed YAML, wrong types, unwritable
directories), an unreachable database or cluster, a file that is no database, and GPU requests
on a GPU-less cluster fail before any trial, with one line and exit status 2; all but the
cluster's checks also before Ray starts and before anything is written.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from flurka.sweeps import spec as S

    parser = S.ArgumentParser(prog="uptrain_sweep", description=__doc__.splitlines()[0])
    S.add_arguments(parser)
    args = parser.parse_args(argv)
    from flurka.cluster import ClusterError
    from flurka.results import DatabaseUnreachable
    from flurka.sweeps.runner import run_sweep, summary

    try:
        outcome = run_sweep(S.from_args(args))
    except (S.SpecError, ClusterError, DatabaseUnreachable, FileNotFoundError) as exc:
        print(f"uptrain_sweep: error: {exc}", file=sys.stderr)
        return 2
    print(summary(outcome), flush=True)
    return 1 if outcome.failed or outcome.skipped else 0


if __name__ == "__main__":
    sys.exit(main())
