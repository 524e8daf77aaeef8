"""Tune the fused query-side kernels' launch shape (:class:`flurka.kernels.query_side.Tiling`) on the
device at hand, before the kernels are timed against XLA.

Rows per program, warps and stages do not change what the kernels compute (tested), only how
fast they run — and the defaults are Triton flash attention's choices at head dim 128, not
measurements. So a GPU session first times a small grid at the size it will measure (appendix C:
N = 52.5k, 4 heads, d_h = m = 128, bf16): forward candidates on the forward kernel, then backward
candidates (with the best forward) on a gradient step; the best by total time over both feature
maps (FAVOR+, elu+1) is what the session's fused layers are built with (``use_tiling``); then
the wide forward kernel's launch at the N-sweep's query side (d_h = m = 325 in 128-wide blocks),
on the forward alone (wide query sides train through the XLA path's gradient), and the
softmax kernel's own wide launch at plain EVA's N-sweep chunk softmax (d_h 325 over N/16 chunk
summaries, its key bias and lse as EVA calls it). A
stage's candidates are timed side by side (every candidate once per round), not one after
another: a launch timed first reads slower than the same launch timed later. Each timed call
runs the kernel ``chain`` times (:func:`flurka.speed.timing.chained`; default :data:`CHAIN`)
and a row's times are per kernel: a sub-millisecond kernel timed one call each would carry the
call's dispatch and sync, which XLA's GEMMs, timed chained, do not. A candidate that fails to
compile (e.g. shared memory) is a row with its error, not a crash.
:func:`tune_ffn` does the same for the fused FFN block (:class:`flurka.kernels.ffn.FfnTiling`:
two kernels or one, and their launch) at the flash comparison's size, forward; and
:func:`tune_compression` for the fused LayerNorm + compression
(:class:`flurka.kernels.compress.CompressTiling`), the largest GEMM of a fused low-rank
layer there (E1·x̂ and E2·x̂: 110 of its ~235 GFLOP).
JAX alone, like the rest of :mod:`flurka.speed`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from flurka.attention.feature_maps import (
    elu_features, favor_features, gaussian_orthogonal_matrix, key_side)
from flurka.kernels.query_side import FEATURES, Tiling, fused_query_side, fused_softmax_attention
from flurka.kernels.compress import (
    CompressTiling, normalised_compression, row_statistics)
from flurka.kernels.ffn import FfnTiling, fused_ffn_block
from flurka.speed.timing import chained, random_normal, time_interleaved

CHAIN = 10  # kernel runs per timed call (the shape probes' chain)
# (block_n, num_warps) and (bwd_block_n, bwd_rows, bwd_num_warps) to try on a GPU: those that
# ptxas compiles for sm_90 without spilling registers, for both feature maps at SIZE
# (``python -m flurka.speed.aot --tilings``; ptxas's numbers in benchmarks/results/h100/NOTES.md).
# Left out because they spill: forward programs of 128 or 256 rows on 4 warps or 256 on 8;
# backward steps of 64 rows; backward programs of 2 or 4 warps. Rows per backward program (bwd_rows) only set the
# loop's length.
FORWARD_GRID = ((64, 4), (64, 8), (128, 8), (128, 16), (256, 16))
BACKWARD_GRID = tuple((n, r, w) for n, w in ((16, 8), (32, 8), (32, 16)) for r in (1024, 4096))
# Where they are timed: the flash comparison's query side (appendix C, one sequence).
SIZE = dict(batch=1, seq_len=52_500, heads=4, head_dim=128, num_features=128, d_k=1024,
            dtype=jnp.bfloat16)
# (wide_block_n, wide_num_warps): 16 rows (spill-free, per-warp mma.sync) against 32–128 (warpgroup
# MMA from 64, spilling a little: Tiling), at the N-sweep's aligned query side (N = 55.5k padded).
WIDE_GRID = ((16, 8), (32, 8), (64, 8), (128, 8))
WIDE_SIZE = dict(seq_len=55_552, heads=8, head_dim=325, num_features=325, d_k=1536)
# (softmax_block_n, softmax_num_warps, softmax_num_stages): the softmax kernel past one block
# wide, at plain EVA's aligned N-sweep query side (its 3472 chunk summaries of 16 keys). What
# ptxas compiles for sm_90 at d_h 325 → 384 (``--tilings``): 16 and 32 rows on per-warp mma.sync,
# spill-free on 2 stages, against the default's 64 rows on wgmma in one stage (two overflow the
# shared memory) and 128 rows; 4 warps on one stage from 32 rows up spill, so are left out
# (ptxas's numbers in benchmarks/results/h100/NOTES.md).
SOFTMAX_GRID = ((16, 4, 2), (16, 8, 2), (32, 4, 2), (32, 8, 1), (32, 8, 2), (128, 8, 1))
SOFTMAX_SIZE = dict(seq_len=55_552, heads=8, head_dim=325, keys=3_472)
# The Tiling fields each stage's grid entries set, in their order.
STAGE_FIELDS = {"forward": ("block_n", "num_warps"),
                "gradient": ("bwd_block_n", "bwd_rows", "bwd_num_warps"),
                "wide": ("wide_block_n", "wide_num_warps"),
                "softmax": ("softmax_block_n", "softmax_num_warps", "softmax_num_stages")}
# Which of stage_sizes' sizes each stage runs at (forward and gradient share theirs).
STAGE_SIZE = {"forward": "narrow", "gradient": "narrow", "wide": "wide", "softmax": "softmax"}
# The fused FFN block's (kernels, block_n, num_warps, num_stages): the launches ptxas compiles for
# sm_90 at FFN_SIZE within the registers (FfnTiling's docstring; one kernel on 2 stages
# spills), at the flash comparison's FFN (the padded batch: 52 608 rows).
FFN_GRID = ((2, 128, 8, 2), (2, 64, 8, 3), (1, 64, 8, 1), (1, 64, 8, 2))
FFN_SIZE = dict(rows=52_608, d_model=512, d_ff=512, dtype=jnp.bfloat16)
# The fused LayerNorm + compression's (rows_k, step, num_warps, num_stages): spill-free on sm_90
# at COMPRESS_SIZE (CompressTiling's comment), from two 8-warp programs per SM
# to one 4-warp program with deeper rows — at the flash comparison's layer (padded batch).
COMPRESS_GRID = ((64, 64, 4, 2), (64, 32, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2), (128, 32, 8, 3))
COMPRESS_SIZE = dict(batch=1, seq_len=52_608, d_model=512, d_k=1024, dtype=jnp.bfloat16)


def kernel_inputs(feature: str, *, batch: int, seq_len: int, heads: int, head_dim: int,
                  num_features: int, d_k: int, dtype: Any) -> tuple[tuple, dict]:
    """(q, kv, k_sum, ω) as a FLuRKA layer hands them to the query side (the key side from
    ``d_k`` random compressed keys), and the kernel's static options."""
    kq, kk, kv_, ko = jax.random.split(jax.random.key(0), 4)
    q = random_normal(kq, (batch, seq_len, heads, head_dim), dtype)
    k = random_normal(kk, (batch, d_k, heads, head_dim), dtype)
    v = random_normal(kv_, (batch, d_k, heads, head_dim), dtype)
    if feature == "favor":
        omega = gaussian_orthogonal_matrix(ko, num_features, head_dim)
        k_feat = favor_features(k, omega, is_query=False)
        options = dict(feature=feature, head_dim=head_dim, num_features=num_features)
    else:
        omega, k_feat = None, elu_features(k)
        options = dict(feature=feature, head_dim=head_dim)
    kv, k_sum = key_side(k_feat, v)
    return (q, kv, k_sum, omega), options


