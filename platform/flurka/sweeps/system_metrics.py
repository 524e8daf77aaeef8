"""Where a trial ran and what it used, measured inside the trial's own process.

:func:`placement` is the node (hostname, and the Ray node's IP and short id where the trainable
passes them), the JAX devices the trial trained on (kind, platform, count) and its peak memory:
the process's peak resident set (``getrusage``'s ``ru_maxrss``, the whole process's life) and,
where the backend keeps allocator statistics (GPU, TPU), the peak bytes in use on any one of its
devices (``memory_stats()["peak_bytes_in_use"]``; None on CPU, whose backend keeps none).

:class:`Sampler` takes the periodic system metrics, cheaply (a few syscalls and a C++ call; no
thread): the process's CPU use since the previous sample (100 = one core busy), its resident set,
and on an accelerator the bytes in use (and peak) of its allocator; with ``pynvml``
(``nvidia-ml-py``) installed also the GPU's utilisation and memory in use as NVML sees them —
the whole card's, other processes on it included, where trials share a GPU. Several devices:
utilisation averaged, bytes the most any one holds. The trainable reports them to Tune with each
training entry under :data:`PREFIX`; the driver's MLflow callback logs them under that name.

No Ray here (the trainable passes the node's IP and id), and JAX only through the devices passed.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

import psutil   # what flurka.cluster reads processes with

PREFIX = "system/"


def peak_host_bytes() -> int:
    """The process's peak resident set in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def host_rss_bytes() -> int:
    """The process's resident set now, in bytes."""
    return int(psutil.Process().memory_info().rss)


def _memory_stats(device) -> dict[str, Any] | None:
    try:
        return device.memory_stats() or None
    except Exception:  # noqa: BLE001 -- backends without allocator statistics raise or return None
        return None


def device_memory(devices: Sequence[Any]) -> dict[str, int]:
    """``bytes_in_use`` and ``peak_bytes_in_use``: the most any one device holds (empty on CPU)."""
    out: dict[str, int] = {}
    for stats in filter(None, map(_memory_stats, devices)):
        for key in ("bytes_in_use", "peak_bytes_in_use"):
            if isinstance(stats.get(key), int):
                out[key] = max(out.get(key, 0), int(stats[key]))
    return out


def placement(devices: Sequence[Any], *, node_ip: str | None = None, node_id: str | None = None) -> dict[str, Any]:
    """Where the trial ran and its peak memory (call it at the trial's end: the peaks so far)."""
    d = devices[0]
    return {"node": socket.gethostname(), "node_ip": node_ip, "node_id": node_id[:8] if node_id else None,
            "device": str(getattr(d, "device_kind", None) or d.platform), "platform": d.platform,
            "device_count": len(devices), "peak_host_bytes": peak_host_bytes(),
            "peak_device_bytes": device_memory(devices).get("peak_bytes_in_use")}


class _NVML:
    """NVML handles of the trial's GPUs (``pynvml``), or none: not installed, no driver, not GPUs."""

    def __init__(self, devices: Sequence[Any]):
        self.handles: list[Any] = []
        if not devices or devices[0].platform != "gpu":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
            for d in devices:
                ordinal = int(getattr(d, "local_hardware_id", None) or 0)
                ident = visible[ordinal] if ordinal < len(visible) else str(ordinal)   # CUDA's ordinal -> NVML's
                self.handles.append(pynvml.nvmlDeviceGetHandleByUUID(ident) if ident.startswith(("GPU-", "MIG-"))
                                    else pynvml.nvmlDeviceGetHandleByIndex(int(ident)))
            self.nvml = pynvml
        except Exception:  # noqa: BLE001 -- no pynvml, no driver, an unexpected CUDA_VISIBLE_DEVICES
            self.handles = []

    def sample(self) -> dict[str, float]:
        if not self.handles:
            return {}
        try:
            util = [self.nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles]
            used = [self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles]
        except Exception:  # noqa: BLE001 -- the card went away: stop asking
            self.handles = []
            return {}
        return {"gpu_utilization_percent": sum(util) / len(util), "gpu_memory_used_bytes": float(max(used))}


class Sampler:
    """Periodic system metrics of this process (and its devices), named ``system/<metric>``."""

    def __init__(self, devices: Sequence[Any], *, clock=time.monotonic):
        self.devices, self.clock = list(devices), clock
        self._nvml = _NVML(self.devices)
        self._last = (clock(), self._cpu_seconds())

    @staticmethod
    def _cpu_seconds() -> float:
        t = os.times()
        return t.user + t.system

    def sample(self) -> dict[str, float]:
        now, cpu = self.clock(), self._cpu_seconds()
        (then, cpu_then), self._last = self._last, (now, cpu)
        values: dict[str, float] = {"peak_host_bytes": float(peak_host_bytes())}
        if now > then:
            values["cpu_percent"] = 100.0 * (cpu - cpu_then) / (now - then)
        values["host_rss_bytes"] = float(host_rss_bytes())
        memory = device_memory(self.devices)
        if "bytes_in_use" in memory:
            values["device_bytes_in_use"] = float(memory["bytes_in_use"])
        if "peak_bytes_in_use" in memory:
            values["device_peak_bytes"] = float(memory["peak_bytes_in_use"])
        values.update(self._nvml.sample())
        return {f"{PREFIX}{k}": v for k, v in values.items()}


__all__ = ["PREFIX", "Sampler", "placement", "peak_host_bytes", "host_rss_bytes", "device_memory"]
