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
import math
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Sequence

import jax

KINDS = ("gemm", "attention", "pallas", "reduction", "elementwise", "copy", "other")

# Lines of a device plane that the profiler derives from the kernels (they would count them twice).
_DERIVED_LINES = ("XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Launch Stats", "Source code",
                  "Framework Ops", "Framework Name Scope", "TensorFlow Name Scope", "Async XLA Ops")
_COMMAND_BUFFER = "command_buffer"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s([a-z][a-z0-9\-]*)\(")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_ELEMENTWISE_OPS = {"add", "multiply", "subtract", "divide", "exponential", "select", "convert",
                    "maximum", "minimum", "negate", "tanh", "sine", "cosine", "rsqrt", "sqrt", "log",
                    "compare", "power", "abs", "and", "or", "clamp", "erf", "logistic"}
_COPY_OPS = {"copy", "transpose", "bitcast", "parameter", "constant", "tuple", "get-tuple-element",
             "reshape", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad",
             "broadcast", "copy-start", "copy-done"}


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(computation name -> its instruction lines, instruction name -> its line)."""
    bodies: dict[str, list[str]] = {}
    lines: dict[str, str] = {}
    current: list[str] | None = None
    for line in hlo_text.splitlines():
        stripped = line.strip()
        if current is None:
            if stripped.endswith("{") and " = " not in stripped and "(" in stripped:
                name = stripped.removeprefix("ENTRY ").split()[0].lstrip("%")
                current = bodies.setdefault(name, [])
            continue
        if stripped == "}":
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if match:
            current.append(line)
            lines[match.group(1)] = line
    return bodies, lines


def _opcodes(body: Sequence[str]) -> set[str]:
    out = set()
    for line in body:
        match = _OPCODE.search(_INSTRUCTION.match(line).group(2))
        if match:
            out.add(match.group(1))
    return out


def classify(line: str, bodies: dict[str, list[str]]) -> str:
    """The kind (one of :data:`KINDS`) of one optimised-HLO instruction ``line``: a custom call
    by its target, a fusion by what its computation does."""
    rest = _INSTRUCTION.match(line).group(2)
    match = _OPCODE.search(rest)
    opcode = match.group(1) if match else ""
    if opcode == "custom-call":
        found = _TARGET.search(rest)
        target = found.group(1).lower() if found else ""
        if "cudnn" in target and any(w in target for w in ("fmha", "attention", "sdpa")):
            return "attention"
        if any(w in target for w in ("triton", "mosaic", "pallas")):
            return "pallas"
        if any(w in target for w in ("gemm", "cublas", "matmul", "conv")):
            return "gemm"
        return "other"
    called = _CALLS.search(rest)
    ops = _opcodes(bodies.get(called.group(1), ())) if called else set()
    ops.add(opcode)
    if ops & {"dot", "convolution"}:
        return "gemm"
    if ops & {"reduce", "reduce-window", "scatter", "sort"}:
        return "reduction"
    if ops <= _COPY_OPS | {"fusion"}:
        return "copy"
    return "elementwise" if opcode == "fusion" or ops & _ELEMENTWISE_OPS else "other"


def op_kinds(hlo_text: str) -> dict[str, str]:
    """Instruction name -> kind, for every instruction of an optimised HLO module's text; each
    also under its kernel's spelling (XLA names a fusion's kernel after it, '.' and '-' as '_':
    ``gemm_fusion_dot.16`` runs as ``gemm_fusion_dot_16``), which is all a command buffer's trace
    says (:func:`op_times`)."""
    bodies, lines = _computations(hlo_text)
    kinds = {name: classify(line, bodies) for name, line in lines.items()}
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


_ARRAY = re.compile(r"\b(pred|bf16|f8e\w+|[fsuc]\d+)\[([\d,]*)\]")
_FREE = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "after-all",
         "opt-barrier"}   # no kernel, no traffic


def _nbytes(type_text: str) -> int:
    """Bytes of the arrays in an HLO type (an array or a tuple of them)."""
    total = 0
    for dtype, dims in _ARRAY.findall(type_text):
        bits = 8 if dtype == "pred" or dtype.startswith("f8") else int(dtype.lstrip("bfsuc"))
        total += -(-math.prod(int(d) for d in dims.split(",") if d) * bits // 8)
    return total


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced HLO: {text[:200]}")


def planned_traffic(hlo_text: str, top: int = 10) -> dict[str, Any]:
    """The memory traffic of XLA's plan for a step (its optimised HLO's entry computation): each
    kernel reading its operands and writing its results once — no cache reuse, whole operands
    even where a kernel reads a slice — in all and by kind (:func:`op_kinds`).
    Over the card's bandwidth, the time the plan's traffic alone takes; ``largest``: the ``top``
    kernels by traffic, with the JAX operation each came from."""
    bodies, _ = _computations(hlo_text)
    entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo_text, re.M).group(1)
    kinds = op_kinds(hlo_text)
    sizes: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    kernels: list[dict[str, Any]] = []
    for line in bodies[entry]:
        name, rest = _INSTRUCTION.match(line).groups()
        end = _closing(rest, 0) + 1 if rest.startswith("(") else rest.index(" ")
        type_text, call = rest[:end], rest[end:].lstrip()
        opcode, open_paren = call[:call.index("(")], call.index("(")
        operands = call[open_paren:_closing(call, open_paren) + 1]
        sizes[name] = _nbytes(type_text)
        if opcode in _FREE:
            continue
        moved = sizes[name] + sum(sizes.get(o, 0) for o in re.findall(r"%([\w.\-]+)", operands))
        kind = kinds.get(name, "other")
        by_kind[kind] = by_kind.get(kind, 0) + moved
        source = re.search(r'op_name="([^"]*)"', line)
        kernels.append({"op": name, "kind": kind, "bytes": moved,
                        "source": source.group(1) if source else None})
    kernels.sort(key=lambda k: -k["bytes"])
    return {"bytes": sum(by_kind.values()), "by_kind": by_kind, "largest": kernels[:top]}
