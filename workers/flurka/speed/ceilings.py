"""What this card can do at best, measured on it: a matmul rate and a copy bandwidth.

A point's *floor* is the time no implementation can beat on this card:

    floor_s = max(flops / matmul_flops_per_s, min_bytes / copy_bytes_per_s)

with ``flops`` from the FLOP model (``flurka.attention.flops``) and ``min_bytes`` from
:func:`min_bytes` below. ``ratio_to_floor = median_s / floor_s`` (≥ 1 up to probe noise) says how
far an implementation is from the card's limits; the GPU target is ≤ 2 for every layer.

Probes:

* matmul: an n×n @ n×n product in the benchmark dtype (bf16 on the GPU), 2·n³ FLOPs per call;
* bandwidth: ``y = a * c`` over a large array: every byte read once and written once, so
  bytes = 2 · a.nbytes per call (a plain ``copy`` can be elided by XLA; the scale cannot).

Minimum-bytes model (the fewest bytes the step must move through device memory):

* forward: every parameter/variable of the module read once (its real count and dtype, so the
  low-rank E1/E2 and random-feature tables are included where the mechanism has them), the input
  read once and the output written once;
* train: the input and target read once, and per trainable parameter a fused AdamW update that
  reads p, m, v and writes p, m, v (6 × parameter bytes; the gradient need not touch memory if
  fused); plus non-trainable variables read once.

Activations are deliberately left out: a perfect kernel could keep them on chip, so this is a
lower bound. It is the same rule for every mechanism; what differs is their parameters.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from flurka.speed.timing import random_normal, time_fn

DEFAULT_SIZES = {  # (matmul n, bandwidth array bytes) per platform
    "gpu": (8192, 1 << 30),
    "tpu": (8192, 1 << 30),
    "cpu": (256, 8 << 20),
}


def matmul_rate(n: int, dtype: Any = jnp.bfloat16, *, warmup: int = 2, repeats: int = 10
                ) -> dict[str, Any]:
    """FLOP/s of an n×n by n×n matmul in ``dtype`` (float32 accumulation left to XLA)."""
    ka, kb = jax.random.split(jax.random.key(0))
    a, b = random_normal(ka, (n, n), dtype), random_normal(kb, (n, n), dtype)
    t = time_fn(jax.jit(jnp.matmul), (a, b), warmup=warmup, repeats=repeats)
    flops = 2 * n**3
    return {"n": n, "dtype": jnp.dtype(dtype).name, "flops": flops, "median_s": t["median_s"],
            "flops_per_s": flops / t["median_s"], "best_flops_per_s": flops / t["min_s"]}


def copy_bandwidth(nbytes: int, dtype: Any = jnp.float32, *, warmup: int = 2, repeats: int = 10
                   ) -> dict[str, Any]:
    """Bytes/s of a read-once write-once pass over an array of ``nbytes``."""
    itemsize = jnp.dtype(dtype).itemsize
    a = random_normal(jax.random.key(1), (max(nbytes // itemsize, 1),), dtype)
    scale = jax.jit(lambda x: x * jnp.asarray(1.0001, x.dtype))
    t = time_fn(scale, (a,), warmup=warmup, repeats=repeats)
    moved = 2 * a.nbytes
    return {"array_bytes": int(a.nbytes), "bytes": moved, "median_s": t["median_s"],
            "bytes_per_s": moved / t["median_s"], "best_bytes_per_s": moved / t["min_s"]}


def measure(dtype: Any = jnp.bfloat16, *, matmul_n: int | None = None,
            copy_bytes: int | None = None, repeats: int = 10) -> dict[str, Any]:
    """Both probes on the default device; sizes default by platform (:data:`DEFAULT_SIZES`)."""
    n_default, bytes_default = DEFAULT_SIZES.get(jax.default_backend(), DEFAULT_SIZES["cpu"])
    mm = matmul_rate(matmul_n or n_default, dtype, repeats=repeats)
    bw = copy_bandwidth(copy_bytes or bytes_default, repeats=repeats)
    return {"matmul": mm, "copy": bw, "matmul_flops_per_s": mm["flops_per_s"],
            "copy_bytes_per_s": bw["bytes_per_s"]}


def floor(flops: float, nbytes: float, ceilings: dict[str, Any]) -> dict[str, Any]:
    """``floor_s`` = max(compute time, memory time) and which of the two binds."""
    compute = flops / ceilings["matmul_flops_per_s"]
    memory = nbytes / ceilings["copy_bytes_per_s"]
    return {"floor_s": max(compute, memory), "compute_floor_s": compute,
            "memory_floor_s": memory, "bound": "compute" if compute >= memory else "memory"}


def tree_bytes(tree: Any) -> int:
    """Total bytes of the arrays in a pytree."""
    return int(sum(x.nbytes for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "nbytes")))


def min_bytes(*, mode: str, param_bytes: int, other_bytes: int, input_bytes: int,
              output_bytes: int) -> int:
    """The minimum-bytes model of the module docstring."""
    if mode == "forward":
        return param_bytes + other_bytes + input_bytes + output_bytes
    if mode == "train":  # read x and target; fused AdamW: read p, m, v and write p, m, v
        return 6 * param_bytes + other_bytes + input_bytes + output_bytes
    raise ValueError(f"unknown mode {mode!r}; valid: forward, train")
