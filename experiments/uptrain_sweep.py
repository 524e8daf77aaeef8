"""The main job: Ray Tune sweep of FLuRKA up-training α and d_k, tracked in MLflow.

    python experiments/uptrain_sweep.py --config uptrain-small    # = flurka sweep --config uptrain-small
    ray job submit --working-dir . -- python experiments/uptrain_sweep.py --config uptrain-small

Without ``--address`` / ``RAY_ADDRESS`` it starts its own local Ray; MLflow and the results DB
default to SQLite files in ``--run-dir``. Bad specs (malformed YAML, wrong types, unwritable
directories), an unreachable database or cluster, a file that is no database, and GPU requests
on a GPU-less cluster fail before any trial, with one line and exit status 2; all but the
cluster's checks also before Ray starts and before anything is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The flurka of the tree this script is in (a Ray job's unpacked --working-dir) before an installed
# one, ahead of any flurka import: a job runs the code submitted. Its Ray workers get the same
# through the sweep's runtime_env (flurka.source.worker_pythonpath).
TREE, PARTS = Path(__file__).resolve().parents[1], ("workers", "platform", "dashboards")
if all((TREE / part / "flurka").is_dir() for part in PARTS):
    sys.path[1:1] = [str(TREE / part) for part in PARTS]   # after this script's own folder

from flurka.sweeps import cli, spec  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """``flurka sweep``'s parser and run (:mod:`flurka.sweeps.cli`) under this script's name."""
    parser = spec.ArgumentParser(prog="uptrain_sweep", description=__doc__.splitlines()[0])
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv), prog="uptrain_sweep")


if __name__ == "__main__":
    sys.exit(main())