def stage_sizes(size: dict | None = None, wide_size: dict | None = None,
                softmax_size: dict | None = None) -> dict[str, dict]:
    """Where the stages' candidates run: one-block launches at :data:`SIZE` (``"narrow"``), the
    wide forward's at :data:`WIDE_SIZE`, the wide softmax's at :data:`SOFTMAX_SIZE`, each with the
    given keys changed; batch and dtype are the narrow size's throughout."""
    narrow = {**SIZE, **(size or {})}
    common = {"batch": narrow["batch"], "dtype": narrow["dtype"]}
    return {"narrow": narrow, "wide": {**narrow, **WIDE_SIZE, **(wide_size or {})},
            "softmax": {**common, **SOFTMAX_SIZE, **(softmax_size or {})}}


def softmax_inputs(*, batch: int, seq_len: int, heads: int, head_dim: int, keys: int,
                   dtype: Any) -> tuple[tuple, dict]:
    """(q, k, v, key bias) as EVA hands its chunk summaries to the softmax kernel (every chunk
    kept: a zero bias), and the call's static options (its lse too, in the compute dtype)."""
    kq, kk, kv_ = jax.random.split(jax.random.key(0), 3)
    q = random_normal(kq, (batch, seq_len, heads, head_dim), dtype)
    k, v = (random_normal(key, (batch, keys, heads, head_dim), dtype) for key in (kk, kv_))
    bias = jnp.zeros((batch, keys), jnp.float32)
    return (q, k, v, bias), dict(scale=head_dim ** -0.5, with_lse=True, out_dtype=dtype)


