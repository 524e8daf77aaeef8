"""Whether a training step can fit, decided from the config's shapes before any data or compile.

A batch size that cannot fit must fail in one line, not after minutes of building batches and
growing memory. The test here is a floor, not an estimate: the bytes one step cannot do without
whatever XLA rematerialises — one batch on the host, and on the device the largest single
activation one layer makes (the FFN's hidden [B, N, d_ff], softmax's weights [B, h, N, N],
the queries, keys and values) and the batches the input pipeline has put there ahead — so a
refusal is never wrong, and any real training step needs more than the floor.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from flurka.configs.base import TrainConfig

# softmax attention materialises [B, h, N, N] weights where it runs as einsums; flash does not
_MATERIALISED_WEIGHTS = ("full",)


def step_floor_bytes(config: TrainConfig, devices: int = 1) -> dict[str, int]:
    """{"host": one batch of token ids and masks, "device": the largest activation of one layer
    on each of ``devices`` data-parallel devices, for one of the ``grad_accumulation`` slices a
    step computes at a time (remat keeps that activation: it is the floor either way),
    "prefetched": each device's share of the ``prefetch`` batches already put there} in bytes."""
    b, n = config.batch_size, config.max_len
    per_device = -(-b // max(devices, 1) // config.grad_accumulation)
    act = np.dtype("float32").itemsize if config.compute_dtype == "float32" else 2
    sequences = 2 if config.task == "translation" else 1   # source and target
    host = b * n * sequences * (4 + 1)                     # int32 ids + bool mask
    model = config.model
    widest = max(model.d_ff, 3 * model.d_model)
    if model.attention in _MATERIALISED_WEIGHTS:
        widest = max(widest, model.num_heads * n)
    prefetched = config.prefetch * -(-host // max(devices, 1))
    return {"host": int(host), "device": int(per_device * n * widest * act), "prefetched": int(prefetched)}


def machine_bytes() -> int | None:
    """Physical memory of this host (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def device_bytes() -> int | None:
    """Memory of the first accelerator JAX sees (None on a CPU, where the host's counts)."""
    dev = jax.local_devices()[0]
    if dev.platform == "cpu":
        return None
    stats = dev.memory_stats() or {}
    return stats.get("bytes_limit")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


MEASURE = "measure"


def check_fits(config: TrainConfig, *, devices: int = 1, host: int | None = None,
               device: int | float | str | None = MEASURE) -> None:
    """Raise a one-line ValueError when the step's floor exceeds this machine's memory (the host's
    RAM for the batch and, on a CPU, for the activations too; the accelerator's own memory
    otherwise). ``host``: bytes of RAM (None: this machine's). ``device``: the accelerator's bytes,
    None where the step runs on the CPU, ``math.inf`` where it runs elsewhere (a sweep's driver
    does not see its trials' GPUs), "measure": ask JAX."""
    floor = step_floor_bytes(config, devices)
    host = machine_bytes() if host is None else host
    device = device_bytes() if device == MEASURE else device
    on_device = floor["device"] + floor["prefetched"]
    need_host = floor["host"] + (on_device if device is None else 0)
    where = [("this machine's memory", need_host, host)]
    if device is not None:
        where.append(("the accelerator's memory", on_device, device))
    for what, need, have in where:
        if have is not None and need > have:
            raise ValueError(
                f"batch_size={config.batch_size} cannot fit: one {config.benchmark} training step "
                f"needs at least {_gib(need)} (a batch of {config.max_len} tokens, one layer's widest "
                f"activation and {config.prefetch} batches prefetched), {what} is {_gib(have)}; lower "
                f"batch_size or max_len")
