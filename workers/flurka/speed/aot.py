"""Compile the speed points and the fused kernels for a GPU that is not here: XLA's ahead-of-time
(deviceless) compile for a CUDA target, on any host, with JAX's own CUDA compiler.

    make aot ARGS="--target h100 --sweep flash-compare --modes forward --fused --out aot.json"
    make aot ARGS="--target h100 --tilings --out tilings.json"

What it answers before a GPU is lent, per point: does the step compile for the card, how much
memory does XLA's buffer assignment give it (``peak_bytes``; over the card's memory it is an
out-of-memory point, whatever a lease would spend finding that out), and which kernels it launches
— for our Pallas kernels (``flurka_*``) their grid, threads and shared memory, and from ``ptxas
-v`` their registers and spills (a kernel that spills to local memory is slow however it is
tiled). ``--tilings`` does that for every launch shape the GPU session's tuner would time.

What it cannot answer: times. XLA tunes its GEMMs on the card (block sizes, split-K, cuBLAS or
Triton); without one it takes default configurations, so the XLA kernels listed here, and
buffers that depend on them (split-K partials), may differ from the card's. Pallas kernels are
not autotuned — their launch shape is ours — so theirs is what the card will compile.

Needs XLA's CUDA compiler outside the project's virtualenv (``make cuda-aot`` installs
``jax-cuda12-plugin``/``-pjrt`` of the same jaxlib version and ``ptxas`` under ``.cuda-aot``;
``make aot`` runs this with it on ``PYTHONPATH``). Installed into ``.venv`` the plugin would try
to start a CUDA backend in every process of a host without a GPU. Targets are XLA's
``GpuTargetConfig`` text protos (:data:`TARGETS`, or ``--target-config FILE``: any GPU run with
``XLA_FLAGS=--xla_dump_to=DIR`` writes its card's as ``*.gpu_target_config.pbtxt``).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
from jax.experimental.topologies import get_topology_desc

from flurka.kernels.query_side import Tiling
from flurka.speed import bench, profile, tuning
from flurka.speed.__main__ import add_selection_arguments, ffn_form, selected
from flurka.speed.configs import Point
from flurka.speed.runner import versions, write_json
from flurka.speed.timing import failure

# XLA's GpuTargetConfig of an H100 SXM (80 GB HBM3), the card the GPU targets name, and of the
# H200 (141 GB HBM3e): same chip (sm_90, 132 SMs, 227 KB shared memory per block), more and
# faster memory.
_HOPPER = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
runtime_version {{ major: 12 minor: 8 }}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 7 }}
device_description_str: "{name}"
"""
TARGETS: dict[str, str] = {
    "h100": _HOPPER.format(name="NVIDIA H100 80GB HBM3", memory=84_929_347_584,
                           bandwidth=3_352_320_000_000),
    "h200": _HOPPER.format(name="NVIDIA H200", memory=150_754_820_096,
                           bandwidth=4_800_000_000_000),
}
PLUGIN_DIR = os.environ.get("FLURKA_CUDA_AOT", os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 3, ".cuda-aot")))


def target_facts(config: str) -> dict[str, Any]:
    """The card's name and memory as the target config states them."""
    name = re.search(r'device_description_str:\s*"([^"]*)"', config)
    memory = re.search(r"device_memory_size:\s*(\d+)", config)
    return {"name": name.group(1) if name else None,
            "memory_bytes": int(memory.group(1)) if memory else None}


def target_device(config: str):
    """A compile-only CUDA device for ``config`` (a GpuTargetConfig text proto); a clear error
    when XLA's CUDA compiler is not importable."""
    try:
        importlib.import_module("jax_plugins.xla_cuda12")
    except ImportError:
        raise RuntimeError(
            "compiling for a GPU target needs XLA's CUDA compiler (jax-cuda12-plugin and "
            "jax-cuda12-pjrt of this jaxlib's version) importable before JAX starts: run "
            "`make aot ARGS=...` (it installs them under .cuda-aot), or put that directory on "
            "PYTHONPATH") from None
    return get_topology_desc("flurka-aot", "cuda", target_config=config,
                             topology="1x1x1").devices[0]


def ptxas() -> str | None:
    """The ptxas that ``make cuda-aot`` installs, else one on PATH (None: no register report)."""
    local = os.path.join(PLUGIN_DIR, "nvidia", "cuda_nvcc", "bin", "ptxas")
    return local if os.access(local, os.X_OK) else shutil.which("ptxas")


# XLA's default backend optimization level (LLVM and ptxas), pinned: what the card compiles
# with even where XLA_FLAGS lowers it for this host (the tests' cheap CPU codegen), since
# registers and spills are what this module reports.
CARD_BACKEND_OPTIMIZATION_LEVEL = 3


