"""``flurka train``: one training run from a named benchmark config, printing final metrics.

    flurka train --benchmark lra-listops-small --attention flurka-rnn --steps 200 --json

Any config field can be overridden with ``--set name=value`` (a Python literal, e.g.
``--set learning_rate=1e6`` or ``--set model.attention_options="{'d_k': 16}"``), read by
:mod:`flurka.configs.overrides`, the parser the sweep's ``--set`` uses too.
A progress bar shows on a terminal.

A benchmark whose data must first be generated (``lra-listops`` without the LRA release files
under the data dir: 100k trees, minutes, ~630 MB) is refused in one line (exit 2) unless
``--generate-data`` is given or ``--data-dir`` holds the files; its ``-small`` version needs
neither.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading

from flurka.cli import writable_dir
from flurka.configs import get_config
from flurka.configs.overrides import nested, parse_assignments
from flurka.data import generation_plan
from flurka.training import compilation
from flurka.training import run as train_run
from flurka.training.loop import Stopped
from flurka.training.checkpoints import checkpoint_meta


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
    parser.add_argument("--init-from", metavar="RUN_DIR|runs:/ID/model",
                        help="start from a finished run's embedding and encoder (pre-train, then fine-tune: "
                             "the task head is new): its work dir, or the model an MLflow run logged "
                             "(with $MLFLOW_TRACKING_URI)")
    parser.add_argument("--workdir", help="checkpoints go to WORKDIR/checkpoints (resumes if present)")
    parser.add_argument("--checkpoint-every", type=int,
                        help="checkpoint every this many steps (default with --workdir: the last step "
                             "only, so the run can be loaded and a longer rerun resumes from it)")
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


@contextlib.contextmanager
def _signals_stop(stop: threading.Event, taken: list[int]):
    """SIGINT and SIGTERM set ``stop`` (the run checkpoints the step it is on and ends); a second
    one ends it now. ``taken``: the signals, in order."""

    def handler(signum, _frame):
        taken.append(signum)
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print(f"flurka train: {signal.Signals(signum).name}: stopping after this step "
              "(again to stop now)", file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _stopped_line(config, exc: BaseException) -> str:
    if not isinstance(exc, Stopped):
        return "flurka train: stopped before a step ended; nothing saved since the last checkpoint"
    if exc.saved:
        return (f"flurka train: stopped at step {exc.step} of {config.steps}; checkpoint in "
                f"{config.workdir}/checkpoints: the same command resumes from it")
    return (f"flurka train: stopped at step {exc.step} of {config.steps}; nothing saved "
            "(give --workdir to keep a run you may stop)")


MLFLOW_SCHEMES = ("runs:/", "models:/", "mlflow-artifacts:/")


def local_run(source: str) -> str:
    """``--init-from``'s work dir: a path as given, or an MLflow model URI downloaded (once,
    under the MLflow cache) to the directory :func:`flurka.training.restore.load_run` reads."""
    if not source.startswith(MLFLOW_SCHEMES):
        return source
    import mlflow   # optional here (a GPU box may train without it); only for an MLflow URI

    try:
        return mlflow.artifacts.download_artifacts(artifact_uri=source)
    except Exception as exc:   # MLflow raises many kinds: unknown run, no server, no artifact
        where = ("the store $MLFLOW_TRACKING_URI names" if os.environ.get("MLFLOW_TRACKING_URI")
                 else "no $MLFLOW_TRACKING_URI set")   # its URL may hold a password: never echoed
        raise ValueError(f"--init-from {source}: cannot download it from MLflow ({where}): "
                         f"{' '.join(str(exc).split())[:200]}") from None


def overrides(args: argparse.Namespace) -> dict:
    out = parse_assignments(args.set)
    flags = {"attention": "model.attention", "d_k": "model.attention_options.d_k",
             "e_init": "model.attention_options.e_init",
             **{name: name for name in ("steps", "seed", "alpha", "base", "base_checkpoint", "workdir",
                                        "checkpoint_every", "data_dir", "init_from")}}
    for flag, key in flags.items():
        if getattr(args, flag) is not None:
            out[key] = getattr(args, flag)
    return nested(out)


def run(args: argparse.Namespace) -> int:
    try:
        config = get_config(args.benchmark, **overrides(args))
        if config.init_from is not None:
            config = config.replace(init_from=local_run(config.init_from))
            checkpoint_meta(config.init_from)      # a run with a checkpoint, before any compute
        if config.workdir is not None:
            writable_dir(config.workdir, "--workdir")
            if not config.checkpoint_every:     # a work dir the user gave holds the run, not nothing
                config = config.replace(checkpoint_every=config.steps)
    except ValueError as exc:
        print(f"flurka train: error: {exc}", file=sys.stderr)
        return 2
    plan = generation_plan(config.dataset, config.data_dir)
    if plan is not None and not args.generate_data:
        print(f"flurka train: error: {args.benchmark} has no prepared data: training would first {plan}; pass "
              "--generate-data to do that, or --data-dir DIR holding lra_release/listops-1000/"
              f"basic_{{train,val,test}}.tsv (the CPU-size {args.benchmark}-small needs neither)", file=sys.stderr)
        return 2
    stop, taken = threading.Event(), []
    try:
        with compilation.accounting(compilation.cache_dir(args.compilation_cache)) as compiled, \
                _signals_stop(stop, taken):
            result = train_run(config, progress=False if args.no_progress else None, stop=stop)
    except (Stopped, KeyboardInterrupt) as exc:
        print(_stopped_line(config, exc), file=sys.stderr)
        return 128 + (taken[-1] if taken else signal.SIGINT)
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
