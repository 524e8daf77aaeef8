"""One GPU lease, one call: correctness on the card first, then the issue's speed targets in
priority order (``--tune-fused`` tunes the fused kernels' launch shape just before the first
fused point, not ahead of the XLA ones), each sweep's JSON rewritten after every point
(``flurka.speed/1`` schema, so ``flurka ingest`` takes the files as they are).

    python benchmarks/gpu_session.py --out DIR --budget-s 420 --plan h100-second

The plans are data, ``benchmarks/plans.toml`` (what each lease measures, in order); this file
runs one.

JAX alone (no Ray, MLflow, SQL). Leases are short, so the plan is ordered by what the issue asks
first: the N = 55.5k comparison (forward, then train), flash vs FLuRKA at N = 52.5k, the claims'
regime boundary at N = 7050, then the rest of the figures' points; no new point starts after
``--budget-s``. ``check.json`` holds every mechanism's output on this card against the same layer
run on the host CPU in float32 (true float32 matmuls, not TF32; and cuDNN flash in bf16 against CPU float32 full attention).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flurka.attention import (
    ALIGNABLE, FUSABLE, MECHANISMS, PROJECTABLE, make_attention)
from flurka.kernels.query_side import Tiling, use_tiling
from flurka.catalogue.mechanisms import COMPRESSED, FLURKA
from flurka.kernels.compress import CompressTiling, use_compress_tiling
from flurka.kernels.ffn import FfnTiling, fused_ffn_block, reference_ffn_block, use_ffn_tiling
from flurka.speed import aot
from flurka.speed.bench import freeze_survivors
from flurka.speed.ceilings import product_rate
from flurka.speed.configs import Point, points
from flurka.speed.profile import brief
from flurka.speed.runner import (device_info, document, measured_ceilings, run_one, versions,
                                 write_json)
from flurka.speed.tuning import tune_compression, tune_ffn, tune_fused
from flurka.theory import cli as theory_cli

# Within a block: the paper's subjects first, the quadratic baselines (slow, memory-hungry) last.
ORDER = ("flurka-performer", "flurka-rnn", "linformer", "performer", "rnn", "flurka-eva", "eva",
         "full", "flash")

# --check-fused checks these with the LayerNorm handed over whatever --check names: each has
# gradient kernels of its own (the training step's) that only a card compiles. They are the
# projected FLuRKA variants (PROJECTABLE): flurka-eva's query side has no projected kernel.
HANDED_OVER = ("flurka-performer", "flurka-rnn")

PLANS_FILE = Path(__file__).with_name("plans.toml")


def load_plans(path: Path = PLANS_FILE) -> tuple[dict[str, list[tuple[str, dict]]], dict[str, tuple]]:
    """The plans and probes of ``path`` (``benchmarks/plans.toml``): each plan a list of (sweep,
    {field: set of values kept}) blocks, as :func:`planned` takes them; each probe (lhs shape,
    rhs shape)."""
    raw = tomllib.loads(path.read_text())
    groups = {"flurka": set(FLURKA), "fusable": set(FUSABLE), "projectable": set(PROJECTABLE),
              **{name: set(members) for name, members in raw["groups"].items()}}

    def block(entry) -> tuple[str, dict]:
        entry = dict(raw["blocks"][entry] if isinstance(entry, str) else entry)
        sweep = entry.pop("sweep")
        where = {k: {tuple(o.items()) for o in v} if k == "xla"
                 else set(groups[v] if isinstance(v, str) else v) for k, v in entry.items()}
        unprojectable = where.get("mechanism", set()) - set(PROJECTABLE)
        if True in where.get("fused_projections", ()) and unprojectable:
            raise ValueError(f"{path.name}: a block asks for fused_projections of "
                             f"{', '.join(sorted(unprojectable))}, which have no projected "
                             f"kernel (valid: {', '.join(PROJECTABLE)}): {entry}")
        return sweep, where

    plans = {name: [block(e) for e in entries] for name, entries in raw["plans"].items()}
    probes = {name: (tuple(a), tuple(b)) for name, (a, b) in raw["probes"].items()}
    return plans, probes


PLANS, SHAPE_PROBES = load_plans()


def shape_probes(probes: dict = SHAPE_PROBES, repeats: int = 10, chain: int = 10) -> list[dict]:
    """Achieved FLOP/s of each product in ``probes`` (bf16 operands unless the name says f32),
    ``chain`` products per timed call (:func:`flurka.speed.ceilings.product_rate`): the third
    lease timed one per call, so its probes under ~0.3 ms carry ~50 µs of dispatch each."""
    rows = []
    for name, (sa, sb) in probes.items():
        dtype = jnp.float32 if " f32 " in name else jnp.bfloat16
        rate = product_rate(sa, sb, dtype, chain=chain, repeats=repeats)
        rows.append({"probe": name, **rate})
        print(f"probe {name}: {rate['median_s'] * 1e3:.3f} ms, "
              f"{rate['flops_per_s'] / 1e12:.0f} TFLOP/s", flush=True)
    return rows

def planned(sweep: str, where: dict) -> list[tuple[int, Point]]:
    """(index in the sweep's full point list, point) of one block, in :data:`ORDER`. A block
    whose ``align`` is {a} (``fused``, ``fused_projections``, ``fused_ffn`` {True}, ``dtype``
    {t}, ``pad_to`` {p}, ``xla`` {options}) takes the points of ``points(sweep, align=a)``
    (``fused=True`` ..., ``dtype=t``, ``pad_to=p``, ``xla=options``) that really run aligned
    (fused)."""
    align = max(where.get("align", {1}))
    fused = True in where.get("fused", {False})
    fused_ffn = True in where.get("fused_ffn", {False})
    fused_projections = True in where.get("fused_projections", {False})
    (dtype,) = where.get("dtype", {None})
    pad_to = max(where.get("pad_to", {1}))
    (xla,) = where.get("xla", {()})
    chosen = [(i, p) for i, p in enumerate(points(sweep, align=align, fused=fused, dtype=dtype,
                                                  pad_to=pad_to, xla=xla, fused_ffn=fused_ffn,
                                                  fused_projections=fused_projections))
              if all(getattr(p, k) in v for k, v in where.items())]
    return sorted(chosen, key=lambda ip: (ORDER.index(ip[1].mechanism), ip[1].seq_len))

def check_on_card(seq_len: int = 512, d_model: int = 256, num_heads: int = 4,
                  mechanisms=MECHANISMS, align: int = 1, fused: bool = False,
                  handed_over=()) -> list[dict]:
    """Relative error of each mechanism on the default device vs the same layer on the CPU
    (flash in bf16 with both padding modes; the mask is right-padded so both are exact). With
    ``align`` > 1 the alignable mechanisms are also checked aligned (at d_model - 8, so every
    dimension is padded) against the unaligned layer on the CPU; with ``fused`` the kernel
    mechanisms run their Pallas query side (float32 and bf16; m = 64) against the
    XLA layer on the CPU — on a GPU that compiles and runs the Triton kernels — and once more in
    bf16 at the N-sweep's width (one head, d_h = m = 325: the forward kernel in 128-wide blocks).
    Aligned and fused rows also hold ``grad_rel_err``: their parameter gradients (for fused: the
    backward kernel) against the CPU layer's. ``handed_over``: projected low-rank mechanisms
    checked with the block's LayerNorm handed over (float32) even where ``mechanisms`` leaves
    them out — the training steps' gradient kernels, every one of them on the card."""
    cpu = jax.devices("cpu")[0]
    x = jax.random.normal(jax.random.key(7), (2, seq_len, max(d_model, WIDE["d_model"])),
                          jnp.float32)
    mask = jnp.arange(seq_len)[None, :] < jnp.array([[seq_len], [seq_len - 100]])
    rows = []
    cases = [(m, "float32", {}) for m in mechanisms]
    if "flash" in mechanisms:
        cases += [("flash", "bfloat16", {"padding": p}) for p in ("any", "right")]
    if align > 1:
        cases += [(m, "float32", {"align": align}) for m in mechanisms if m in ALIGNABLE]
    if fused:
        cases += [(m, d, {"fused": True}) for m in mechanisms if m in FUSABLE
                  for d in ("float32", "bfloat16")]
        cases += [(m, "bfloat16", {"fused": True, **WIDE}) for m in mechanisms if m in FUSABLE]
        cases += [(m, d, {"fused": True, "fused_projections": True, "d_model": 256})
                  for m in mechanisms if m in PROJECTABLE for d in ("float32", "bfloat16")]
        # ... and the low-rank ones handed the block's LayerNorm (fused into their kernels)
        cases += [(m, d, {"fused": True, "fused_projections": True, "d_model": 256,
                          "norm": True})
                  for m in mechanisms if m in PROJECTABLE and m in COMPRESSED
                  for d in ("float32", "bfloat16")]
        cases += [(m, "float32", {"fused": True, "fused_projections": True, "d_model": 256,
                                  "norm": True})
                  for m in handed_over if m not in mechanisms]
    for mech, dtype, extra in cases:
        t0 = time.monotonic()
        try:
            shape = {k: v for k, v in extra.items() if k in WIDE}
            options = {k: v for k, v in extra.items() if k not in WIDE and k != "norm"}
            width = shape.get("d_model", d_model - 8 if "align" in extra else d_model)
            sizes = dict(d_model=width, num_heads=shape.get("num_heads", num_heads),
                         max_len=seq_len)
            kernel = dict(d_k=min(128, seq_len // 2) - 4,
                          num_features=shape.get("num_features", 64 if fused else 60))
            layer = make_attention(mech, **sizes, **kernel, rngs=nnx.Rngs(0),
                                   dtype=jnp.dtype(dtype), **options)
            norm = _layer_norm(width) if extra.get("norm") else None
            graphdef, state = nnx.split((layer, norm))

            def apply(state, x, mask, graphdef=graphdef):
                layer, norm = nnx.merge(graphdef, state)
                out = layer(x, mask=mask) if norm is None else layer.fused_block(x, mask, norm=norm)
                return out.astype(jnp.float32)

            got = np.asarray(jax.jit(apply)(state, x[..., :width].astype(dtype), mask))
            ref_mech = "full" if mech == "flash" else mech
            ref_layer = (make_attention("full", **sizes, rngs=nnx.Rngs(0)) if mech == "flash"
                         else make_attention(mech, **sizes, **kernel, rngs=nnx.Rngs(0))
                         if extra else layer)
            rg, rs = nnx.split((ref_layer, norm))

            def reference(state, x, mask, graphdef=rg):
                layer, norm = nnx.merge(graphdef, state)
                return layer(x if norm is None else norm(x), mask=mask)

            with jax.default_device(cpu):
                ref = np.asarray(jax.jit(reference)(
                    jax.device_put(rs, cpu), jax.device_put(x[..., :width], cpu),
                    jax.device_put(mask, cpu)))
            keep = np.asarray(mask)[..., None]
            err = float(np.linalg.norm((got - ref) * keep) / np.linalg.norm(ref * keep))
            rows.append({"mechanism": mech, "dtype": dtype, **extra,
                         "reference": f"{ref_mech} cpu f32",
                         "implementation": getattr(layer, "implementation", None),
                         "rel_err": err, "finite": bool(np.isfinite(got).all())})
            if extra and mech != "flash":  # aligned / fused (the LayerNorm's too): gradients
                rows[-1]["grad_rel_err"] = _grad_error(layer, ref_layer, x[..., :width], mask,
                                                       dtype, cpu, norm)
        except Exception as exc:  # noqa: BLE001 - a failed check is a result
            rows.append({"mechanism": mech, "dtype": dtype, **extra,
                         "error": repr(exc)[:500]})
        print(f"check ({time.monotonic() - t0:.1f} s)", rows[-1], flush=True)
    return rows

def check_ffn_on_card(seq_len: int = 1000, d_model: int = 512, d_ff: int = 512) -> list[dict]:
    """The fused FFN block (:mod:`flurka.kernels.ffn`; on a GPU its Triton kernels, the
    gradient's too) on the default device, float32 and bf16, against the XLA path on the host
    CPU in float32, at the flash comparison's widths over a length its 128-row blocks do not
    divide: ``rel_err`` of the output, ``grad_rel_err`` of every operand's gradient."""
    cpu = jax.devices("cpu")[0]
    keys = jax.random.split(jax.random.key(11), 8)
    shapes = [(1, seq_len, d_model), (1, seq_len, d_model), (d_model,), (d_model,),
              (d_model, d_ff), (d_ff,), (d_ff, d_model), (d_model,)]
    ops = [jax.random.normal(k, s, jnp.float32) / (np.sqrt(s[0]) if len(s) == 2 else 1)
           for k, s in zip(keys, shapes)]
    def grads(block, operands):
        loss = lambda *p: jnp.sum(jnp.sin(block(*p, eps=1e-6).astype(jnp.float32)))  # noqa: E731
        return [np.asarray(g, np.float64)
                for g in jax.jit(jax.grad(loss, argnums=tuple(range(8))))(*operands)]

    with jax.default_device(cpu):
        on_cpu = jax.device_put(ops, cpu)
        ref = np.asarray(reference_ffn_block(*on_cpu, eps=1e-6))
        ref_grads = grads(reference_ffn_block, on_cpu)
    rows = []
    for dtype in ("float32", "bfloat16"):
        t0 = time.monotonic()
        try:
            operands = [o.astype(dtype) for o in ops]
            got = jax.jit(lambda *p: fused_ffn_block(*p, eps=1e-6))(*operands)
            got = np.asarray(got.astype(jnp.float32))
            rows.append({"mechanism": "fused_ffn", "dtype": dtype, "seq_len": seq_len,
                         "d_model": d_model, "d_ff": d_ff, "reference": "xla cpu f32",
                         "rel_err": float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
                         "finite": bool(np.isfinite(got).all()),
                         "grad_rel_err": _relative_error(grads(fused_ffn_block, operands),
                                                         ref_grads)})
        except Exception as exc:  # noqa: BLE001 - a failed check is a result
            rows.append({"mechanism": "fused_ffn", "dtype": dtype, "error": repr(exc)[:500]})
        print(f"check ({time.monotonic() - t0:.1f} s)", rows[-1], flush=True)
    return rows

def _layer_norm(width: int) -> nnx.LayerNorm:
    """A LayerNorm with scale and bias away from 1 and 0 (the block's, handed to a layer)."""
    norm = nnx.LayerNorm(width, rngs=nnx.Rngs(0))
    keys = jax.random.split(jax.random.key(13))
    norm.scale[...] = 1.0 + 0.3 * jax.random.normal(keys[0], (width,))
    norm.bias[...] = 0.3 * jax.random.normal(keys[1], (width,))
    return norm

# The fused check's wide case: the N-sweep's head dim and feature count on one head.
WIDE = {"d_model": 325, "num_heads": 1, "num_features": 325}

def _grad_error(layer, ref_layer, x, mask, dtype, cpu, norm=None) -> float:
    """:func:`_relative_error` of the parameter gradients of Σ sin(out) on this device against
    the reference layer's on the CPU in float32. ``norm``: the block's LayerNorm, handed over to
    ``layer`` (fused into its kernels) and applied before ``ref_layer``; its parameters' gradients
    count too."""
    def grads(modules, x, mask, hand_over):
        def loss(m):
            layer, norm = m
            if norm is None:
                out = layer(x, mask=mask)
            elif hand_over:
                out = layer.fused_block(x, mask, norm=norm)
            else:
                out = layer(norm(x), mask=mask)
            return jnp.sum(jnp.sin(out.astype(jnp.float32)) * mask[..., None])
        graphdef, state = nnx.split(modules)
        leaves = jax.tree.leaves(jax.jit(lambda s: nnx.grad(loss)(nnx.merge(graphdef, s)))(state))
        return [np.asarray(g, np.float64) for g in leaves]

    got = grads((layer, norm), x.astype(dtype), mask, True)
    with jax.default_device(cpu):
        ref = grads(jax.device_put((ref_layer, norm), cpu), jax.device_put(x, cpu),
                    jax.device_put(mask, cpu), False)
    return _relative_error(got, ref)


def _relative_error(got, ref) -> float:
    """Largest relative error (norm) over gradient leaves, each over its own norm or a
    thousandth of the whole gradient's, whichever is larger: a softmax's key bias has a zero
    gradient in exact arithmetic (a shift shared by every key's score), so only roundoff to
    compare (aligned full and linformer read 1.6 and 1.3 on the H200, 0.66 on a CPU, by their
    own norm)."""
    floor = 1e-3 * float(np.sqrt(sum(np.sum(r ** 2) for r in ref)))
    return max(float(np.linalg.norm(g - r) / max(np.linalg.norm(r), floor))
               for g, r in zip(got, ref))

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=420)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memory-budget-gb", type=float, default=None)
    parser.add_argument("--plan", choices=tuple(PLANS), default="first")
    parser.add_argument("--check", default=",".join(MECHANISMS),
                        help="mechanisms to check against the CPU first ('' for none)")
    parser.add_argument("--probes", action="store_true", help="time SHAPE_PROBES too")
    parser.add_argument("--check-align", type=int, default=1,
                        help="also check the alignable mechanisms aligned to this (e.g. 128)")
    parser.add_argument("--check-fused", action="store_true",
                        help="also check the fused (Pallas) query side of the kernel mechanisms, "
                             "the projected low-rank layers with the LayerNorm handed over "
                             "(HANDED_OVER, float32, whatever --check names) and the fused FFN "
                             "block")
    parser.add_argument("--theory-s", type=float, default=0,
                        help="keep this many seconds of the budget for the theory run at the end "
                             "(theory.json; 0 = no theory run)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="trace this many steps of every point after timing it: where the "
                             "device time went, per XLA op and kind (the row's 'profile')")
    parser.add_argument("--tune-fused", action="store_true",
                        help="before the plan's first fused point, time a grid of launch shapes "
                             "of the fused kernels at the flash comparison's size and build the "
                             "fused layers with the fastest (fused_tuning.json); before its first "
                             "fused FFN point the same for the FFN block (ffn_tuning.json), and "
                             "before its first point with fused projections for the fused "
                             "LayerNorm + compression (compress_tuning.json)")
    parser.add_argument("--tiny", action="store_true",
                        help="CPU dry run: four tiny points (one fused, one fused FFN)")
    parser.add_argument("--aot", choices=("h100", "h200"), default=None,
                        help="no card: compile the plan's points for this one instead of timing "
                             "them (aot.json: memory, fit, kernels; flurka.speed.aot, needs "
                             "PYTHONPATH=.cuda-aot)")
    args = parser.parse_args(argv)
    if args.aot:
        return compile_plan(args)
    start = time.monotonic()
    deadline = start + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    device, vers = device_info(), versions()
    print("device", device, "\nversions", vers, flush=True)

    mechanisms = [m for m in args.check.split(",") if m]
    with jax.default_matmul_precision("highest"):  # kernels' numerics, not TF32's
        opts = dict(align=args.check_align, fused=args.check_fused,
                    handed_over=() if not args.check_fused else HANDED_OVER[-1:] if args.tiny
                    else HANDED_OVER)
        check = (check_on_card(64, 64, 4, mechanisms, **opts) if args.tiny
                 else check_on_card(mechanisms=mechanisms, **opts))
        if args.check_fused:
            check += (check_ffn_on_card(100, 128, 256) if args.tiny else check_ffn_on_card())
    probes = shape_probes() if args.probes and not args.tiny else []
    write_json({"device": device, "versions": vers, "check": check, "shape_probes": probes},
               os.path.join(args.out, "check.json"))

    plan = TINY_PLAN if args.tiny else PLANS[args.plan]
    ceilings = {"bfloat16" if not args.tiny else "float32":
                measured_ceilings("bfloat16" if not args.tiny else "float32")}
    print("ceilings", {d: (c["matmul_flops_per_s"], c["copy_bytes_per_s"])
                       for d, c in ceilings.items()}, flush=True)
    budget = None if args.memory_budget_gb is None else int(args.memory_budget_gb * 2**30)
    settings = {"warmup": args.warmup, "repeats": args.repeats, "calls_per_sample": None,
                "memory_budget_bytes": budget, "runner": "local", "driver": "benchmarks/gpu_session.py",
                "fused_tiling": dataclasses.asdict(Tiling()),
                "ffn_tiling": dataclasses.asdict(FfnTiling()),
                "compress_tiling": dataclasses.asdict(CompressTiling())}
    steps = [(sweep, index, point) for sweep, where in plan for index, point in planned(sweep, where)]
    freeze_survivors()
    with contextlib.ExitStack() as stack:
        tune = tuners(args, settings, stack, device, vers) if args.tune_fused else None
        run_plan(steps, args, start, deadline, ceilings, settings, budget, device, vers, tune)
    if args.theory_s and not args.tiny:
        theory(os.path.join(args.out, "theory.json"))
    return 0

def compile_plan(args) -> int:
    """``--aot``: every point of the plan compiled for the target card on this host, in plan
    order (``aot.json``, rewritten after each): what the lease's points will need and launch."""
    os.makedirs(args.out, exist_ok=True)
    card, device = aot.open_target(aot.TARGETS[args.aot])
    doc = aot.document(card, settings={"plan": "tiny" if args.tiny else args.plan,
                                       "driver": "benchmarks/gpu_session.py"})
    plan = TINY_PLAN if args.tiny else PLANS[args.plan]
    aot.compile_points(doc, (({"index": index, "sweep": sweep}, point) for sweep, where in plan
                             for index, point in planned(sweep, where)),
                       device, os.path.join(args.out, "aot.json"))
    return 0

def tuners(args, settings: dict, stack: contextlib.ExitStack, device, vers) -> dict:
    """``--tune-fused``: per execution flag of a point ("fused", "fused_ffn",
    "fused_projections"), what ``run_plan`` calls before the first point that has it: the
    query-side kernels' launch (``fused_tuning.json``), the fused FFN block's form and launch
    (``ffn_tuning.json``) and the fused LayerNorm + compression's launch
    (``compress_tuning.json``: the low-rank layers with projections take the block's LayerNorm
    into it)."""
    return {
        "fused": _tuner(lambda: tune_fused(**(TINY_TUNING if args.tiny else {})), use_tiling,
                        Tiling, "fused_tiling", os.path.join(args.out, "fused_tuning.json"),
                        settings, stack, device, vers),
        "fused_ffn": _tuner(lambda: tune_ffn(**(TINY_FFN_TUNING if args.tiny else {})),
                            use_ffn_tiling, FfnTiling, "ffn_tiling",
                            os.path.join(args.out, "ffn_tuning.json"), settings, stack, device,
                            vers),
        "fused_projections": _tuner(
            lambda: tune_compression(**(TINY_COMPRESS_TUNING if args.tiny else {})),
            use_compress_tiling, CompressTiling, "compress_tiling",
            os.path.join(args.out, "compress_tuning.json"), settings, stack, device, vers)}

def _tuner(run, use, tiling, key: str, path: str, settings: dict, stack: contextlib.ExitStack,
           device, vers):
    """Run a tuning (``run``) into ``path``; the layers built from then on (inside ``stack``)
    take its best (``use(tiling(**best))``), and ``settings[key]`` says so. If no candidate
    runs, the file holds the error and the default stays."""
    def tune() -> None:
        t0 = time.monotonic()
        try:
            tuning = run()
        except Exception as exc:  # noqa: BLE001 - the plan goes on with the default
            tuning = {"error": repr(exc)[:2000]}
        write_json({"device": device, "versions": vers, **tuning}, path)
        if "best" in tuning:
            settings[key] = dataclasses.asdict(stack.enter_context(use(tiling(**tuning["best"]))))
        print(f"{key} in {time.monotonic() - t0:.0f} s: {settings[key]}"
              + (f" (tuning failed: {tuning['error'][:200]})" if "error" in tuning else ""),
              flush=True)
    return tune

def run_plan(steps, args, start, deadline, ceilings, settings, budget, device, vers,
             tuners=None) -> None:
    """Time the plan's points in order until the deadline, each sweep's JSON rewritten after
    every point. A tuner (:func:`tuners`) runs before the first point with its flag (minutes of
    compiling launch shapes: the points ahead of it do not wait, nor pay for it when the budget
    ends first)."""
    results: dict[str, list[dict]] = {}
    tuners = dict(tuners or {})
    for sweep, index, point in steps:
        if time.monotonic() > deadline - args.theory_s:
            print(f"budget spent after {time.monotonic() - start:.0f} s; stopping", flush=True)
            break
        for flag in [f for f in tuners if getattr(point, f)]:
            tuners.pop(flag)()
        t0 = time.monotonic()
        row = run_one(point, index=index, sweep=sweep, warmup=args.warmup,
                      repeats=args.repeats, memory_budget_bytes=budget,
                      profile_steps=args.profile_steps)
        results.setdefault(sweep, []).append(row)
        write_json(document(sweep=sweep, results=results[sweep], ceilings=ceilings,
                            settings=settings, device=device, versions_=vers),
                   os.path.join(args.out, f"{sweep}.json"))
        t = row.get("median_s")
        print(f"[{time.monotonic() - start:5.0f}s +{time.monotonic() - t0:4.1f}] {sweep} "
              f"{point.mechanism:>16} {point.mode:>7} {point.scope:>5} N={point.seq_len} "
              + (f"(padded to {point.padded_len}) " if point.pad_to > 1 else "")
              + (f"xla {dict(point.xla)} " if point.xla else "") +
              f"d_model={point.d_model} d_k={point.d_k}: {row['status']} "
              + (f"{t * 1e3:.3f} ms, {row.get('ratio_to_floor', float('nan')):.2f}x floor "
                 f"({row.get('bound')}), compile {row.get('compile_s', 0):.1f}s"
                 if t is not None else row.get("error", "")[:200])
              + (f" [{brief(row['profile'])}]" if row.get("profile") else ""), flush=True)
    else:
        print(f"plan done in {time.monotonic() - start:.0f} s", flush=True)

# --tiny: the XLA points, then a fused one, a fused FFN one and the whole fused block (Pallas's
# interpreter), to dry-run the path.
TINY_PLAN = [("tiny", {"mechanism": {"rnn", "flurka-rnn"}, "mode": {"forward"}, "scope": {"layer"}}),
             ("tiny", {"mechanism": {"flurka-rnn"}, "mode": {"forward"}, "scope": {"layer"},
                       "fused": {True}}),
             ("tiny-ffn", {"fused_ffn": {True}}),
             ("tiny-ffn", {"fused_ffn": {True}, "fused": {True}, "fused_projections": {True}})]

# --tune-fused --tiny: a CPU-sized grid (Pallas's interpreter), to dry-run the path.
TINY_TUNING = dict(seq_len=64, heads=1, head_dim=16, num_features=16, d_k=16, dtype=jnp.float32,
                   forward_grid=[(16, None), (32, None)], backward_grid=[(16, 32, None)],
                   wide_grid=[(16, 8)], wide_size=dict(seq_len=64, heads=1, head_dim=130,
                                                       num_features=130, d_k=16),
                   softmax_grid=[(16, 4, 2)], softmax_size=dict(seq_len=64, heads=1, head_dim=130,
                                                                keys=16),
                   warmup=0, repeats=1, chain=2)
TINY_FFN_TUNING = dict(rows=64, d_model=128, d_ff=128, dtype=jnp.float32,
                       grid=[(1, 64, 8, 1)], warmup=0, repeats=1, chain=2)
TINY_COMPRESS_TUNING = dict(seq_len=64, d_model=128, d_k=16, dtype=jnp.float32,
                            grid=[(16, 16, 4, 1)], warmup=0, repeats=1, chain=2)

# Theorem 1's approximation errors and Fig. 1's ranks at sizes a GPU makes cheap: N = 2048,
# d_model 256, 4 heads, d_k up to N/2, m up to 256 (the CPU runs use N = 1024 and less).
THEORY_ARGS = ["--seq-len", "2048", "--d-model", "256", "--heads", "4",
               "--d-k", "64,128,256,512,1024", "--features", "16,32,64,128,256", "--seeds", "0,1"]

def theory(out: str) -> None:
    """``python -m flurka.theory`` with :data:`THEORY_ARGS` on the card
    (``flurka.theory/1``, drawn by ``flurka report --theory``)."""
    t0 = time.monotonic()
    status = theory_cli.main([*THEORY_ARGS, "--out", out])
    print(f"theory: exit {status} in {time.monotonic() - t0:.0f} s -> {out}", flush=True)

if __name__ == "__main__":
    sys.exit(main())
