"""XLA's HLO text, read: a module's computations and instructions, the shapes and bytes of its
arrays, and the FLOPs of its dot products.

One reader for the two things that look into a compiled step: the FLOP check
(:func:`dot_flops`, which the exact FLOP model in :mod:`flurka.attention.flops` is tested
against) and the profile (:mod:`flurka.speed.profile`, which kinds each kernel and adds up the
traffic of XLA's plan). Plain Python on the text ``compiled.as_text()`` or
``lowered.as_text(dialect="hlo")`` gives, so a GPU module can be read on a host without one.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import NamedTuple

_COMP_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY_DIMS = re.compile(r"^[a-z]\w*\[([\d,\s]*)\]")
_ARRAY_TYPES = re.compile(r"\b(pred|bf16|f8e\w+|[fsuc]\d+)\[([\d,]*)\]")
_COMMENT = re.compile(r"/\*.*?\*/")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_CALLEE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)"
                     r"=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


class Instruction(NamedTuple):
    """One instruction line: ``name = type opcode(operands), attributes``."""
    name: str
    type: str     # 'f32[2,3]{1,0}', or a tuple type '(f32[2], s8[64])' kept whole
    opcode: str
    call: str     # 'opcode(operands), attributes'
    line: str


@dataclasses.dataclass(frozen=True)
class Module:
    computations: dict[str, list[Instruction]]
    entry: str | None   # the ENTRY computation's name (None in a text without one)


def _split_type(rest: str) -> tuple[str, str]:
    """'f32[2,3]{1,0} dot(...)' -> ('f32[2,3]{1,0}', 'dot(...)'); tuples kept whole."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return rest[: i + 1], rest[i + 1:].lstrip()
    head, _, tail = rest.partition(" ")
    return head, tail


def parse(text: str) -> Module:
    """The computations of an HLO module's text, each a list of its instructions in order."""
    comps: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = None if " = " in line else _COMP_HEADER.match(line.strip())
        if header:
            current = header.group(2)
            comps[current] = []
            if header.group(1):
                entry = current
            continue
        if current is None:
            continue
        if line.strip() == "}":
            current = None
            continue
        instr = _INSTR.match(line)
        if instr:
            type_, call = _split_type(instr.group(2))
            opcode = call.partition("(")[0].strip()
            comps[current].append(Instruction(instr.group(1), type_, opcode, call, line))
    return Module(comps, entry)


def dims(type_: str) -> tuple[int, ...] | None:
    """The dimensions of an array type ('f32[2,3]{1,0}' -> (2, 3)); None for anything else."""
    m = _ARRAY_DIMS.match(type_)
    if m is None:
        return None
    return tuple(int(x) for x in m.group(1).replace(" ", "").split(",") if x)


