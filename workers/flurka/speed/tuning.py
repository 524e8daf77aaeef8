"""Tune the fused query-side kernels' launch shape (:class:`flurka.attention.fused.Tiling`) on the
device at hand, before the kernels are timed against XLA.

Rows per program, warps and stages do not change what the kernels compute (tested), only how
fast they run — and the defaults are Triton flash attention's choices at head dim 128, not
measurements. So a GPU session first times a small grid at the size it will measure (appendix C:
N = 52.5k, 4 heads, d_h = m = 128, bf16): forward candidates on the forward kernel, then backward
candidates (with the best forward) on a gradient step; the best by total time over both feature
maps (FAVOR+, elu+1) is what the session's fused layers are built with (``use_tiling``). A
stage's candidates are timed side by side (every candidate once per round), not one after
another: on the H200 the default, timed first, read 10–15 % slower than the same launch timed
later. A candidate that fails to compile (e.g. shared memory) is a row with its error, not a crash.
JAX alone, like the rest of :mod:`flurka.speed`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from flurka.attention.feature_maps import (
    elu_features, favor_features, gaussian_orthogonal_matrix, key_side)
from flurka.attention.fused import FEATURES, Tiling, fused_query_side
from flurka.speed.timing import random_normal, time_interleaved

# (block_n, num_warps) and (bwd_block_n, bwd_rows, bwd_num_warps) to try on a GPU: those that
# ptxas compiles for sm_90 without spilling registers, for both feature maps at SIZE
# (``python -m flurka.speed.aot --tilings``). Left out because they spill (4 B – 18 KB per
# thread): forward programs of 128 or 256 rows on 4 warps or 256 on 8; backward steps of 64
# rows; backward programs of 2 or 4 warps. Rows per backward program (bwd_rows) only set the
# loop's length.
FORWARD_GRID = ((64, 4), (64, 8), (128, 8), (128, 16), (256, 16))
BACKWARD_GRID = tuple((n, r, w) for n, w in ((16, 8), (32, 8), (32, 16)) for r in (1024, 4096))
# Where they are timed: the flash comparison's query side (appendix C, one sequence).
SIZE = dict(batch=1, seq_len=52_500, heads=4, head_dim=128, num_features=128, d_k=1024,
            dtype=jnp.bfloat16)


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


def stage_step(stage: str, tiling: Tiling, options: dict):
    """What a candidate is timed on, jitted: the forward kernel (``"forward"``) or the
    query side's gradient (``"gradient"``: the forward and backward kernels)."""
    def query_side(q, kv, k_sum, omega):
        return fused_query_side(q, kv, k_sum, omega, tiling=tiling, **options)
    if stage == "forward":
        return jax.jit(query_side)
    return jax.jit(jax.grad(lambda *a: jnp.sum(query_side(*a)), argnums=(0, 1, 2)))


def _time_candidates(stage: str, tilings: Sequence[Tiling], inputs: dict, *, warmup: int,
                     repeats: int) -> list[dict]:
    """Every candidate on every feature map, timed side by side (:func:`time_interleaved`)."""
    timed = time_interleaved({(i, feature): (stage_step(stage, tiling, options), args)
                              for i, tiling in enumerate(tilings)
                              for feature, (args, options) in inputs.items()},
                             warmup=warmup, repeats=repeats)
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


def tune_fused(*, forward_grid: Sequence[tuple] = FORWARD_GRID,
               backward_grid: Sequence[tuple] = BACKWARD_GRID,
               warmup: int = 2, repeats: int = 10, **size) -> dict[str, Any]:
    """Time the grids at one size (:data:`SIZE`, or the keys of it given);
    ``{"rows": [...], "best": Tiling as dict, "default": ...}`` with each row's per-feature
    median and total (the default tiling is timed too)."""
    size = {**SIZE, **size}
    inputs = {f: kernel_inputs(f, **size) for f in FEATURES}
    timing = dict(warmup=warmup, repeats=repeats)
    default = Tiling()
    forward = [Tiling(block_n=n, num_warps=w) for n, w in forward_grid]
    rows = _time_candidates("forward", [default, *forward], inputs, **timing)
    best_forward = _best(rows, "forward")
    backward = [best_forward]  # with the default backward launch: the gradient stage's baseline
    backward += [t for t in (dataclasses.replace(best_forward, bwd_block_n=n, bwd_rows=r,
                                                 bwd_num_warps=w) for n, r, w in backward_grid)
                 if t not in backward]
    rows += _time_candidates("gradient", backward, inputs, **timing)
    best = _best([r for r in rows if r["stage"] == "gradient"], "gradient")
    return {"size": {**size, "dtype": jnp.dtype(size["dtype"]).name}, "rows": rows,
            "best": dataclasses.asdict(best), "default": dataclasses.asdict(default)}
