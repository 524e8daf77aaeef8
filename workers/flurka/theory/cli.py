"""``python -m flurka.theory`` (also ``flurka theory``): the paper's theory, measured, as the
JSON file that ``flurka report --theory FILE`` draws (approximation error vs m and d_k, Theorem 1;
numerical rank of kernelized attention per head). JAX alone: no Ray, MLflow or SQL, so it runs on
the GPU machine as it is.

    python -m flurka.theory --out theory.json
    python -m flurka.theory --seq-len 1024 --d-model 256 --heads 4 --d-k 64,128,256 \\
        --features 16,32,64,128 --out benchmarks/h100_theory.json
    python -m flurka.theory --from-run runs/listops-performer --out theory_trained.json

Writes ONE JSON document (the form :mod:`flurka.reports.sources` reads):

``schema``                "flurka.theory/1"; ``created`` UTC ISO time
``device``                {name, platform, count, host, visible_devices} (as ``flurka.speed``)
``versions``              python, jax, jaxlib, flax, ... (as ``flurka.speed``)
``config``                seq_len, d_model, num_heads, batch, seeds, d_k, m, inputs, matmul_precision
                          (the report prints it under every figure)
``approximation_errors``  ``flurka.theory.approximation_errors`` rows: mechanism, d_k, m,
                          seed, rel_error, inf_error (+ kernel_term, lowrank_term for FLuRKA)
``ranks``                 one row per (mechanism, seed, example, head): rank of φ(Q)φ(K)ᵀ
                          (``kernel_attention_ranks``), max_rank = min(N, N_k), d_k, m

Inputs are standard normal (per seed, as ``approximation_errors`` draws them) and every layer shares
the full layer's W_Q, W_K, W_V, W_O. With ``--from-run DIR`` (a training work dir with checkpoints)
they are instead what each attention layer of that trained model receives on ``--batch`` eval
examples (:mod:`flurka.theory.trained`): N, d_model and heads are the run's, every row carries its
``layer``, the full layer and all approximations carry that layer's trained projections, the seeds
vary only the random draws (E, ω), and rank rows of the trained mechanism itself say
``trained: true``; ``config.inputs`` names the run and ``config.source`` holds its dir and step.
Matmuls run at ``highest`` precision by default, so TF32 on a GPU does not show up as
approximation error. Bad input (unknown mechanism, d_k longer than the
sequence, heads not dividing d_model) is one line on stderr and exit status 2, before anything is
compiled. SIGINT / SIGTERM stop it between two rows: one line (``stopped after N of M rows;
nothing written``, a partial document would read as a whole one) and exit 130 / 143; ``--out``
is written whole or not at all.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import jax
from flax import nnx

from flurka import theory
from flurka.attention import flops as flop_model
from flurka.attention import make_attention
from flurka.cli import module_main, stopping_on_signals, writable_file
from flurka.theory.flops_cli import positive_int

PROG = "python -m flurka.theory"
PRECISIONS = ("highest", "high", "default")


def _positive_list(text: str) -> list[int]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected comma-separated positive integers, got nothing")
    return [positive_int(t) for t in items]


def _int_list(text: str) -> list[int]:
    try:
        items = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not items:
        raise argparse.ArgumentTypeError("expected comma-separated integers, got nothing")
    return items


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="theory.json", help="JSON file to write (default %(default)s)")
    parser.add_argument("--seq-len", type=positive_int, default=256, help="sequence length N (default 256)")
    parser.add_argument("--d-model", type=positive_int, default=64, help="hidden size d_m (default 64)")
    parser.add_argument("--heads", type=positive_int, default=4, help="number of heads H (default 4)")
    parser.add_argument("--d-k", type=_positive_list, default=[16, 32, 64], metavar="K1,K2,...",
                        help="d_k values: the lengths E1, E2 compress the sequence to (Linformer, FLuRKA; "
                             "default 16,32,64)")
    parser.add_argument("--features", type=_positive_list, default=[8, 16, 32, 64], metavar="M1,M2,...",
                        help="FAVOR+ random features per head m (performer, flurka-performer; "
                             "default 8,16,32,64)")
    parser.add_argument("--mechanisms", type=_names, default=None,
                        help="comma-separated mechanisms for the error rows (default: all)")
    parser.add_argument("--rank-mechanisms", type=_names, default=None,
                        help="feature-map mechanisms for the rank rows (default: performer, rnn and "
                             "their FLuRKA variants); 'none' for no rank rows")
    parser.add_argument("--rank-d-k", type=positive_int, default=None,
                        help="d_k of the FLuRKA rank layers (default: the largest --d-k)")
    parser.add_argument("--rank-features", type=positive_int, default=None,
                        help="m of the performer rank layers (default: the largest --features)")
    parser.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="default 0,1,2")
    parser.add_argument("--batch", type=positive_int, default=2, help="examples per seed (default 2)")
    parser.add_argument("--matmul-precision", choices=PRECISIONS, default="highest",
                        help="JAX matmul precision (default highest: no TF32 error on GPUs)")
    parser.add_argument("--from-run", default=None, metavar="DIR",
                        help="measure on the attention inputs of this training run's model "
                             "(a work dir with checkpoints); N, d_model and heads are the run's")
    parser.add_argument("--step", type=positive_int, default=None,
                        help="with --from-run: the checkpoint step (default: the latest)")


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """Validate everything before anything is compiled; ValueError (one line) on bad input."""
    shape = {"seq_len": args.seq_len, "d_model": args.d_model, "num_heads": args.heads}
    if args.from_run is not None:
        # Orbax (flurka.training) here and below: 0.5 s that `flurka theory --help` does not pay
        from flurka.training.restore import checkpoint_meta, train_config
        step, meta = checkpoint_meta(args.from_run, args.step)
        run_config = train_config(meta)
        shape = {"seq_len": run_config.max_len, "d_model": run_config.model.d_model,
                 "num_heads": run_config.model.num_heads, "step": step}
    elif args.step is not None:
        raise ValueError("--step needs --from-run")

    mechanisms = list(args.mechanisms) if args.mechanisms is not None else list(flop_model.MECHANISMS)
    if not mechanisms:
        raise ValueError(f"--mechanisms is empty; valid: {', '.join(flop_model.MECHANISMS)}")
    for mech in mechanisms:
        if mech not in flop_model.MECHANISMS:
            raise ValueError(f"unknown mechanism {mech!r}; valid: {', '.join(flop_model.MECHANISMS)}")
    if args.rank_mechanisms == ["none"]:
        rank_mechanisms: list[str] = []
    elif args.rank_mechanisms is None:
        rank_mechanisms = list(theory.FEATURE_MECHANISMS)
    else:
        rank_mechanisms = list(args.rank_mechanisms)
    for mech in rank_mechanisms:
        if mech not in theory.FEATURE_MECHANISMS:
            raise ValueError(f"rank needs a feature-map mechanism, got {mech!r}; "
                             f"valid: {', '.join(theory.FEATURE_MECHANISMS)}")
    if len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds has duplicates: {args.seeds}")
    d_ks, ms = sorted(set(args.d_k)), sorted(set(args.features))
    rank_d_k = args.rank_d_k or max(d_ks)
    rank_m = args.rank_features or max(ms)
    # The FLOP model's shape check gives the same messages as `flurka flops` (heads | d_model,
    # d_k <= N, positive sizes) ...
    for d_k in sorted({*d_ks, rank_d_k}):
        flop_model.AttentionShape(batch=args.batch, seq_len=shape["seq_len"], d_model=shape["d_model"],
                                  num_heads=shape["num_heads"], d_k=d_k, num_features=rank_m)
    # ... and building every layer abstractly (no arrays, nothing compiled) catches whatever else a
    # layer rejects at this shape.
    for mech, d_k, m in _layer_configs(mechanisms, rank_mechanisms, d_ks, ms, rank_d_k, rank_m):
        _check_layer(mech, d_model=shape["d_model"], num_heads=shape["num_heads"],
                     seq_len=shape["seq_len"], d_k=d_k, m=m)
    return {"mechanisms": mechanisms, "rank_mechanisms": rank_mechanisms, "d_k": d_ks, "m": ms,
            "rank_d_k": rank_d_k, "rank_m": rank_m, **shape}


def _layer_configs(mechanisms, rank_mechanisms, d_ks, ms, rank_d_k, rank_m):
    seen = set()
    for mech in mechanisms:
        uses_dk, uses_m = theory.uses(mech)
        for d_k in d_ks if uses_dk else [None]:
            for m in ms if uses_m else [None]:
                seen.add((mech, d_k, m))
    for mech in rank_mechanisms:
        uses_dk, uses_m = theory.uses(mech)
        seen.add((mech, rank_d_k if uses_dk else None, rank_m if uses_m else None))
    return sorted(seen, key=lambda c: (c[0], c[1] or 0, c[2] or 0))


def _build(mech: str, *, d_model: int, num_heads: int, seq_len: int, d_k: int | None, m: int | None, seed: int):
    return make_attention(mech, d_model=d_model, num_heads=num_heads, max_len=seq_len,
                          rngs=nnx.Rngs(seed), **theory.layer_options(d_k, m))


def _check_layer(mech: str, **kw) -> None:
    try:
        nnx.eval_shape(lambda: _build(mech, seed=0, **kw))
    except ValueError as err:
        raise ValueError(f"{mech}: {str(err).splitlines()[0]}") from None


def rank_rows(args: argparse.Namespace, p: dict[str, Any]) -> list[dict[str, Any]]:
    """Numerical rank of φ(Q)φ(K)ᵀ for every rank mechanism, seed, example and head."""
    return list(_iter_rank_rows(args, p))


def _iter_rank_rows(args: argparse.Namespace, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for seed in args.seeds:
        x = jax.random.normal(jax.random.key(seed), (args.batch, args.seq_len, args.d_model))
        for mech in p["rank_mechanisms"]:
            uses_dk, uses_m = theory.uses(mech)
            layer = _build(mech, d_model=args.d_model, num_heads=args.heads, seq_len=args.seq_len,
                           d_k=p["rank_d_k"] if uses_dk else None,
                           m=p["rank_m"] if uses_m else None, seed=seed)
            yield from [{**row, "seed": seed} for row in theory.rank_rows(layer, x)]


def _row_counts(args: argparse.Namespace, p: dict[str, Any], inputs: int, examples: int) -> int:
    """How many rows the document will hold: errors and ranks per input set (``inputs``: 1, or the
    trained model's layers) of ``examples`` examples."""
    grid = 0
    for mech in p["mechanisms"]:
        uses_dk, uses_m = theory.uses(mech)
        grid += (len(p["d_k"]) if uses_dk else 1) * (len(p["m"]) if uses_m else 1)
    per_rank_layer = examples * p["num_heads"]
    rank_layers = len(p["rank_mechanisms"]) * (1 if args.from_run is not None else len(args.seeds))
    return inputs * (len(args.seeds) * grid + rank_layers * per_rank_layer)


def _random_rows(args: argparse.Namespace, p: dict[str, Any]) -> tuple[Iterator[dict], Iterator[dict], int]:
    """Error and rank rows on standard-normal inputs, as they are measured, and how many."""
    errors = theory.iter_approximation_errors(d_model=args.d_model, num_heads=args.heads,
                                              seq_len=args.seq_len, d_k_values=p["d_k"], m_values=p["m"],
                                              mechanisms=p["mechanisms"], seeds=args.seeds,
                                              batch=args.batch)
    return errors, _iter_rank_rows(args, p), _row_counts(args, p, 1, args.batch)


def _trained_rows(args: argparse.Namespace, p: dict[str, Any]) -> tuple[Iterator[dict], Iterator[dict], int]:
    """Error and rank rows on the captured inputs of ``--from-run``'s model, as they are
    measured, and how many (updates ``p`` with what the document's config says about the inputs)."""
    from flurka.theory import trained   # Orbax, as in plan()
    from flurka.training import load_run

    run = load_run(args.from_run, p["step"])
    captured = trained.capture(run, args.batch)
    examples = int(captured[0].x.shape[0])
    p["inputs"] = f"captured: {run.describe()}"
    p["source"] = {"workdir": os.path.abspath(args.from_run), "step": run.step,
                   "benchmark": run.config.benchmark, "attention": run.attention,
                   "layers": len(captured), "examples": examples}
    errors = trained.iter_error_rows(captured, d_k_values=p["d_k"], m_values=p["m"],
                                     mechanisms=p["mechanisms"], seeds=args.seeds)
    ranks = trained.iter_rank_rows(captured, p["rank_mechanisms"], d_k=p["rank_d_k"], m=p["rank_m"])
    return errors, ranks, _row_counts(args, p, len(captured), examples)


def _until_stopped(rows: Iterator[dict], into: list[dict], stop) -> bool:
    """``rows`` into ``into`` until they end (True) or ``stop`` is set (polled before each row)."""
    while not stop.is_set():
        row = next(rows, None)
        if row is None:
            return True
        into.append(row)
    return False


def document(args: argparse.Namespace, p: dict[str, Any], errors: list[dict], ranks: list[dict]) -> dict[str, Any]:
    from flurka.speed.runner import device_info, versions   # Orbax, as in plan()

    config = {"seq_len": p["seq_len"], "d_model": p["d_model"], "num_heads": p["num_heads"],
              "batch": args.batch, "seeds": list(args.seeds), "d_k": p["d_k"], "m": p["m"],
              "inputs": p.get("inputs", "standard normal"), "matmul_precision": args.matmul_precision}
    if "source" in p:
        config["source"] = p["source"]
    if p["rank_mechanisms"]:
        config.update(rank_d_k=p["rank_d_k"], rank_m=p["rank_m"])
    return {"schema": "flurka.theory/1",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": device_info(), "versions": versions(), "config": config,
            "approximation_errors": errors, "ranks": ranks}


def _write(doc: dict[str, Any], path: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, out)


def run(args: argparse.Namespace) -> int:
    with stopping_on_signals() as stop:   # polled between rows: no exception inside JAX
        return _run(args, stop)


def _run(args: argparse.Namespace, stop) -> int:
    p = plan(args)  # ValueError before any compute
    writable_file(args.out, "--out")
    start = time.perf_counter()
    errors: list[dict] = []
    ranks: list[dict] = []
    total: list[int] = []
    stop.line = lambda: (f"stopped after {len(errors) + len(ranks)}"
                         + (f" of {total[0]}" if total else "") + f" rows; nothing written to {args.out}")
    complete = False
    with jax.default_matmul_precision(args.matmul_precision):
        if args.from_run is None or not stop.is_set():   # a trained model is loaded first
            error_rows, rank_rows_, count = (_trained_rows if args.from_run is not None else _random_rows)(args, p)
            total.append(count)
            complete = _until_stopped(error_rows, errors, stop) and _until_stopped(rank_rows_, ranks, stop)
    if not complete:
        return stop.finish()
    doc = document(args, p, errors, ranks)
    _write(doc, args.out)
    print(f"wrote {args.out}: {len(errors)} approximation-error rows ({len(p['mechanisms'])} mechanisms), "
          f"{len(ranks)} rank rows, on {doc['device']['name']} in {time.perf_counter() - start:.1f}s")
    return stop.finish(f"stopped after the last row; {args.out} written whole") if stop.is_set() else 0


def main(argv: list[str] | None = None) -> int:
    return module_main(PROG, "flurka.theory.cli", argv)


if __name__ == "__main__":
    sys.exit(main())
