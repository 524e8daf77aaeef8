"""Where a step's device time goes: a traced run of a compiled step, per XLA op and per kind.

Timing (:mod:`flurka.speed.timing`) says how long a step takes and the floor how long it could;
when the two are far apart this says which kernels take the time — GEMMs at odd shapes,
elementwise and reduction passes (memory traffic the floor leaves out), the Pallas kernel,
cuDNN attention — the "what the profile showed" of a missed target. JAX alone, so it runs on the
GPU machine as it is: ``jax.profiler.trace`` writes the XSpace, ``jax.profiler.ProfileData``
reads it back, and the executable's optimised HLO says what each traced op is.

Events are the ones carrying an ``hlo_op`` stat: on a GPU the kernels on the device plane's
stream lines (a cuBLAS GEMM may be several kernels: one op), on a CPU the thunks the runtime
executes (ops split over threads count once per thread, so a CPU's per-step total can exceed its
wall time; shares stay meaningful).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Sequence

import jax

from flurka import hlo

KINDS = ("gemm", "attention", "pallas", "reduction", "elementwise", "copy", "other")

# Lines of a device plane that the profiler derives from the kernels (they would count them twice).
_DERIVED_LINES = ("XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Launch Stats", "Source code",
                  "Framework Ops", "Framework Name Scope", "TensorFlow Name Scope", "Async XLA Ops")
_COMMAND_BUFFER = "command_buffer"
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_ELEMENTWISE_OPS = {"add", "multiply", "subtract", "divide", "exponential", "select", "convert",
                    "maximum", "minimum", "negate", "tanh", "sine", "cosine", "rsqrt", "sqrt", "log",
                    "compare", "power", "abs", "and", "or", "clamp", "erf", "logistic"}
_COPY_OPS = {"copy", "transpose", "bitcast", "parameter", "constant", "tuple", "get-tuple-element",
             "reshape", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad",
             "broadcast", "copy-start", "copy-done"}


def classify(instr: hlo.Instruction, computations: dict[str, list[hlo.Instruction]]) -> str:
    """The kind (one of :data:`KINDS`) of one optimised-HLO instruction: a custom call by its
    target, a fusion by what its computation does."""
    if instr.opcode == "custom-call":
        target = hlo.custom_call_target(instr.call)
        if "cudnn" in target and any(w in target for w in ("fmha", "attention", "sdpa")):
            return "attention"
        if any(w in target for w in ("triton", "mosaic", "pallas")):
            return "pallas"
        if any(w in target for w in ("gemm", "cublas", "matmul", "conv")):
            return "gemm"
        return "other"
    called = _CALLS.search(instr.call)
    ops = {i.opcode for i in computations.get(called.group(1), ())} if called else set()
    ops.add(instr.opcode)
    if ops & {"dot", "convolution"}:
        return "gemm"
    if ops & {"reduce", "reduce-window", "scatter", "sort"}:
        return "reduction"
    if ops <= _COPY_OPS | {"fusion"}:
        return "copy"
    return "elementwise" if instr.opcode == "fusion" or ops & _ELEMENTWISE_OPS else "other"


def op_kinds(hlo_text: str) -> dict[str, str]:
    """Instruction name -> kind, for every instruction of an optimised HLO module's text; each
    also under its kernel's spelling (XLA names a fusion's kernel after it, '.' and '-' as '_':
    ``gemm_fusion_dot.16`` runs as ``gemm_fusion_dot_16``), which is all a command buffer's trace
    says (:func:`op_times`)."""
    return _op_kinds(hlo.parse(hlo_text))


def _op_kinds(module: hlo.Module) -> dict[str, str]:
    comps = module.computations
    kinds = {i.name: classify(i, comps) for body in comps.values() for i in body}
    return {**{re.sub(r"[.\-]", "_", name): kind for name, kind in kinds.items()}, **kinds}


def kernel_kind(name: str) -> str:
    """A kind from a kernel's own name, for device events no HLO op claims (the trace lacked the
    annotation): cuBLAS/CUTLASS GEMMs, cuDNN attention, our Pallas kernels, XLA's fusions."""
    name = name.lower()
    for kind, words in (("attention", ("fmha", "flash", "cudnn")), ("pallas", ("flurka_",)),
                        ("gemm", ("gemm", "cutlass", "xmma", "cublas", "matmul", "wgmma")),
                        ("reduction", ("reduce", "reduction")), ("copy", ("transpose", "copy")),
                        ("elementwise", ("fusion", "elementwise", "loop_"))):
        if any(w in name for w in words):
            return kind
    return "other"