def stage_inputs(stage: str, sizes: dict[str, dict]) -> dict[str, tuple[tuple, dict]]:
    """The kernels a stage times, each as (args, static options), at its size of
    :func:`stage_sizes`'s ``sizes`` (:data:`STAGE_SIZE`): one per feature map, or the softmax
    stage's one."""
    size = sizes[STAGE_SIZE[stage]]
    if stage == "softmax":
        return {"softmax": softmax_inputs(**size)}
    return {f: kernel_inputs(f, **size) for f in FEATURES}


def stage_step(stage: str, tiling: Tiling, options: dict):
    """What a candidate is timed on, jitted: the forward kernel (``"forward"``, ``"wide"``,
    ``"softmax"``) or the query side's gradient (``"gradient"``: the forward and backward
    kernels)."""
    if stage == "softmax":
        return jax.jit(lambda q, k, v, bias: fused_softmax_attention(q, k, v, bias=bias,
                                                                     tiling=tiling, **options))

    def query_side(q, kv, k_sum, omega):
        return fused_query_side(q, kv, k_sum, omega, tiling=tiling, **options)
    if stage in ("forward", "wide"):
        return jax.jit(query_side)
    return jax.jit(jax.grad(lambda *a: jnp.sum(query_side(*a)), argnums=(0, 1, 2)))


def _time_per_kernel(steps: dict, *, chain: int, warmup: int, repeats: int) -> dict:
    """:func:`time_interleaved` of each ``(step, args)`` run ``chain`` times a call
    (:func:`chained`), its ``median_s`` one kernel's."""
    timed = time_interleaved({key: (chained(step, chain), args) for key, (step, args) in steps.items()},
                             warmup=warmup, repeats=repeats)
    return {key: {**t, "median_s": t["median_s"] / chain} if t["status"] == "ok" else t
            for key, t in timed.items()}


def _time_candidates(stage: str, tilings: Sequence[Tiling], inputs: dict, *, warmup: int,
                     repeats: int, chain: int) -> list[dict]:
    """Every candidate on every feature map, timed side by side, per kernel
    (:func:`_time_per_kernel`)."""
    timed = _time_per_kernel({(i, feature): (stage_step(stage, tiling, options), args)
                              for i, tiling in enumerate(tilings)
                              for feature, (args, options) in inputs.items()},
                             chain=chain, warmup=warmup, repeats=repeats)
    rows = []
    for i, tiling in enumerate(tilings):
        row = {"stage": stage, "tiling": dataclasses.asdict(tiling), "median_s": {}}
        for feature in inputs:
            timing = timed[(i, feature)]
            if timing["status"] != "ok":
                row.update(status=timing["status"], error=timing.get("error"))
                break
            row["median_s"][feature] = timing["median_s"]
        else:
            row.update(status="ok", total_s=sum(row["median_s"].values()))
        rows.append(row)
    return rows


