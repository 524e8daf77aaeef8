"""The speed sweeps as Ray tasks: one task per point (``--interleave``: per configuration, its
mechanisms timed side by side on one GPU), one GPU each, gathered into ONE JSON file.

    python experiments/speed_sweep.py --sweep n-sweep --out benchmarks/nsweep_ray.json
    python experiments/speed_sweep.py --sweep tiny --cpu --num-cpus 2 --out /tmp/tiny.json
    ray job submit --working-dir . -- python experiments/speed_sweep.py --sweep dk-sweep \
        --address auto --out /abs/path/dk.json

Each task calls the same worker code as ``python -m flurka.speed`` (``flurka.speed.runner``), so
the JSON schema is identical (``settings.runner`` = "ray"); every row carries the device it ran
on, and ``ceilings`` holds each device's probes (measured inside the tasks, on their own GPU).
Without ``--interleave`` two mechanisms of one configuration may run on different GPUs (or
nodes); with it each configuration is one task, so its speedups are ratios measured on one card.
Every row names its ``task``, which the results database takes as its run: ratios are paired
within a task, and a per-point sweep's are marked as pairing times from different runs.
Ray is imported here only; the workers never import it. Without ``--address`` a private local
Ray starts (``address="local"``, its own temp dir) and is shut down at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import ray

from flurka.speed import __main__ as speed_cli
from flurka.speed import runner
from flurka.speed.bench import check_compile_options, freeze_survivors
from flurka.speed.runner import document, write_json


# max_calls=1: a fresh worker process per task, so an OOM'd or wedged GPU context never leaks
# into the next one (costs one JAX start-up per task).
@ray.remote(num_gpus=1, max_calls=1)
def _measure(group, sweep: str, interleave: bool, warmup: int, repeats: int,
             per_sample: int | None, memory_budget_bytes: int | None, with_ceilings: bool,
             profile_steps: int = 0) -> dict:
    """One point, or with ``interleave`` one configuration's points side by side, on the task's
    device: the rows, this device's ceilings, device and versions."""
    freeze_survivors()

    ceilings = runner.measured_ceilings(group[0][1].dtype) if with_ceilings else None
    rows = runner.measure(group, sweep=sweep, ceilings=ceilings, interleave=interleave,
                          warmup=warmup, repeats=repeats, per_sample=per_sample,
                          memory_budget_bytes=memory_budget_bytes,
                          profile_steps=profile_steps)
    return {"rows": rows, "ceilings": ceilings, "device": runner.device_info(),
            "versions": runner.versions()}


def run(args: argparse.Namespace, indices: list[int], points: list) -> dict:
    budget = None if args.memory_budget_gb is None else int(args.memory_budget_gb * 2**30)
    started = False
    if not ray.is_initialized():
        if args.address:
            ray.init(address=args.address)
        else:
            ray.init(address="local", num_cpus=args.num_cpus,
                     num_gpus=0 if args.cpu else args.num_gpus,
                     _temp_dir=tempfile.mkdtemp(prefix="ray_speed_"), include_dashboard=False,
                     runtime_env={"env_vars": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}})
        started = True
    try:
        task = _measure.options(num_gpus=0 if args.cpu else 1, num_cpus=1)
        groups = (runner.side_by_side(points, indices) if args.interleave
                  else [[ip] for ip in zip(indices, points)])
        refs = [task.remote(g, args.sweep, args.interleave, args.warmup, args.repeats,
                            args.calls_per_sample, budget, not args.no_ceilings,
                            args.profile_steps) for g in groups]
        outs = ray.get(refs)
    finally:
        if started:
            ray.shutdown()
    # Each row names its task: the run whose machine state its mechanisms shared (one card, one
    # time), so the results database pairs ratios within a task, not across the sweep's cards.
    rows = sorted(({**r, "task": i} for i, o in enumerate(outs) for r in o["rows"]), key=lambda r: r["index"])
    ceilings: dict = {}
    for o in outs:
        if o["ceilings"] is not None:
            ceilings.setdefault(o["device"]["name"], {})[o["rows"][0]["dtype"]] = o["ceilings"]
    devices = {o["device"]["name"] for o in outs}
    device = dict(outs[0]["device"]) if outs else {}
    device["names"] = sorted(devices)
    doc = document(sweep=args.sweep, results=rows, ceilings=ceilings or None,
                   settings={"warmup": args.warmup, "repeats": args.repeats,
                             "calls_per_sample": args.calls_per_sample,
                             "memory_budget_bytes": budget, "runner": "ray",
                             **({"interleaved": True} if args.interleave else {})},
                   device=device, versions_=outs[0]["versions"] if outs else None)
    if args.out:
        write_json(doc, args.out)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speed_sweep.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    speed_cli.add_arguments(parser)
    parser.add_argument("--address", default=None,
                        help="Ray cluster address (default: a private local Ray)")
    parser.add_argument("--cpu", action="store_true", help="tasks take no GPU (CI, laptops)")
    parser.add_argument("--num-cpus", type=int, default=None)
    parser.add_argument("--num-gpus", type=int, default=None)
    parser.add_argument("--mlflow-uri", default=None, metavar="URI",
                        help="also log the document as a run of the experiment flurka-speed "
                             "(flurka.tracking.documents; flurka ingest does the same)")
    args = parser.parse_args(argv)
    if args.list:
        return speed_cli.run(args)
    try:
        indices, points = speed_cli.selected(args)  # bad input fails here, before Ray starts
        check_compile_options(dict(args.xla))
        if args.mlflow_uri:
            if not args.out:
                raise ValueError("--mlflow-uri logs the --out file: give --out")
            from flurka.tracking.store import probe_tracking   # MLflow: 1.4 s, only with --mlflow-uri

            probe_tracking(args.mlflow_uri)
    except (ValueError, RuntimeError) as exc:   # RuntimeError: flurka.results.db.DatabaseUnreachable
        parser.error(str(exc))
    doc = run(args, indices, points)
    statuses = [r["status"] for r in doc["results"]]
    print(f"wrote {args.out}: {len(statuses)} points, "
          + ", ".join(f"{s} {statuses.count(s)}" for s in ("ok", "oom", "error")))
    if args.mlflow_uri:
        from flurka.tracking.documents import log_document   # MLflow, as above

        run_id, _ = log_document(args.mlflow_uri, args.out, Path(args.out).read_text())
        print(f"MLflow run {run_id} (experiment flurka-speed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
