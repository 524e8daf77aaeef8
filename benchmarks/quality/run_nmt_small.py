"""The seed-CI quality measurement behind the README's nmt-small table and E's default init.

    .venv/bin/python benchmarks/quality/run_nmt_small.py OUT.jsonl [--jobs 2]

Each run is ``flurka train --benchmark nmt-small`` (600 steps, batch 64, d_k 16, one final
evaluation over the whole eval split) as its own process, two at a time on a 2-core machine
(about 100 s a run on one core); one JSON line a run: mechanism, seed, e_init, flurka-eva's
window and chunk, final eval BLEU / loss / accuracy, wall time. Runs already in OUT are skipped,
so an interrupted measurement continues. Summarise with
``python -m flurka.training.quality_table --summarize OUT.jsonl``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import subprocess
import sys
import threading
from pathlib import Path

from flurka.catalogue.mechanisms import COMPRESSED

SEEDS = (0, 1, 2)
CONSTITUENTS = ("performer", "rnn", "eva", "full")


def jobs():
    """(mechanism, seed, options) in the order that gives a whole table soonest: the pooled
    low-rank layers and the kernels, the paper's Gaussian E, flurka-eva's wider window, full."""
    for seed in SEEDS:
        for mech in COMPRESSED:
            yield mech, seed, {"e_init": "pool"}
        for mech in CONSTITUENTS[:-1]:
            yield mech, seed, {}
    for seed in SEEDS:
        for mech in COMPRESSED:
            yield mech, seed, {"e_init": "gaussian"}
    for seed in SEEDS:
        yield "flurka-eva", seed, {"e_init": "pool", "window_size": 12, "chunk_size": 4}
    for seed in SEEDS:
        yield CONSTITUENTS[-1], seed, {}


def key(mech, seed, opts):
    return json.dumps([mech, seed, sorted(opts.items())])


def run_one(mech, seed, opts, cache):
    cmd = [sys.executable, "-m", "flurka.cli", "train", "--benchmark", "nmt-small",
           "--attention", mech, "--seed", str(seed), "--json", "--no-progress",
           "--compilation-cache", cache]
    if opts:
        cmd += ["--set", f"model.attention_options={dict(opts)!r}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        return {"attention": mech, "seed": seed, **opts, "status": f"error: {out.stderr[-300:]}"}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"benchmark": "nmt-small", "attention": mech, "seed": seed, **opts,
            "status": r["status"], "metric": "bleu", "value": r["final_metrics"].get("bleu"),
            "loss": r["final_metrics"].get("loss"), "accuracy": r["final_metrics"].get("accuracy"),
            "steps": r["steps"], "wall_time_s": round(r["wall_time_s"], 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--cache", default="/tmp/flurka-quality-cache")
    args = p.parse_args(argv)
    out = Path(args.out)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            opts = {k: r[k] for k in ("e_init", "window_size", "chunk_size") if k in r}
            done.add(key(r["attention"], r["seed"], opts))
    lock = threading.Lock()
    todo = [j for j in jobs() if key(*j) not in done]
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        for fut in cf.as_completed([pool.submit(run_one, *j, args.cache) for j in todo]):
            row = fut.result()
            with lock, out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
