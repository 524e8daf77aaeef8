"""``python -m flurka.speed``: step times of every mechanism, with JAX alone (no Ray, MLflow, SQL).

    python -m flurka.speed --sweep n-sweep --dtype bfloat16 --out benchmarks/h100_nsweep.json
    python -m flurka.speed --sweep tiny --mechanisms full,flurka-rnn --modes forward --repeats 3
    python -m flurka.speed --sweep dk-sweep --list          # print the points and their indices

Writes ONE JSON file (rewritten after each point, so an interrupted run keeps its rows; SIGINT
or SIGTERM stops before the next point with one line and exit 130 / 143, a second at once):

``schema``      "flurka.speed/1"
``sweep``       sweep name; ``created`` UTC ISO time
``device``      {name (e.g. "NVIDIA H100 80GB HBM3"), platform (gpu/cpu), count, host,
                visible_devices}
``versions``    {python, jax, jaxlib, flax, optax, numpy, and where present jax-cuda12-plugin,
                cuda_runtime, cudnn, cuda_driver}
``settings``    {warmup, repeats, calls_per_sample (null: sized per point), memory_budget_bytes,
                runner ("local" or "ray"), stopped_at_deadline (present and true when --time-budget-min cut the list),
                stopped_by_signal (present and true when SIGINT / SIGTERM did),
                interleaved (present and true with --interleave; each row then has it too)}
``ceilings``    {dtype: {matmul_flops_per_s, copy_bytes_per_s, matmul: {n, flops, median_s, …},
                copy: {array_bytes, bytes, median_s, …}}} — measured on this card
``results``     one row per point:
  config        index, sweep, mechanism, mode (forward|train), scope (layer|model), seq_len,
                d_model, num_heads, d_k, num_features, layers, ffn, dtype, batch, align, fused,
                pad_to, xla ({name: value} compile options), fused_ffn, fused_projections (d_k/num_features as configured;
                ``d_k_used``/``num_features_used`` as built)
  status        "ok" | "oom" (XLA RESOURCE_EXHAUSTED / MemoryError: ``oom_source`` "xla"; or the
                compiled need above --memory-budget-gb: "budget") | "error" (``error``,
                ``error_type``, ``traceback``)
  timing        median_s, p10_s, p90_s, min_s (seconds a call), repeats, warmup,
                calls_per_sample (back-to-back calls a timed sample: enough for 5 ms, 1 for
                longer steps; flurka.speed.timing), compile_s (seconds)
  model         params, params_lowrank (E1/E2), implementation (flash: cudnn|xla), device_name;
                ``task`` (experiments/speed_sweep.py only: the Ray task that timed the row)
  flops         FLOP model (flurka.attention.flops; train: the backward product by product, a
                lone layer's input needing no gradient); xla_dot_flops (dots in
                the compiled HLO), xla_dot_flops_by_type (the same by operand type: a bf16 point
                should be all "bf16"), xla_flops (XLA cost analysis), xla_memory_bytes,
                xla_traffic_bytes and xla_traffic_by_kind (the compiled plan's memory traffic:
                each kernel reading its operands and writing its results once)
  floor         min_bytes, floor_s = max(flops / matmul rate, min_bytes / copy bandwidth),
                compute_floor_s, memory_floor_s, bound (compute|memory), ratio_to_floor
                = median_s / floor_s
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from flurka.attention import FUSABLE, PROJECTABLE
from flurka.cli import module_main, stopping_on_signals, writable_file
from flurka.kernels.ffn import ONE_KERNEL, FfnTiling, use_ffn_tiling
from flurka.speed.configs import DTYPES, MODES, SCOPES, SWEEP_NAMES, points, select, xla_option


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _indices(text: str) -> list[int]:
    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--points takes comma-separated integers, got {text!r}")


def add_selection_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Which points: the sweep and its filters (shared with ``flurka.speed.aot``)."""
    parser.add_argument("--sweep", required=required, choices=SWEEP_NAMES)
    parser.add_argument("--mechanisms", type=_csv, default=None,
                        help="comma-separated subset (default: the sweep's)")
    parser.add_argument("--modes", type=_csv, default=None,
                        help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--scope", choices=SCOPES, default=None,
                        help="layer or model (default: the sweep's scopes)")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="compute dtype (default: the sweep's; bfloat16 for GPU sweeps)")
    parser.add_argument("--align", type=int, default=1,
                        help="aligned execution: pad GEMM dimensions to multiples of this (e.g. "
                             "128) in the mechanisms that support it; 1 = the layer's own shapes")
    parser.add_argument("--fused", action="store_true",
                        help="run the query side as one Pallas kernel in the mechanisms that "
                             f"have one ({', '.join(FUSABLE)})")
    parser.add_argument("--fused-projections", action="store_true",
                        help="with --fused: W_Q and W_O inside the query-side kernel too, where the "
                             f"layer takes it ({', '.join(PROJECTABLE)}; d_model a multiple of 128 "
                             "up to 512, head dim a power of two up to 128, m <= 128)")
    parser.add_argument("--fused-ffn", action="store_true",
                        help="model scope: run each block's residual, LayerNorm and FFN as Pallas "
                             "kernels (d_model and ffn multiples of 128), every mechanism alike")
    parser.add_argument("--ffn-kernels", type=int, choices=(1, 2), default=None,
                        help="with --fused-ffn: the block as one kernel per block of rows (the "
                             "hidden layer never in memory, d_model up to 512; it hands the next "
                             "block's LayerNorm its statistics) or as two (default: the current "
                             "FFN tiling's, two unless a GPU session tuned it)")
    parser.add_argument("--pad-to", type=int, default=1,
                        help="pad the batch's sequence to a multiple of this (rows past N masked, "
                             "the model built for that length), as a data pipeline pads for the "
                             "tensor cores; 1 = N rows")
    parser.add_argument("--xla", action="append", type=xla_option, default=[],
                        metavar="NAME=VALUE",
                        help="an XLA compile option for every point (repeatable; recorded in each "
                             "row), e.g. xla_gpu_experimental_gemm_fusion_v2=true or "
                             "xla_gpu_experimental_force_split_k=1")
    parser.add_argument("--points", type=_indices, default=None,
                        help="comma-separated indices into the (filtered) point list; see --list")
    parser.add_argument("--list", action="store_true", help="print the points and exit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calls-per-sample", type=int, default=None,
                        help="calls dispatched back to back per timed sample (default: enough "
                             "for 5 ms, at most 32; 1 = one blocked call a sample, as documents "
                             "without calls_per_sample were timed)")
    parser.add_argument("--memory-budget-gb", type=float, default=None,
                        help="report points whose compiled step needs more as oom, unrun")
    parser.add_argument("--no-ceilings", action="store_true",
                        help="skip the matmul/bandwidth probes (no floor_s / ratio_to_floor)")
    parser.add_argument("--time-budget-min", type=float, default=None,
                        help="start no new point after this many minutes (the file stays whole)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after timing a point, trace this many steps and record where the "
                             "device time went (per XLA op and kind: gemm, elementwise, ...)")
    parser.add_argument("--interleave", action="store_true",
                        help="time the mechanisms of each configuration side by side: compile "
                             "them all, then run them in turn, one sample each per round, so a "
                             "machine whose speed drifts slows them alike (holds their steps in "
                             "memory together)")
    parser.add_argument("--out", default="speed_results.json")