def _best(rows: list[dict], stage: str) -> Tiling:
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        raise RuntimeError(f"no {stage} tiling ran: {rows[0].get('error') if rows else 'none tried'}")
    return Tiling(**min(ok, key=lambda r: r["total_s"])["tiling"])


def _variants(base: Tiling, grid: Sequence[tuple], stage: str) -> list[Tiling]:
    """``base`` first (the stage's baseline), then ``base`` with each grid entry's fields
    (:data:`STAGE_FIELDS`)."""
    out = [base]
    out += [t for t in (dataclasses.replace(base, **dict(zip(STAGE_FIELDS[stage], values)))
                        for values in grid) if t not in out]
    return out


def tune_fused(*, forward_grid: Sequence[tuple] = FORWARD_GRID,
               backward_grid: Sequence[tuple] = BACKWARD_GRID,
               wide_grid: Sequence[tuple] = WIDE_GRID, wide_size: dict | None = None,
               softmax_grid: Sequence[tuple] = SOFTMAX_GRID, softmax_size: dict | None = None,
               warmup: int = 2, repeats: int = 10, chain: int = CHAIN, **size) -> dict[str, Any]:
    """Time the grids at :func:`stage_sizes` (``size``: keys of :data:`SIZE` to change;
    ``wide_size``, ``softmax_size``: of the wide stages' sizes);
    ``{"rows": [...], "best": Tiling as dict, "default": ...}`` with each row's per-feature
    median and total (the default tiling is timed too), and ``wide_error`` or ``softmax_error``
    where a wide stage failed (``best`` then keeps that launch as the stages before chose it)."""
    sizes = stage_sizes(size, wide_size, softmax_size)
    inputs = stage_inputs("forward", sizes)
    timing = dict(warmup=warmup, repeats=repeats, chain=chain)
    default = Tiling()
    forward = _variants(default, forward_grid, "forward")
    rows = _time_candidates("forward", forward, inputs, **timing)
    best_forward = _best(rows, "forward")
    backward = _variants(best_forward, backward_grid, "gradient")
    rows += _time_candidates("gradient", backward, inputs, **timing)
    best = _best([r for r in rows if r["stage"] == "gradient"], "gradient")
    out = {"size": _named(sizes["narrow"]), "wide_size": _named(sizes["wide"]),
           "softmax_size": _named(sizes["softmax"]), "chain": chain, "rows": rows,
           "default": dataclasses.asdict(default)}
    for stage, grid in (("wide", wide_grid), ("softmax", softmax_grid)):
        try:   # a wide stage that fails (memory, say) keeps the launches tuned before it
            rows += _time_candidates(stage, _variants(best, grid, stage),
                                     stage_inputs(stage, sizes), **timing)
            best = _best([r for r in rows if r["stage"] == stage], stage)
        except Exception as exc:  # noqa: BLE001 - recorded, the tuning stands without it
            out[f"{stage}_error"] = repr(exc)[:2000]
    return {**out, "best": dataclasses.asdict(best)}


def ffn_inputs(*, rows: int, d_model: int, d_ff: int, dtype: Any) -> tuple:
    """(x, a, LayerNorm scale and bias, W1, b1, W2, b2) as an encoder block hands them over."""
    keys = jax.random.split(jax.random.key(0), 8)
    shapes = ((rows, d_model), (rows, d_model), (d_model,), (d_model,), (d_model, d_ff),
              (d_ff,), (d_ff, d_model), (d_model,))
    return tuple(random_normal(k, s, dtype) for k, s in zip(keys, shapes))