def compile_for(fn, args, device, dump_dir: str, **options):
    """(lowered, compiled) of jitted ``fn`` on ``args``' shapes for ``device``; XLA's dumps
    (optimised HLO, launch sequence, PTX) go to ``dump_dir``; ``options``: XLA's, by name."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
    lowered = fn.trace(*specs).lower(lowering_platforms=("cuda",))
    return lowered, lowered.compile(compiler_options={
        "xla_dump_to": dump_dir, "xla_backend_optimization_level": CARD_BACKEND_OPTIMIZATION_LEVEL,
        **options})


# Without the card XLA cannot tune its GEMMs, and for some (the N-sweep's [2600, 2600] weight
# gradients over N = 55.5k) its default Triton tiling is refused: those steps compile with cuBLAS.
_UNTILED = "Couldn't find output tile sizes"


def _compile_step(fn, args, device, dump_dir: str, result: dict[str, Any], options):
    try:
        return compile_for(fn, args, device, dump_dir, **options)
    except Exception as exc:  # noqa: BLE001 - retried below, else raised as it was
        if _UNTILED not in str(exc):
            raise
    result["gemms"] = "cublas (without the card, XLA's default Triton GEMM tiling was refused)"
    return compile_for(fn, args, device, dump_dir, **{**options,
                                                      "xla_gpu_enable_triton_gemm": False})


_LAUNCH = re.compile(r"kCustomKernel.*?\]\s+(\S+) grid: \[(\d+), (\d+), (\d+)\] "
                     r"threads: \[(\d+), (\d+), (\d+)\]\s+shared_memory: (\d+) bytes")


def launches(dump_dir: str, prefix: str = "flurka_") -> list[dict[str, Any]]:
    """Our Pallas kernels in the compiled step (XLA's launch sequence): each distinct launch
    once, with how many times the step makes it (``launches``: one per layer, say)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for path in sorted(glob.glob(os.path.join(dump_dir, "*.thunk_sequence.txt"))):
        with open(path) as f:
            for m in _LAUNCH.finditer(f.read()):
                if m.group(1).startswith(prefix):
                    g = [int(x) for x in m.groups()[1:]]
                    row = rows.setdefault((m.group(1), *g), {
                        "kernel": m.group(1), "grid": g[:3], "threads": g[3] * g[4] * g[5],
                        "shared_memory_bytes": g[6], "launches": 0})
                    row["launches"] += 1
    return list(rows.values())


_PTXAS = re.compile(r"Compiling entry function '(\S+)'.*?(\d+) bytes stack frame, "
                    r"(\d+) bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) registers",
                    re.S)


def _entries(ptx: str, prefix: str) -> dict[str, str]:
    """Each of our kernels' PTX body in a module, by name."""
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)
    return {name: body for name, body in zip(parts[1::2], parts[2::2]) if name.startswith(prefix)}