def op_times(profile: Any) -> tuple[dict[str, dict[str, Any]], str]:
    """(hlo_op -> {"ns": total duration, "events": count, "kernels": names}, "device" or "host"):
    GPU device planes when there are any (their stream lines), else the host's thread lines — on a
    GPU that means the device was not traced (no CUPTI) and the times are launches, hence the
    source. A device event without an ``hlo_op`` stat counts under ``kernel:<its name>``; one whose
    ``hlo_op`` is a command buffer (XLA replays a step's kernels as one CUDA graph, and the trace
    names the graph for each of them) under its own name, which for XLA's fusions is the op's."""
    devices = [p for p in profile.planes if p.name.startswith("/device:")]
    planes = devices or [p for p in profile.planes if p.name.startswith("/host:")]
    out: dict[str, dict[str, Any]] = {}
    for plane in planes:
        lines = [ln for ln in plane.lines if ln.name not in _DERIVED_LINES]
        streams = [ln for ln in lines if ln.name.startswith("Stream")]
        for line in streams or lines:
            for event in line.events:
                op = dict(event.stats).get("hlo_op")
                if op is None and devices:
                    op = f"kernel:{event.name}"
                elif str(op).startswith(_COMMAND_BUFFER):
                    op = event.name
                if op is None:
                    continue
                row = out.setdefault(str(op), {"ns": 0.0, "events": 0, "kernels": set()})
                row["ns"] += float(event.duration_ns)
                row["events"] += 1
                row["kernels"].add(event.name)
    return out, "device" if devices else "host"


def summarize(times: dict[str, dict[str, Any]], kinds: dict[str, str], *, steps: int,
              top: int = 12, source: str = "device") -> dict[str, Any]:
    """Per step: total traced time, time and share by kind, and the ``top`` ops; ``source``: what
    was traced (device kernels, or host-side thunks)."""
    total = sum(r["ns"] for r in times.values())
    kinds = {op: kinds.get(op) or kernel_kind(op.removeprefix("kernel:")) for op in times}
    by_kind = collections.Counter()
    for op, r in times.items():
        by_kind[kinds[op]] += r["ns"]
    ops = sorted(times.items(), key=lambda kv: -kv[1]["ns"])[:top]
    share = (lambda ns: ns / total) if total else (lambda ns: 0.0)
    return {
        "steps": steps,
        "source": source,
        "traced_s_per_step": total / steps * 1e-9,
        "ops": len(times),
        "by_kind": {k: {"s_per_step": by_kind[k] / steps * 1e-9, "share": share(by_kind[k])}
                    for k in KINDS if by_kind[k]},
        "top_ops": [{"op": op, "kind": kinds[op], "events_per_step": r["events"] / steps,
                     "s_per_step": r["ns"] / steps * 1e-9, "share": share(r["ns"]),
                     "kernels": sorted(r["kernels"])[:3]} for op, r in ops],
    }


def profile_compiled(compiled: Callable, args: Sequence[Any], *, steps: int = 3,
                     top: int = 12) -> dict[str, Any]:
    """Run ``compiled(*args)`` ``steps`` times under the profiler (after one untraced call) and
    summarise where the time went (:func:`summarize`)."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"profile steps must be an int >= 1, got {steps!r}")
    jax.block_until_ready(compiled(*args))
    trace_dir = tempfile.mkdtemp(prefix="flurka-profile-")
    try:
        with jax.profiler.trace(trace_dir):
            for _ in range(steps):
                jax.block_until_ready(compiled(*args))
        (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
        times, source = op_times(jax.profiler.ProfileData.from_file(path))
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    return summarize(times, op_kinds(compiled.as_text()), steps=steps, top=top, source=source)


def brief(summary: dict[str, Any] | None) -> str:
    """One line for a progress log: "gemm 62%, elementwise 29%, ..." (or the trace's error)."""
    if not summary:
        return ""
    if "error" in summary:
        return f"profile failed: {summary['error'][:120]}"
    kinds = sorted(summary["by_kind"].items(), key=lambda kv: -kv[1]["share"])
    host = " (host-side trace)" if summary.get("source") == "host" else ""
    return ", ".join(f"{k} {v['share']:.0%}" for k, v in kinds) + host


_FREE = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "after-all",
         "opt-barrier"}   # no kernel, no traffic


def planned_traffic(hlo_text: str, top: int = 10) -> dict[str, Any]:
    """The memory traffic of XLA's plan for a step (its optimised HLO's entry computation): each
    kernel reading its operands and writing its results once — no cache reuse, whole operands
    even where a kernel reads a slice — in all and by kind (:func:`op_kinds`).
    Over the card's bandwidth, the time the plan's traffic alone takes; ``largest``: the ``top``
    kernels by traffic, with the JAX operation each came from."""
    module = hlo.parse(hlo_text)
    kinds = _op_kinds(module)
    sizes: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    kernels: list[dict[str, Any]] = []
    for instr in module.computations[module.entry]:
        sizes[instr.name] = hlo.nbytes(instr.type)
        if instr.opcode in _FREE:
            continue
        moved = sizes[instr.name] + sum(sizes.get(o, 0) for o in hlo.operand_names(instr.call))
        kind = kinds.get(instr.name, "other")
        by_kind[kind] = by_kind.get(kind, 0) + moved
        source = re.search(r'op_name="([^"]*)"', instr.line)
        kernels.append({"op": instr.name, "kind": kind, "bytes": moved,
                        "source": source.group(1) if source else None})
    kernels.sort(key=lambda k: -k["bytes"])
    return {"bytes": sum(by_kind.values()), "by_kind": by_kind, "largest": kernels[:top]}
