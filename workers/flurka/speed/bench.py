"""Build, compile and time one :class:`~flurka.speed.configs.Point`; return a plain result dict.

What is timed:

* ``scope="layer"``: one attention layer (``make_attention``), input x [batch, N, d_model];
* ``scope="model"``: the paper's inference model, ``flurka.models.encoder.Encoder`` with
  ``layers`` pre-LN blocks and an FFN of ``ffn`` (embeddings are left out: they are the same
  table lookup for every mechanism). Dropout is off (rate 0), so only the mechanism differs;
  ``fused_ffn``: the blocks' residual + LayerNorm + FFN as Pallas kernels;
* ``mode="forward"``: ``y = f(x)``;
* ``mode="train"``: loss = mean((f(x) − y)²) against a random target, its gradient and one AdamW
  update (optax) — the full training step.

``pad_to`` > 1: x has ``padded_len`` rows and the step passes the batch mask (rows past N are
padding; the loss is the real rows'), the model built for that length (E1/E2 [d_k, padded_len]).

Precision: ``dtype`` is the compute dtype (passed to the attention layer as ``dtype`` so flash
can pick cuDNN). Forward points store every floating parameter in ``dtype`` (bf16 inference
weights); train points keep float32 master parameters and AdamW state (mixed precision):
the step takes the masters' ``dtype`` copy as its previous update wrote it, differentiates
through it, and updates the masters in float32, writing the next copy in the same pass.

E1/E2 are drawn dense (``e_init="gaussian"``), not pooled: a pooled E is almost all zeros, and a
product over zeros can run faster than one over real weights.

Random features are drawn once at construction and not redrawn (``rng=None``); the cost of a
redraw is not part of the step.

Equal parameter counts: every mechanism of a point has the same d_model, heads, W_Q/W_K/W_V/W_O,
FFN, LayerNorms — identical parameters — as the paper says ("all the models have the same
parameter count"). The low-rank mechanisms (linformer, flurka-*) additionally own E1/E2
([d_k, N] each, per layer, shared by the heads: Linformer's default); these are part of those
mechanisms, not something to pay back elsewhere, and they are identical between linformer and
every FLuRKA variant, so the low-rank-vs-FLuRKA comparisons are exactly parameter-matched.
EVA (and flurka-eva) also own their adaptive proposal (two d_h×d_h Linear + LayerNorm per
layer, a few thousand parameters). Each result reports ``params`` (all) and ``params_lowrank``
(E1/E2) so the differences are visible.
Random-feature tables (performer/EVA ω) are fixed buffers, not parameters (``other_bytes``).

FLOPs: ``flops`` is the FLOP model of ``flurka.attention.flops`` (exact count of our layers);
model scope adds the FFN matmuls (4·b·N·d_model·ffn per layer, 3 × that in training, as
:func:`flurka.training.flops.ffn_flops` counts them; LayerNorm/GELU/residual
elementwise work is omitted, < 1%); train counts the backward pass product by product
(``training_flops``): a lone layer's input is data, so x's gradient is not computed (2.3–2.6 ×
its forward, not 3 ×); inside the model every block's LayerNorm needs it.
``xla_dot_flops`` counts the dots of the step's HLO (:func:`flurka.hlo.dot_flops`), as a check;
``xla_dot_flops_by_type`` splits them by operand type (a bf16 point should be all "bf16").
"""

from __future__ import annotations

import dataclasses
import gc
import time
import types
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flurka import hlo
from flurka.attention import make_attention
from flurka.attention import flops as flop_model
from flurka.attention.base import cast_floating
from flurka.catalogue.mechanisms import COMPRESSED
from flurka.configs.model import ModelConfig
from flurka.models.encoder import Encoder
from flurka.speed import ceilings as ceil
from flurka.speed import profile
from flurka.speed.configs import Point
from flurka.speed.timing import check_counts, failure, random_normal, time_fn, time_interleaved
from flurka.training import flops as training_flops

DATA_KEY = 0  # inputs come from a fixed key: every mechanism sees the same numbers


