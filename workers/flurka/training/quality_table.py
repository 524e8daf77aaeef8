"""Quality table on the small benchmarks: every mechanism × {lra-listops-small, lra-image-small,
mlm-small}; one JSON line per run (final metric, seed, steps, wall time) to stdout.

    python -m flurka.training.quality_table [--benchmarks ...] [--mechanisms ...] [--steps N] > table.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys

from flurka.attention.flops import MECHANISMS
from flurka.configs import get_config
from flurka.training import run

BENCHMARKS = ("lra-listops-small", "lra-image-small", "mlm-small")


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS))
    p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    p.add_argument("--steps", type=int)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for bench in args.benchmarks:
        for mech in args.mechanisms:
            over = {"attention": mech, "seed": args.seed}
            if args.steps:
                over["steps"] = args.steps
            config = get_config(bench, **over)
            try:
                r = run(config, progress=False)
            except Exception as exc:  # one broken mechanism must not lose the rest of the table
                print(json.dumps({"benchmark": bench, "attention": mech, "status": f"error: {exc}"[:300]}), flush=True)
                continue
            row = {"benchmark": bench, "attention": mech, "status": r["status"],
                   "metric": config.metrics[0], "value": r["final_metrics"].get(config.metrics[0]),
                   "seed": r["seed"], "steps": r["steps"], "wall_time_s": round(r["wall_time_s"], 1),
                   "train_flops": r["train_flops"]}
            print(json.dumps(row), flush=True)
            print(row, file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
