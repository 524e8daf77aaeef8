"""``flurka train``: one training run from a named benchmark config, printing final metrics.

    flurka train --benchmark lra-listops-small --attention flurka-rnn --steps 200 --json

Any config field can be overridden with ``--set name=value`` (a Python literal, e.g.
``--set learning_rate=1e6`` or ``--set attention_options="{'d_k': 16}"``), read by
:mod:`flurka.configs.overrides`, the parser the sweep's ``--set`` uses too.
A progress bar shows on a terminal.

A benchmark whose data must first be generated (``lra-listops`` without the LRA release files
under the data dir: 100k trees, minutes, ~630 MB) is refused in one line (exit 2) unless
``--generate-data`` is given or ``--data-dir`` holds the files; its ``-small`` version needs
neither.
"""

from __future__ import annotations

import argparse
import json
import sys

from flurka.configs import get_config
from flurka.configs.overrides import parse_assignments
from flurka.data import generation_plan
from flurka.training import compilation
from flurka.training import run as train_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--benchmark", required=True, help="a name from flurka.configs.BENCHMARKS")
    parser.add_argument("--attention", help="attention mechanism (default: the benchmark's)")
    parser.add_argument("--steps", type=int, help="training steps (default: the benchmark's)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--alpha", type=float, help="up-training fraction on the base model, in [0, 1]")
    parser.add_argument("--base", choices=("low-rank", "kernel"), help="up-training base model")
    parser.add_argument("--base-checkpoint", help="fork the FLuRKA phase from a base run's checkpoint dir")
    parser.add_argument("--d-k", type=int, dest="d_k",
                        help="d_k: the length E1, E2 compress the sequence to (Linformer, FLuRKA)")
    parser.add_argument("--e-init", choices=("pool", "gaussian"), dest="e_init",
                        help="E1/E2's initialisation: pooled block means (default) or the "
                             "paper's N(0, 1/d_k)")
    parser.add_argument("--workdir", help="checkpoints go to WORKDIR/checkpoints (resumes if present)")
    parser.add_argument("--checkpoint-every", type=int)
    parser.add_argument("--data-dir", help="data root (default $FLURKA_DATA_DIR, else ~/flurka_data)")
    parser.add_argument("--generate-data", action="store_true",
                        help="generate data the benchmark lacks into the data dir first (lra-listops: "
                             "100k trees, minutes, once, ~630 MB)")
    parser.add_argument("--compilation-cache", metavar="DIR|off",
                        help="JAX's persistent compilation cache: a rerun or resumed run loads "
                             "the programs an earlier one compiled (the JSON result's "
                             "'compilation' says how many); default $JAX_COMPILATION_CACHE_DIR, "
                             "else ~/.cache/flurka/jax; off: none")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any config field (Python literal); repeatable")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument("--no-progress", action="store_true")


def overrides(args: argparse.Namespace) -> dict:
    out = parse_assignments(args.set)
    for name in ("attention", "steps", "seed", "alpha", "base", "base_checkpoint", "workdir",
                 "checkpoint_every", "data_dir"):
        value = getattr(args, name)
        if value is not None:
            out[name] = value
    for name in ("d_k", "e_init"):
        if getattr(args, name) is not None:
            out["attention_options"] = {**out.get("attention_options", {}),
                                        name: getattr(args, name)}
    return out


def run(args: argparse.Namespace) -> int:
    try:
        config = get_config(args.benchmark, **overrides(args))
    except ValueError as exc:
        print(f"flurka train: error: {exc}", file=sys.stderr)
        return 2
    plan = generation_plan(config.dataset, config.data_dir)
    if plan is not None and not args.generate_data:
        print(f"flurka train: error: {args.benchmark} has no prepared data: training would first {plan}; pass "
              "--generate-data to do that, or --data-dir DIR holding lra_release/listops-1000/"
              f"basic_{{train,val,test}}.tsv (the CPU-size {args.benchmark}-small needs neither)", file=sys.stderr)
        return 2
    with compilation.accounting(compilation.cache_dir(args.compilation_cache)) as compiled:
        result = train_run(config, progress=False if args.no_progress else None)
    result["compilation"] = compiled
    if args.json:
        print(json.dumps(result))
    else:
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in result["final_metrics"].items())
        print(f"{result['benchmark']} {result['attention']}: {result['status']} after "
              f"{result['steps']} steps, {result['train_flops']:.3e} FLOPs, "
              f"{result['wall_time_s']:.1f}s; {metrics}")
    return 0 if result["status"] == "ok" else 1