def build(point: Point, rngs: nnx.Rngs | None = None) -> nnx.Module:
    """The layer or the model of ``point`` (parameters float32 until cast)."""
    rngs = rngs or nnx.Rngs(params=0, default=0)
    options = {"dtype": jnp.dtype(point.dtype)}
    if point.mechanism in COMPRESSED:
        options["d_k"] = point.d_k
        options["e_init"] = "gaussian"  # a dense E: pooled E is mostly zeros, which time faster
    if point.num_features is not None:
        options["num_features"] = point.num_features
    if point.align > 1:
        options["align"] = point.align
    if point.fused:
        options["fused"] = True
    if point.fused_projections:
        options["fused_projections"] = True
    if point.scope == "layer":
        return make_attention(point.mechanism, d_model=point.d_model, num_heads=point.num_heads,
                              max_len=point.padded_len, rngs=rngs, **options)
    config = ModelConfig(point.mechanism, attention_options=options, d_model=point.d_model,
                         num_heads=point.num_heads, num_layers=point.layers, d_ff=point.ffn,
                         dropout_rate=0.0, fused_ffn=point.fused_ffn)
    return Encoder(config, max_len=point.padded_len, rngs=rngs)


def attention_layer(module: nnx.Module) -> nnx.Module:
    """The (first) attention layer of a built layer or model."""
    layers = getattr(module, "layers", None)
    return layers[0].attention if layers is not None else module


def count_params(module: nnx.Module) -> dict[str, int]:
    """``params`` (every nnx.Param element) and ``params_lowrank`` (those under ``seq_proj``)."""
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state(module, nnx.Param))
    total = sum(int(x.size) for _, x in leaves)
    lowrank = sum(int(x.size) for p, x in leaves if "seq_proj" in jax.tree_util.keystr(p))
    return {"params": total, "params_lowrank": lowrank}


def attention_shape(point: Point, layer: nnx.Module) -> flop_model.AttentionShape:
    """The FLOP model's shape for this point, with the sizes the built layer really uses."""
    low_rank = point.mechanism in COMPRESSED
    return flop_model.AttentionShape(
        batch=point.batch, seq_len=point.seq_len, d_model=point.d_model,
        num_heads=point.num_heads, d_k=getattr(layer, "d_k", point.d_k) if low_rank else None,
        num_features=getattr(layer, "num_features", None) or point.num_features,
        window_size=getattr(layer, "window_size", None),
        chunk_size=getattr(layer, "chunk_size", None))


def model_flops(point: Point, layer: nnx.Module) -> int:
    """FLOP-model FLOPs of the point (see the module docstring)."""
    shape = attention_shape(point, layer)
    if point.scope == "layer":
        return (flop_model.forward_flops(point.mechanism, shape) if point.mode == "forward"
                else flop_model.training_flops(point.mechanism, shape, input_grad=False))
    train = point.mode != "forward"
    ffn = training_flops.ffn_flops(point.batch, point.seq_len, point.d_model, point.ffn, train=train)
    attention = flop_model.training_flops if train else flop_model.forward_flops
    return point.layers * (attention(point.mechanism, shape) + ffn)


# The date (UTC) each mechanism's current layer was defined, where its name once timed another
# layer: flurka-eva is EVA on the compressed rows (flurka.attention.flurka) in documents created
# from this date; in older ones it had one window of compressed rows that every query shared.
DEFINED: dict[str, str] = {"flurka-eva": "2026-12-06"}


def current_layer(mechanism: str, created: str | None) -> bool:
    """Whether a row of ``mechanism`` in a document created at ``created`` (ISO 8601, or None
    where unknown) timed the layer the name means now (:data:`DEFINED`)."""
    since = DEFINED.get(mechanism)
    return since is None or (created is not None and created[:10] >= since)


def rederive(doc: dict[str, Any]) -> dict[str, Any]:
    """A recorded ``flurka.speed`` document with the FLOP model's fields of each ok row
    recomputed by the current FLOP model: ``flops`` and, where its run measured ceilings, the
    floor (``floor_s``, ``compute_floor_s``, ``memory_floor_s``, ``bound``, ``ratio_to_floor``).
    The times are untouched. For documents written under an older FLOP model (one that counted a
    lone layer's training step as 3 × its forward). A row that timed another layer
    than its mechanism's name means now (:func:`current_layer`) keeps its fields as recorded:
    the current model does not describe it."""
    point_fields = {f.name for f in dataclasses.fields(Point)}
    results = []
    for r in doc["results"]:
        if (r.get("status") != "ok" or r.get("flops") is None
                or not current_layer(r["mechanism"], doc.get("created"))):
            results.append(r)
            continue
        point = Point(**{k: v for k, v in r.items() if k in point_fields})
        used = {"d_k": r.get("d_k_used"), "num_features": r.get("num_features_used")}  # as describe() records them
        built = types.SimpleNamespace(**{k: v for k, v in used.items() if v is not None})
        r = {**r, "flops": model_flops(point, built)}
        ceilings = (doc.get("ceilings") or {}).get(point.dtype)
        if "floor_s" in r and ceilings:
            add_floor(r, ceilings)
        results.append(r)
    return {**doc, "results": results}