def tune_ffn(*, grid: Sequence[tuple] = FFN_GRID, warmup: int = 2, repeats: int = 10,
             chain: int = CHAIN, **size) -> dict[str, Any]:
    """The fused FFN block's forward at :data:`FFN_SIZE` (or the keys of it given) under the
    default :class:`FfnTiling` and each of ``grid``, timed side by side; ``{"rows": [...],
    "best": FfnTiling as dict, "default": ...}``."""
    size = {**FFN_SIZE, **size}
    return _side_by_side("ffn", FfnTiling, grid, ffn_inputs(**size), size,
                         lambda *a, tiling: fused_ffn_block(*a, eps=1e-6, tiling=tiling),
                         warmup=warmup, repeats=repeats, chain=chain)


def compress_inputs(*, batch: int, seq_len: int, d_model: int, d_k: int, dtype: Any) -> tuple:
    """(x, keep, LayerNorm scale and bias, E1, E2) as a fused low-rank layer hands them over:
    x the block's input (un-normalised), E as stored ([d_k, N]), a sequence's last 10 % padded."""
    keys = jax.random.split(jax.random.key(0), 5)
    x = random_normal(keys[0], (batch, seq_len, d_model), dtype)
    keep = jnp.arange(seq_len)[None, :] < jnp.full((batch, 1), seq_len - seq_len // 10)
    scale, bias = (random_normal(k, (d_model,), jnp.float32) for k in keys[1:3])
    e1, e2 = (random_normal(k, (d_k, seq_len), dtype) for k in keys[3:])
    return x, keep, 1.0 + 0.1 * scale, 0.1 * bias, e1, e2


def tune_compression(*, grid: Sequence[tuple] = COMPRESS_GRID, warmup: int = 2,
                     repeats: int = 10, chain: int = CHAIN, **size) -> dict[str, Any]:
    """The fused LayerNorm + compression (its statistics given, as a layer computes them once)
    at :data:`COMPRESS_SIZE` (or the keys of it given) under the default
    :class:`CompressTiling` and each of ``grid``, timed side by side; ``{"rows": [...],
    "best": CompressTiling as dict, "default": ...}``."""
    size = {**COMPRESS_SIZE, **size}
    args = compress_inputs(**size)
    stats = row_statistics(args[0], eps=1e-6)
    return _side_by_side(
        "compression", CompressTiling, grid, args, size,
        lambda *a, tiling: normalised_compression(*a, eps=1e-6, stats=stats, tiling=tiling),
        warmup=warmup, repeats=repeats, chain=chain)


def _side_by_side(stage: str, tiling_class, grid: Sequence[tuple], args: tuple, size: dict,
                  step, *, warmup: int, repeats: int, chain: int) -> dict[str, Any]:
    """``step(*args, tiling=t)`` under ``tiling_class()`` and each of ``grid``, timed side by
    side, per kernel (:func:`_time_per_kernel`): the rows and the fastest candidate (a failed
    candidate: its row's error; none ran: an error)."""
    default = tiling_class()
    tilings = [default]
    tilings += [t for t in (tiling_class(*g) for g in grid) if t not in tilings]
    timed = _time_per_kernel({i: (functools.partial(step, tiling=t), args) for i, t in enumerate(tilings)},
                             chain=chain, warmup=warmup, repeats=repeats)
    rows = [{"stage": stage, "tiling": dataclasses.asdict(t), "status": timed[i]["status"],
             **({"median_s": timed[i]["median_s"]} if timed[i]["status"] == "ok"
                else {"error": timed[i].get("error")})} for i, t in enumerate(tilings)]
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        raise RuntimeError(f"no {stage} tiling ran: {rows[0].get('error')}")
    return {"size": _named(size), "chain": chain, "rows": rows, "default": dataclasses.asdict(default),
            "best": min(ok, key=lambda r: r["median_s"])["tiling"]}


def _named(size: dict) -> dict:
    return {**size, "dtype": jnp.dtype(size["dtype"]).name}