def selected(args: argparse.Namespace):
    """(indices, points) after the filters and --points; ValueError on bad input."""
    per_sample = getattr(args, "calls_per_sample", None)
    if (getattr(args, "repeats", 1) < 1 or getattr(args, "warmup", 0) < 0
            or getattr(args, "profile_steps", 0) < 0 or (per_sample is not None and per_sample < 1)):
        raise ValueError("--repeats and --calls-per-sample must be >= 1, --warmup and "
                         "--profile-steps >= 0")
    if args.ffn_kernels is not None and not args.fused_ffn:
        raise ValueError("--ffn-kernels needs --fused-ffn")
    if args.fused_projections and not args.fused:
        raise ValueError("--fused-projections needs --fused (the projections run inside the fused kernel)")
    pts = points(args.sweep, mechanisms=args.mechanisms, modes=args.modes,
                 scopes=None if args.scope is None else [args.scope], dtype=args.dtype,
                 align=args.align, fused=args.fused, pad_to=args.pad_to, xla=args.xla,
                 fused_ffn=args.fused_ffn, fused_projections=args.fused_projections)
    indices = list(range(len(pts))) if args.points is None else list(args.points)
    return indices, select(pts, indices)


def ffn_form(args: argparse.Namespace):
    """The FFN tiling ``--ffn-kernels`` asks for, as a context the points are built in."""
    if args.ffn_kernels is None:
        return contextlib.nullcontext()
    return use_ffn_tiling(ONE_KERNEL if args.ffn_kernels == 1 else FfnTiling())