def make_step(point: Point, module: nnx.Module):
    """(jitted fn, args, param_bytes, other_bytes) for the point's mode; args are on device, or
    shapes (``jax.ShapeDtypeStruct``) where ``module`` is (built under ``nnx.eval_shape``)."""
    dtype = jnp.dtype(point.dtype)
    kx, ky = jax.random.split(jax.random.key(DATA_KEY))
    shape = (point.batch, point.padded_len, point.d_model)
    is_model = point.scope == "model"
    padded = point.padded_len > point.seq_len

    def real_rows():
        """The batch mask (``pad_to``: rows past N are padding), built in the step from an iota."""
        if not padded:
            return None
        return jnp.broadcast_to(jnp.arange(point.padded_len) < point.seq_len, shape[:2])

    def apply(m, inputs):
        return m(inputs, real_rows(), deterministic=True) if is_model else m(inputs, real_rows())

    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    abstract = any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(params))
    tx = optax.adamw(1e-4)
    mixed = dtype != jnp.float32

    def arguments(params, rest):
        """The step's arguments from the module's state (run as is, or under jax.eval_shape)."""
        x = random_normal(kx, shape, dtype)
        if point.mode == "forward":
            return cast_floating(params, dtype), cast_floating(rest, dtype), x
        compute = cast_floating(params, dtype) if mixed else ()
        return params, compute, tx.init(params), rest, x, random_normal(ky, shape, dtype)

    args = jax.eval_shape(arguments, params, rest) if abstract else arguments(params, rest)
    if point.mode == "forward":
        @jax.jit
        def forward(params, rest, x):
            return apply(nnx.merge(graphdef, params, rest), x)

        return forward, args, ceil.tree_bytes(args[0]), ceil.tree_bytes(args[1])

    @jax.jit
    def train_step(params, compute, opt_state, rest, x, y):
        """``compute``: mixed precision's compute copy of the float32 ``params`` (``dtype``), as
        the previous step's update wrote it (returned beside the new masters: XLA writes it in
        AdamW's pass, so no pass of its own re-reads the masters to cast them — a cast of
        E1/E2 read 4 and wrote 2 bytes a parameter every step); () when ``dtype`` is float32.
        Its gradient, cast to float32, is the masters' (the cast's vjp)."""
        def loss_fn(p):
            m = nnx.merge(graphdef, p, cast_floating(rest, dtype))
            diff = apply(m, x).astype(jnp.float32) - y.astype(jnp.float32)
            if padded:  # the loss of the real rows only, as a padded batch's would be
                diff = diff * real_rows()[..., None]
            return jnp.sum(diff * diff) / (point.batch * point.seq_len * point.d_model)

        loss, grads = jax.value_and_grad(loss_fn)(compute if mixed else params)
        grads = jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), grads, params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, cast_floating(params, dtype) if mixed else (), opt_state, loss

    return train_step, args, ceil.tree_bytes(params), ceil.tree_bytes(rest)


def hlo_dots(lowered) -> dict[str, Any]:
    """Dot FLOPs of the *unoptimised* HLO (on GPU the optimised HLO turns dots into cuBLAS/cuDNN
    custom calls our counter cannot see), in all and by operand type; None where unreadable."""
    try:
        by_type = hlo.dot_flops_by_type(lowered.as_text(dialect="hlo"))
        return {"xla_dot_flops": sum(by_type.values()), "xla_dot_flops_by_type": by_type}
    except Exception:  # noqa: BLE001
        return {"xla_dot_flops": None, "xla_dot_flops_by_type": None}


def _xla_counts(lowered, compiled) -> dict[str, Any]:
    """XLA's view of the step: :func:`hlo_dots`, XLA's cost analysis and memory analysis of the
    executable, and its plan's memory traffic (:func:`flurka.speed.profile.planned_traffic`). Best
    effort: None (or absent) where this jaxlib lacks a field."""
    out: dict[str, Any] = {**hlo_dots(lowered), "xla_flops": None, "xla_memory_bytes": None}
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        out["xla_flops"] = float(cost["flops"])
    except Exception:  # noqa: BLE001
        pass
    try:
        mem = compiled.memory_analysis()
        out["xla_memory_bytes"] = int(mem.argument_size_in_bytes + mem.output_size_in_bytes
                                      + mem.temp_size_in_bytes - mem.alias_size_in_bytes)
    except Exception:  # noqa: BLE001
        pass
    try:  # the traffic of the plan XLA made here (on a GPU: with its GEMMs tuned on the card)
        traffic = profile.planned_traffic(compiled.as_text(), top=0)
        out["xla_traffic_bytes"], out["xla_traffic_by_kind"] = traffic["bytes"], traffic["by_kind"]
    except Exception:  # noqa: BLE001
        pass
    return out


