"""What this card can do at best, measured on it: a matmul rate and a copy bandwidth.

A point's *floor* is the time no implementation can beat on this card:

    floor_s = max(flops / matmul_flops_per_s, min_bytes / copy_bytes_per_s)

with ``flops`` from the FLOP model (``flurka.attention.flops``) and ``min_bytes`` from
:func:`min_bytes` below. ``ratio_to_floor = median_s / floor_s`` (≥ 1 up to probe noise) says how
far an implementation is from the card's limits; the GPU target is ≤ 2 for every layer.

Probes:

* matmul: chained n×n @ n×n products in the benchmark dtype (bf16 on the GPU), 2·n³ FLOPs each;
* bandwidth: ``y = a * c`` over a large array: every byte read once and written once, so
  bytes = 2 · a.nbytes per pass (a plain ``copy`` can be elided by XLA; the scale cannot).

Both run ``chain`` dependent kernels per timed call: one kernel timed per call carries the
call's dispatch and sync and reads below what the card does, which would make every floor too
long and every ratio too kind.

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

import math
from typing import Any

import jax
import jax.numpy as jnp

from flurka.speed.timing import chained, random_normal, time_fn

DEFAULT_SIZES = {  # (matmul n, bandwidth array bytes) per platform
    "gpu": (8192, 1 << 30),
    "tpu": (8192, 1 << 30),
    "cpu": (256, 8 << 20),
}


def matmul_rate(n: int, dtype: Any = jnp.bfloat16, *, chain: int = 10, warmup: int = 2,
                repeats: int = 10) -> dict[str, Any]:
    """FLOP/s of n×n by n×n matmuls in ``dtype`` (float32 accumulation left to XLA).

    One call runs ``chain`` dependent products (a ← (a·b)/√n) inside the jitted function, so the
    host's per-call dispatch and sync (~50 µs) is amortised over ``chain`` kernels; each product
    feeds the next and an optimisation barrier ends each step, so XLA can neither skip, merge
    nor (for the copy) fuse an unrolled loop into one pass.
    """
    ka, kb = jax.random.split(jax.random.key(0))
    a, b = random_normal(ka, (n, n), dtype), random_normal(kb, (n, n), dtype)
    scale = jnp.asarray(n**-0.5, dtype)

    @jax.jit
    def products(a, b):
        return jax.lax.fori_loop(
            0, chain, lambda _, x: jax.lax.optimization_barrier((x @ b) * scale), a)

    t = time_fn(products, (a, b), warmup=warmup, repeats=repeats)
    flops = 2 * n**3 * chain
    return {"n": n, "dtype": jnp.dtype(dtype).name, "chain": chain, "flops": flops,
            "median_s": t["median_s"], "flops_per_s": flops / t["median_s"],
            "best_flops_per_s": flops / t["min_s"]}


def chained_products(chain: int):
    """Jitted (a, b) -> the last of ``chain`` products a_i @ b, a_i = a with its first element
    set to i (:func:`product_rate`, :func:`flurka.speed.timing.chained`)."""
    return chained(jnp.matmul, chain)


def product_rate(shape_a: tuple[int, ...], shape_b: tuple[int, ...], dtype: Any = jnp.bfloat16,
                 *, chain: int = 10, warmup: int = 2, repeats: int = 10) -> dict[str, Any]:
    """Time of one a @ b (``jnp.matmul``: batched when the shapes say so) of any shapes, from
    ``chain`` of them per call as in :func:`matmul_rate` — a product of 0.1 ms timed alone
    carries the ~50 µs of dispatch and sync. Where a·b cannot feed the next product, each step
    writes its index into a's first element (in place: one copy of a per call, none per step)
    and keeps the product: every step's product differs, so XLA can neither hoist it out of
    the loop nor drop it. ``median_s`` is per product."""
    ka, kb = jax.random.split(jax.random.key(3))
    a, b = random_normal(ka, shape_a, dtype), random_normal(kb, shape_b, dtype)
    t = time_fn(chained_products(chain), (a, b), warmup=warmup, repeats=repeats)
    flops = 2 * math.prod(shape_a) * shape_b[-1]
    per_product = t["median_s"] / chain
    return {"shapes": [list(shape_a), list(shape_b)], "dtype": jnp.dtype(dtype).name,
            "chain": chain, "flops": flops, "median_s": per_product,
            "flops_per_s": flops / per_product}


def copy_bandwidth(nbytes: int, dtype: Any = jnp.float32, *, chain: int = 10, warmup: int = 2,
                   repeats: int = 10) -> dict[str, Any]:
    """Bytes/s of read-once write-once passes over an array of ``nbytes`` (``chain`` dependent
    passes per call, for the same reason as :func:`matmul_rate`)."""
    itemsize = jnp.dtype(dtype).itemsize
    a = random_normal(jax.random.key(1), (max(nbytes // itemsize, 1),), dtype)
    c = jnp.asarray(1.0001, dtype)

    @jax.jit
    def passes(x):
        return jax.lax.fori_loop(
            0, chain, lambda _, y: jax.lax.optimization_barrier(y * c), x)

    t = time_fn(passes, (a,), warmup=warmup, repeats=repeats)
    moved = 2 * a.nbytes * chain
    return {"array_bytes": int(a.nbytes), "chain": chain, "bytes": moved,
            "median_s": t["median_s"], "bytes_per_s": moved / t["median_s"],
            "best_bytes_per_s": moved / t["min_s"]}


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
    """Total bytes of the arrays (or their shapes: ``jax.ShapeDtypeStruct``) in a pytree."""
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree)
                   if hasattr(x, "dtype") and hasattr(x, "size")))


def min_bytes(*, mode: str, param_bytes: int, other_bytes: int, input_bytes: int,
              output_bytes: int) -> int:
    """The minimum-bytes model of the module docstring."""
    if mode == "forward":
        return param_bytes + other_bytes + input_bytes + output_bytes
    if mode == "train":  # read x and target; fused AdamW: read p, m, v and write p, m, v
        return 6 * param_bytes + other_bytes + input_bytes + output_bytes
    raise ValueError(f"unknown mode {mode!r}; valid: forward, train")