def nbytes(type_: str) -> int:
    """Bytes of the arrays in an HLO type (an array or a tuple of them)."""
    total = 0
    for dtype, shape in _ARRAY_TYPES.findall(type_):
        bits = 8 if dtype == "pred" or dtype.startswith("f8") else int(dtype.lstrip("bfsuc"))
        total += -(-math.prod(int(d) for d in shape.split(",") if d) * bits // 8)
    return total


def custom_call_target(call: str) -> str:
    """A custom-call's target, lower-cased ('' when there is none)."""
    found = _TARGET.search(call)
    return found.group(1).lower() if found else ""


def operand_names(call: str) -> list[str]:
    """Operand names of 'op(a, b), attrs' (handles '%a', 'a', 'f32[..]{..} %a' and
    '/*index=5*/%a' forms)."""
    depth, start, names = 0, call.find("(") + 1, []
    for i in range(start, len(call)):
        ch = call[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:  # the operand list's closing paren
                names.append(call[start:i])
                break
            depth -= 1
        elif ch == "," and depth == 0:
            names.append(call[start:i])
            start = i + 1
    names = [_COMMENT.sub("", n) for n in names]    # XLA marks every fifth: /*index=5*/%p
    return [n.split()[-1].lstrip("%") for n in names if n.strip()]


def _int_list(attrs: str, key: str) -> tuple[int, ...]:
    m = re.search(rf"\b{key}=\{{([\d,\s]*)\}}", attrs)
    return tuple(int(x) for x in m.group(1).replace(" ", "").split(",") if x) if m else ()


def _gemm_contracting(call: str) -> tuple[int, ...] | None:
    """lhs contracting dims of a GPU library GEMM custom-call (cuBLAS/cuBLASLt), whose
    backend_config carries the dot's dimension numbers; None for other custom-calls."""
    m = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', call)
    return None if m is None else tuple(int(x) for x in re.findall(r"\d+", m.group(1)))


def _operand_types(lhs: str, rhs: str) -> str:
    """'bf16' when both dot operands are bf16, 'bf16×f32' when they differ (XLA then computes in
    the wider type)."""
    a, b = (s.partition("[")[0] for s in (lhs, rhs))
    return a if a == b else "×".join(sorted((a, b)))


def _own_dot_flops(instrs: list[Instruction]) -> collections.Counter:
    types = {i.name: i.type for i in instrs}
    total: collections.Counter = collections.Counter()
    for i in instrs:
        gemm = None
        if i.opcode == "custom-call":
            target = custom_call_target(i.call)
            if "fmha" in target or "attention" in target:
                raise ValueError("fused attention custom-call (cuDNN flash) has no dot to count; "
                                 "use flops.forward_flops('flash', shape) instead")
            if "triton" in target or "mosaic" in target:
                raise ValueError("Pallas kernel custom-call (fused query side) has no dot to "
                                 "count; use the FLOP model instead")
            if "gemm" in target or "matmul" in target:
                gemm = _gemm_contracting(i.call)
            if gemm is None:
                continue
        if i.opcode not in ("dot", "convolution", "custom-call"):
            continue
        out = dims(i.type.lstrip("("))  # a GEMM custom-call returns (result, workspace)
        ops = operand_names(i.call)
        if out is None or len(ops) < 2:
            raise ValueError(f"cannot read operands of: {i.opcode} {i.call[:120]}")
        lhs_type, rhs_type = types.get(ops[0], ""), types.get(ops[1], "")
        lhs, rhs = dims(lhs_type), dims(rhs_type)
        if lhs is None or rhs is None:
            raise ValueError(f"unknown operand shape in: {i.call[:120]}")
        if i.opcode == "dot":
            contracted = math.prod(lhs[d] for d in _int_list(i.call, "lhs_contracting_dims"))
        elif i.opcode == "custom-call":
            contracted = math.prod(lhs[d] for d in gemm)
        else:  # each output element: prod(kernel dims but the output-feature one) MACs
            labels = re.search(r"dim_labels=\w+_(\w+)->", i.call)
            if labels is None:
                raise ValueError(f"convolution without dim_labels: {i.call[:120]}")
            contracted = math.prod(d for d, c in zip(rhs, labels.group(1)) if c != "o")
        total[_operand_types(lhs_type, rhs_type)] += 2 * math.prod(out) * contracted
    return total


def dot_flops_by_type(hlo_text: str) -> dict[str, int]:
    """:func:`dot_flops` split by the dots' operand element types ({"bf16": …, "f32": …}; mixed
    operands as "bf16×f32"). Read from the *unoptimised* HLO it shows what the program asks the
    matrix units for: a bf16 step's f32 share runs as float32 GEMMs (TF32 at best)."""
    module = parse(hlo_text)
    if module.entry is None:
        raise ValueError("no ENTRY computation in the HLO text (pass compiled.as_text())")
    comps = module.computations
    memo: dict[str, collections.Counter] = {}

    def total(comp: str) -> collections.Counter:
        if comp in memo:
            return memo[comp]
        flops = _own_dot_flops(comps[comp])
        for i in comps[comp]:
            callees = [c for _, c in _CALLEE.findall(i.call)]
            branches = _BRANCHES.search(i.call)
            if branches:
                callees += re.findall(r"%?([\w.\-]+)", branches.group(1))
            for callee in callees:
                if callee not in comps:
                    continue
                sub = total(callee)
                if i.opcode == "while" and re.search(rf"body=%?{re.escape(callee)}\b", i.call) and sub:
                    trip = _TRIP.search(i.call)
                    if trip is None:
                        raise ValueError("while loop with dot products and no known trip count")
                    sub = collections.Counter({k: v * int(trip.group(1)) for k, v in sub.items()})
                flops = flops + sub
        memo[comp] = flops
        return flops

    return dict(total(module.entry))


def dot_flops(hlo_text: str) -> int:
    """FLOPs of every dot / convolution in an HLO module's text (``compiled.as_text()``).

    A dot counts 2 · prod(output dims) · prod(contracting dims); a convolution
    2 · prod(output dims) · prod(kernel dims except output features) (padding not subtracted);
    a GPU GEMM custom-call (cuBLAS, from its dot_dimension_numbers) like a dot. A fused-attention
    custom-call (cuDNN flash) or a Pallas kernel (Triton / Mosaic GPU) is an error: its FLOPs are
    not visible as dots.
    Each computation counts once per call: fusions/calls once, while bodies × their known trip
    count, conditional branches each once (an upper bound). A while loop with dots and no known
    trip count is an error rather than a silent undercount.
    """
    return sum(dot_flops_by_type(hlo_text).values())


def compiled_dot_flops(compiled) -> int:
    """:func:`dot_flops` of a ``jax.stages.Compiled`` (``jit(f).lower(...).compile()``)."""
    return dot_flops(compiled.as_text())