def describe(point: Point, result: dict[str, Any], *, abstract: bool = False) -> tuple[Any, tuple]:
    """Build ``point``'s step and count what it does before it runs: ``result`` gains its
    parameters, the sizes its layer uses, the FLOP model's FLOPs and the fewest bytes it moves.
    Returns (jitted step, its arguments on the default device). ``abstract``: the arguments'
    shapes only, nothing computed (to compile for another device: a point's parameters can be
    gigabytes of random numbers)."""
    module = nnx.eval_shape(lambda: build(point)) if abstract else build(point)
    layer = attention_layer(module)
    result.update(count_params(module))
    result["num_features_used"] = getattr(layer, "num_features", None)
    result["d_k_used"] = getattr(layer, "d_k", None)
    if hasattr(layer, "implementation"):
        result["implementation"] = layer.implementation
    if getattr(layer, "fused", None):
        result["tiling"] = dataclasses.asdict(layer.fused)
    if point.fused_ffn:
        result["ffn_tiling"] = dataclasses.asdict(module.layers[0].ffn_tiling)
    try:
        result["flops"] = model_flops(point, layer)
    except (NotImplementedError, ValueError) as exc:  # FLOP model lacks this case
        result["flops"], result["flops_note"] = None, str(exc)
    fn, args, param_bytes, other_bytes = make_step(point, module)
    x_bytes = point.batch * point.seq_len * point.d_model * jnp.dtype(point.dtype).itemsize
    forward = point.mode == "forward"  # forward: read x, write y; train: read x and target
    result["min_bytes"] = ceil.min_bytes(
        mode=point.mode, param_bytes=param_bytes, other_bytes=other_bytes,
        input_bytes=x_bytes if forward else 2 * x_bytes, output_bytes=x_bytes if forward else 0)
    return fn, args


def check_compile_options(options: dict[str, Any]) -> None:
    """XLA options (``--xla``) that this XLA refuses (an unknown name, a bad value) fail here,
    compiling a scalar, before any point is built: a ValueError naming them."""
    if not options:
        return
    try:
        jax.jit(lambda x: x + 1).lower(jnp.zeros((), jnp.float32)).compile(
            compiler_options=dict(options))
    except Exception as exc:  # noqa: BLE001 - XLA's own message, re-raised as bad input
        raise ValueError(f"--xla {options}: XLA refused them: {str(exc)[:300]}") from None


@dataclasses.dataclass
class Prepared:
    """A point built and compiled, ready to time: its result row so far (``status`` set when it
    already failed or exceeds the memory budget; then ``compiled`` is None)."""

    result: dict[str, Any]
    compiled: Any = None
    args: tuple = ()


def freeze_survivors() -> None:
    """Collect, then take every surviving object out of the collector's generations
    (:func:`gc.freeze`), for a process about to measure points. Each point ends with a collection
    that releases its buffers (a GPU's memory) before the next; without the freeze that collection
    also scans what the imports made, about 150 000 objects for JAX, Flax and this package, a
    large share of a small sweep's time on a CPU host (benchmarks/results/cpu/NOTES.md). Only for
    a process that owns its objects (a command, a Ray task): a frozen object left in a cycle later
    is never freed."""
    gc.collect()
    gc.freeze()


def prepare(point: Point, *, memory_budget_bytes: int | None = None) -> Prepared:
    """Build and compile one point and count what it does (FLOP model, HLO dots, bytes).
    Never raises for a failed point: out-of-memory (XLA RESOURCE_EXHAUSTED, MemoryError, or XLA's
    compiled memory need above ``memory_budget_bytes``) is ``status="oom"``, any other failure
    ``status="error"``."""
    result: dict[str, Any] = {**point.as_dict(), "status": None}
    try:
        fn, args = describe(point, result)
        start = time.perf_counter()
        lowered = fn.lower(*args)
        compiled = lowered.compile(compiler_options=dict(point.xla) or None)
        result["compile_s"] = time.perf_counter() - start
        result.update(_xla_counts(lowered, compiled))
        need = result["xla_memory_bytes"]
        if memory_budget_bytes is not None and need is not None and need > memory_budget_bytes:
            result.update(status="oom", oom_source="budget",
                          error=f"compiled step needs {need} bytes > memory budget "
                                f"{memory_budget_bytes} bytes")
            return Prepared(result)
        return Prepared(result, compiled, args)
    except Exception as exc:  # noqa: BLE001 - OOM and errors are results
        return Prepared(_failed(result, failure(exc)))
    finally:
        gc.collect()