def resources(dump_dir: str, prefix: str = "flurka_", arch: str = "sm_90a") -> dict[str, dict]:
    """Per kernel of ours in the dumped PTX: its tensor-core instructions (``wgmma``, Hopper's
    warpgroup MMA; ``mma.sync``, the older per-warp path; or none) and, from ``ptxas -v``,
    registers per thread, stack frame and spill bytes (those need ptxas)."""
    tool = ptxas()
    out: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(dump_dir, "*.ptx"))):
        with open(path) as f:
            entries = _entries(f.read(), prefix)
        for name, body in entries.items():
            out[name] = {"mma": ("wgmma" if "wgmma.mma_async" in body
                                 else "mma.sync" if "mma.sync" in body else None)}
        if not entries or tool is None:
            continue
        report = subprocess.run([tool, f"-arch={arch}", "-v", path, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
        for m in _PTXAS.finditer(report):
            if m.group(1) in out:
                out[m.group(1)].update(
                    registers=int(m.group(5)), stack_bytes=int(m.group(2)),
                    spill_store_bytes=int(m.group(3)), spill_load_bytes=int(m.group(4)))
    return out


def kernel_report(dump_dir: str) -> list[dict[str, Any]]:
    """Each Pallas launch with its ptxas resources."""
    regs = resources(dump_dir)
    return [{**launch, **regs.get(launch["kernel"], {})} for launch in launches(dump_dir)]


def launch_count(dump_dir: str) -> int:
    """Kernels (and copies, memsets) a step launches: XLA's launch sequence, all of it."""
    count = 0
    for path in glob.glob(os.path.join(dump_dir, "*.thunk_sequence.txt")):
        with open(path) as f:
            count += sum(1 for line in f if re.match(r"\d+: k", line))
    return count


def memory(compiled) -> dict[str, int]:
    """XLA's buffer assignment: arguments, outputs, temporaries, and what the step holds at
    once (``peak_bytes``, the figure a lease's --memory-budget-gb is checked against)."""
    mem = compiled.memory_analysis()
    out = {k: int(getattr(mem, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp",
                                                                "alias")}
    out["peak_bytes"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def _failure(exc: BaseException) -> dict[str, Any]:
    """:func:`flurka.speed.timing.failure`, but a kernel past the card's shared memory (XLA says
    RESOURCE_EXHAUSTED for it too) is an error of its launch shape, not out-of-memory."""
    row = failure(exc)
    if "hared memory" in row.get("error", ""):
        row["status"] = "error"
    return row


def compile_point(point, device, card_memory: int | None,
                  options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One speed point compiled for the target: the row :func:`flurka.speed.bench.describe`
    gives (configuration, parameters, FLOP model, bytes, HLO dots) with ``status`` "ok" (it fits),
    "oom" (XLA refused, or ``peak_bytes`` over the card's memory) or "error", its memory and
    its Pallas kernels. ``options``: XLA's compile options, by name (e.g. the card's GEMM
    choices where they are known: ``xla_gpu_experimental_force_split_k``)."""
    result: dict[str, Any] = {**point.as_dict(), "status": None}
    with tempfile.TemporaryDirectory(prefix="flurka-aot-") as dump:
        try:
            fn, args = bench.describe(point, result, abstract=True)
            start = time.perf_counter()
            lowered, compiled = _compile_step(fn, args, device, dump, result,
                                              {**dict(point.xla), **(options or {})})
            result["compile_s"] = time.perf_counter() - start
            del args
            result.update(memory=memory(compiled), kernels=kernel_report(dump),
                          traffic=profile.planned_traffic(compiled.as_text()),
                          launches=launch_count(dump))
            result.update(bench.hlo_dots(lowered))
            if result.get("implementation") == "xla" and point.mechanism == "flash":
                result["note"] = ("flash built here takes the XLA path; on a CUDA card with a "
                                  "head dim cuDNN takes (≤ 128, ≤ 256 on Hopper) cuDNN runs")
            peak = result["memory"]["peak_bytes"]
            result["status"] = "oom" if card_memory is not None and peak > card_memory else "ok"
            if result["status"] == "oom":
                result.update(oom_source="aot", error=f"compiled step needs {peak} bytes > the "
                              f"card's {card_memory}")
        except Exception as exc:  # noqa: BLE001 - a point that does not compile is a result
            result.update(_failure(exc))
    return result


def compile_tilings(device, *, forward_grid=None, backward_grid=None, wide_grid=None,
                    wide_size=None, softmax_grid=None, softmax_size=None, **size) -> list[dict]:
    """The tuner's candidates (:mod:`flurka.speed.tuning`'s grids, at its sizes unless given)
    compiled for the target: per candidate and feature map (the softmax stage: its one kernel),
    its kernels' launch and resources (forward, wide and softmax candidates: the forward kernel;
    backward ones: the gradient's two)."""
    sizes = tuning.stage_sizes(size, wide_size, softmax_size)
    grids = {"forward": tuning.FORWARD_GRID if forward_grid is None else forward_grid,
             "gradient": tuning.BACKWARD_GRID if backward_grid is None else backward_grid,
             "wide": tuning.WIDE_GRID if wide_grid is None else wide_grid,
             "softmax": tuning.SOFTMAX_GRID if softmax_grid is None else softmax_grid}
    rows, built = [], {}   # inputs per size, built for the sizes a grid asks for, once
    for stage, grid in grids.items():
        for values in grid:
            tiling = Tiling(**dict(zip(tuning.STAGE_FIELDS[stage], values)))
            where = tuning.STAGE_SIZE[stage]
            if where not in built:
                built[where] = tuning.stage_inputs(stage, sizes)
            for feature, (args, options) in built[where].items():
                row = {"stage": stage, "feature": feature, "tiling": dataclasses.asdict(tiling)}
                with tempfile.TemporaryDirectory(prefix="flurka-aot-") as dump:
                    try:
                        compile_for(tuning.stage_step(stage, tiling, options), args, device, dump)
                        row.update(status="ok", kernels=kernel_report(dump))
                    except Exception as exc:  # noqa: BLE001 - e.g. shared memory: a result
                        row.update(_failure(exc))
                rows.append(row)
                print(brief(row), flush=True)
    return rows


def open_target(config: str) -> tuple[dict[str, Any], Any]:
    """(the card's facts, a compile-only device) for ``config``; this process's own arrays stay
    on the host CPU (the card is only a target)."""
    jax.config.update("jax_platforms", "cpu")
    return target_facts(config), target_device(config)


def document(card: dict[str, Any], **extra) -> dict[str, Any]:
    """An empty ``flurka.aot/1`` document for ``card``."""
    return {"schema": "flurka.aot/1", "target": card, "versions": versions(), "ptxas": ptxas(),
            **extra, "results": []}


def compile_points(doc: dict[str, Any], labelled, device, out: str,
                   bandwidth: float | None = None) -> None:
    """:func:`compile_point` for each (labels, point), in order, with the document's
    ``xla_options``: each row (its labels first) appended to ``doc``, printed, and ``out``
    rewritten, so an interrupted run keeps its rows. With the card's measured copy
    ``bandwidth`` (bytes/s) a row also gets ``traffic_s``."""
    for labels, point in labelled:
        row = {**labels, **compile_point(point, device, doc["target"]["memory_bytes"],
                                         doc.get("xla_options"))}
        if bandwidth and "bytes" in row.get("traffic", {}):
            row["traffic_s"] = row["traffic"]["bytes"] / bandwidth
        doc["results"].append(row)
        print(brief(row), flush=True)
        write_json(doc, out)


MEASURED = ("index", "sweep", "median_s", "floor_s", "compute_floor_s", "bound", "ratio_to_floor")


def _recorded(path: str) -> dict[str, Any]:
    """The timed rows of a flurka.speed/1 document as (their measured fields, Point), and the
    card's measured copy bandwidth (``bandwidth``, bytes/s; None if it holds no ceilings)."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != "flurka.speed/1":
        raise ValueError(f"{path} is not a flurka.speed/1 document")
    fields = Point.__dataclass_fields__
    rows = [r for r in doc["results"] if r.get("status") == "ok"]
    ceilings = [c for c in (doc.get("ceilings") or {}).values() if c]
    return {"device": doc.get("device"), "versions": doc.get("versions"),
            "bandwidth": ceilings[0]["copy_bytes_per_s"] if ceilings else None,
            "points": [({k: r[k] for k in MEASURED if k in r},
                        Point(**{k: r[k] for k in fields if k in r})) for r in rows]}


def brief(row: dict) -> str:
    keys = ("sweep", "index", "stage", "feature", "mechanism", "mode", "seq_len", "align", "fused",
            "fused_projections", "fused_ffn",
            "pad_to", "tiling")
    head = " ".join(f"{k}={v}" for k, v in row.items() if k in keys)
    if row["status"] == "error":
        return f"{head}: error {row.get('error', '')[:200]}"
    kernels = "; ".join(f"{k['kernel']} {k.get('mma')}, {k.get('registers', '?')} regs, "
                        f"{k.get('spill_store_bytes', '?')} B spilled, "
                        f"{k['shared_memory_bytes']} B smem" for k in row.get("kernels", []))
    peak = row.get("memory", {}).get("peak_bytes")
    traffic = row.get("traffic", {}).get("bytes")
    timed = (f"; measured {row['median_s'] * 1e3:.2f} ms, floor {row['floor_s'] * 1e3:.2f} ms"
             if row.get("median_s") and row.get("floor_s") else "")
    return (f"{head}: {row['status']}" + (f", {peak / 2**30:.2f} GiB" if peak else "")
            + (f", {row['launches']} launches, traffic {traffic / 1e9:.2f} GB" if traffic else "")
            + (f" = {row['traffic_s'] * 1e3:.2f} ms" if row.get("traffic_s") else "") + timed
            + (f" [{kernels}]" if kernels else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=tuple(TARGETS), default="h100")
    parser.add_argument("--target-config", default=None,
                        help="a GpuTargetConfig text proto (overrides --target)")
    parser.add_argument("--tilings", action="store_true",
                        help="compile the fused kernels' tuning grid instead of sweep points")
    parser.add_argument("--from", dest="recorded", default=None, metavar="DOC",
                        help="compile the timed points of a recorded flurka.speed/1 document "
                             "(e.g. one a lease wrote) and set their times beside the plan's "
                             "traffic at that card's measured bandwidth")
    add_selection_arguments(parser, required=False)   # with --xla: for --from points too
    parser.add_argument("--out", default="aot.json")
    args = parser.parse_args(argv)
    if not args.tilings and not args.recorded and args.sweep is None:
        parser.error("--sweep is required (or --tilings, or --from)")
    try:
        recorded = _recorded(args.recorded) if args.recorded else None
        indices, pts = ([], []) if args.tilings or recorded else selected(args)
        config = (open(args.target_config).read() if args.target_config
                  else TARGETS[args.target])
        if args.list:
            for i, p in zip(indices, pts):
                print(i, p)
            return 0
        card, device = open_target(config)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc = document(card, xla_options=dict(args.xla))
    if args.tilings:
        doc["results"] = compile_tilings(device)
    if recorded:
        doc["recorded"] = {"path": args.recorded, "device": recorded["device"],
                           "versions": recorded["versions"]}
        compile_points(doc, recorded["points"], device, args.out, recorded["bandwidth"])
    with ffn_form(args):
        compile_points(doc, (({"index": i, "sweep": args.sweep}, p)
                             for i, p in zip(indices, pts)), device, args.out)
    write_json(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