def run(args: argparse.Namespace) -> int:
    indices, pts = selected(args)
    if args.list:
        for i, p in zip(indices, pts):
            print(i, p)
        return 0
    writable_file(args.out, "--out")
    with stopping_on_signals() as stop:   # polled between points: no exception inside JAX
        return _run(args, indices, pts, stop)


def _run(args: argparse.Namespace, indices: list[int], pts, stop) -> int:
    # imported here, not above (a measured start-up cost): they load optax, the models and the
    # training room, which --list and --help do not need
    from flurka.speed.bench import check_compile_options, freeze_survivors
    from flurka.speed.profile import brief
    from flurka.speed.runner import run_sweep

    check_compile_options(dict(args.xla))

    budget = None if args.memory_budget_gb is None else int(args.memory_budget_gb * 2**30)
    deadline = (None if args.time_budget_min is None
                else time.monotonic() + 60 * args.time_budget_min)

    done: list[dict] = []
    stop.line = lambda: (f"stopped after {len(done)} of {len(pts)} points; " + (
        f"{len(done)} row{'' if len(done) == 1 else 's'} in {args.out}" if done else f"nothing written to {args.out}"))

    def progress(row: dict) -> None:
        done.append(row)
        t = row.get("median_s")
        print(f"[{row['index']}] {row['mechanism']:>16} {row['mode']:>7} {row['scope']:>5} "
              f"N={row['seq_len']} d_model={row['d_model']} d_k={row['d_k']}: {row['status']}"
              + (f" {t * 1e3:.3f} ms" if t is not None else f" {row.get('error', '')[:120]}")
              + (f" ({row['ratio_to_floor']:.2f}x floor)" if row.get("ratio_to_floor") else "")
              + (f" [{brief(row['profile'])}]" if row.get("profile") else ""), flush=True)

    freeze_survivors()
    with ffn_form(args):
        doc = run_sweep(pts, indices, sweep=args.sweep, out=args.out, warmup=args.warmup,
                        repeats=args.repeats, per_sample=args.calls_per_sample,
                        memory_budget_bytes=budget,
                        with_ceilings=not args.no_ceilings, progress=progress,
                        deadline=deadline, profile_steps=args.profile_steps,
                        interleave=args.interleave, stop=stop)
    if stop.is_set():
        return stop.finish()
    statuses = [r["status"] for r in doc["results"]]
    print(f"wrote {args.out}: {len(statuses)} points, "
          + ", ".join(f"{s} {statuses.count(s)}" for s in ("ok", "oom", "error")))
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("python -m flurka.speed", "flurka.speed.__main__", argv)


if __name__ == "__main__":
    sys.exit(main())
