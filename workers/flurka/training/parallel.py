"""Data parallelism: one trial on several devices (the GPUs of a node, or every process's devices
once ``jax.distributed.initialize`` has run, as Ray Train's ``JaxTrainer`` does across nodes).

The batch is split over a 1-D ``("data",)`` mesh of all devices and the parameters and optimizer
state are replicated. The jitted train step itself is unchanged: jit follows its inputs'
shardings, so XLA computes each device's share of the batch and inserts the gradient all-reduce
(the mean over the global batch, hence the same loss curve as one device).

Every process builds the *global* batch (batch k is a pure function of (seed, k), the data
contract) and hands over only its own rows, so multi-process runs need no data exchange.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = "data"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh over ``devices`` (default: every device of every process)."""
    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.array(devices), (AXIS,))


@functools.cache
def default_mesh() -> Mesh | None:
    """The mesh a training run uses: None (plain single-device jit) when there is one device.
    Cached: call it only after ``jax.distributed.initialize`` (if any)."""
    return data_mesh() if jax.device_count() > 1 else None


def check_batch_size(batch_size: int, mesh: Mesh | None) -> None:
    n = 1 if mesh is None else mesh.size
    if batch_size % n:
        raise ValueError(f"batch_size={batch_size} does not split over {n} devices; "
                         f"use a multiple of {n} (e.g. {n * max(1, batch_size // n)})")


def _global_array(x: np.ndarray, sharding: NamedSharding, rows: bool) -> jax.Array:
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    if rows:  # this process's contiguous share of the batch dimension
        n, i = jax.process_count(), jax.process_index()
        per = x.shape[0] // n
        local = x[i * per:(i + 1) * per]
    else:
        local = x
    return jax.make_array_from_process_local_data(sharding, np.asarray(local), x.shape)


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh | None, *, replicated: bool = False) -> dict[str, Any]:
    """The global batch split over ``mesh`` along its leading (example) axis; unchanged if None.

    ``replicated=True`` puts the whole batch on every device instead (eval batches: then the
    per-example eval stats come back replicated and every process can fetch them)."""
    if mesh is None:
        return batch
    if replicated:
        return replicate(batch, mesh)
    sharding = NamedSharding(mesh, P(AXIS))
    for k, v in batch.items():
        if np.ndim(v) == 0 or v.shape[0] % mesh.size:
            raise ValueError(f"batch entry {k!r} of shape {np.shape(v)} does not split over {mesh.size} devices")
    return {k: _global_array(np.asarray(v), sharding, rows=True) for k, v in batch.items()}


def replicate(tree: Any, mesh: Mesh | None) -> Any:
    """``tree`` (params, optimizer state) with every leaf replicated on all of ``mesh``'s devices."""
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, P())
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    return jax.tree_util.tree_map(lambda x: _global_array(np.asarray(jax.device_get(x)), sharding, rows=False),
                                  tree)


def host_value(tree: Any) -> Any:
    """``jax.device_get`` that also works for arrays spanning other processes' devices
    (a replicated one is read locally, a sharded one is gathered from every process)."""

    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                return np.asarray(x.addressable_data(0))
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree_util.tree_map(get, tree)


__all__ = ["AXIS", "data_mesh", "default_mesh", "check_batch_size", "shard_batch", "replicate", "host_value"]