def _failed(result: dict[str, Any], failed: dict[str, Any]) -> dict[str, Any]:
    """``result`` as a failed measurement (``failed``: :func:`failure`'s dict)."""
    result.update(failed)
    if result["status"] == "oom":
        result["oom_source"] = "xla"
    return result


def finish(prep: Prepared, ceilings: dict[str, Any] | None = None, *,
           profile_steps: int = 0) -> dict[str, Any]:
    """A timed point's row: its profile (``profile_steps`` more steps traced, :mod:`flurka.speed.profile`;
    a failed trace is ``{"error": ...}``, never a lost timing) and its floor."""
    result = prep.result
    if result["status"] != "ok":
        return result
    if profile_steps:
        try:
            result["profile"] = profile.profile_compiled(prep.compiled, prep.args, steps=profile_steps)
        except Exception as exc:  # noqa: BLE001 - the timing stands without its profile
            result["profile"] = {"error": failure(exc)["error"]}
    if ceilings is not None and result.get("flops") is not None:
        add_floor(result, ceilings)
    return result


def add_floor(result: dict[str, Any], ceilings: dict[str, Any]) -> None:
    """A timed row's floor (:func:`flurka.speed.ceilings.floor`) and its ratio to it, in place."""
    fl = ceil.floor(result["flops"], result["min_bytes"], ceilings)
    result.update(fl, ratio_to_floor=result["median_s"] / fl["floor_s"])


def run_point(point: Point, ceilings: dict[str, Any] | None = None, *, warmup: int = 2,
              repeats: int = 10, per_sample: int | None = None,
              memory_budget_bytes: int | None = None, profile_steps: int = 0) -> dict[str, Any]:
    """Measure one point (:func:`prepare`, time, :func:`finish`); never raises for a failed
    measurement: failures and out-of-memory are the row's ``status``. ``per_sample``: calls a
    timed sample (:func:`~flurka.speed.timing.time_fn`; None sizes it to the step)."""
    prep = prepare(point, memory_budget_bytes=memory_budget_bytes)
    if prep.compiled is not None:
        try:
            timing = time_fn(prep.compiled, prep.args, warmup=warmup, repeats=repeats,
                             per_sample=per_sample)
            timing.pop("compile_s")
            prep.result.update(timing, status="ok")
        except Exception as exc:  # noqa: BLE001
            _failed(prep.result, failure(exc))
    try:
        return finish(prep, ceilings, profile_steps=profile_steps)
    finally:
        prep.compiled = prep.args = None
        gc.collect()


def run_interleaved(points: list[Point], ceilings: dict[str, Any] | None = None, *,
                    warmup: int = 2, repeats: int = 10, per_sample: int | None = None,
                    memory_budget_bytes: int | None = None, profile_steps: int = 0
                    ) -> list[dict[str, Any]]:
    """Measure points side by side: all compiled first, then ``repeats`` rounds in which each
    runs one sample (:func:`~flurka.speed.timing.round_robin` order). On a machine whose speed drifts
    (a shared host, a GPU's clock under heat) back-to-back repeats of one point share one
    moment's speed and points timed minutes apart do not; here every point samples every
    round, so their ratios are measured under the same conditions. Holds all the points'
    executables and inputs at once. Rows as :func:`run_point`'s, with ``interleaved: true``."""
    check_counts(warmup, repeats, per_sample)
    preps = [prepare(p, memory_budget_bytes=memory_budget_bytes) for p in points]
    timed = time_interleaved({i: (p.compiled, p.args) for i, p in enumerate(preps)
                              if p.compiled is not None}, warmup=warmup, repeats=repeats,
                             per_sample=per_sample)
    for i, timing in timed.items():
        timing.pop("compile_s", None)   # the compiled step's own, not prepare's
        if timing["status"] == "ok":
            preps[i].result.update(timing, interleaved=True)
        else:                           # a failing point left the others running
            _failed(preps[i].result, timing)
            preps[i].compiled = preps[i].args = None
    rows = [finish(p, ceilings, profile_steps=profile_steps) for p in preps]
    for p in preps:
        p.compiled = p.args = None
    gc.collect()
    return rows
