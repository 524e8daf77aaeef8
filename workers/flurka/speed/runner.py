"""Run a list of points on this process's device and write ONE JSON document.

Shared by ``python -m flurka.speed`` (JAX alone) and ``experiments/speed_sweep.py`` (Ray tasks),
so both write the same schema (see :mod:`flurka.speed.__main__` for the field list).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import importlib.metadata
import json
import os
from pathlib import Path
import platform as _platform  # stdlib (the project never defines a `platform` module)
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import jax

from flurka.speed import ceilings as ceil
from flurka.speed.bench import run_interleaved, run_point
from flurka.speed.configs import Point

SCHEMA = "flurka.speed/1"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(extra: Sequence[str] = ()) -> dict[str, Any]:
    """Library versions (the JAX stack, and ``extra`` distributions a benchmark depends on), and
    CUDA/cuDNN where a CUDA plugin is installed."""
    out: dict[str, Any] = {"python": sys.version.split()[0], "jax": jax.__version__}
    for dist in ("jaxlib", "flax", "optax", "numpy", "jax-cuda12-plugin", "jax-cuda13-plugin",
                 "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", *extra):
        v = _version(dist)
        if v is not None:
            out[dist] = v
    try:
        from jax._src.lib import cuda_versions  # private, best effort

        if cuda_versions is not None:
            for name in ("cuda_runtime_get_version", "cudnn_get_version",
                         "cuda_driver_get_version"):
                fn = getattr(cuda_versions, name, None)
                if fn is not None:
                    out[name.removesuffix("_get_version")] = fn()
    except Exception:  # noqa: BLE001
        pass
    return out


def device_info() -> dict[str, Any]:
    devices = jax.devices()
    d = devices[0]
    return {"name": getattr(d, "device_kind", str(d)), "platform": d.platform,
            "count": len(devices), "host": _platform.node(),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def host_info() -> dict[str, Any]:
    """The host's CPU model and core count: what a CPU-bound benchmark (data loading, start-up) ran on."""
    cpuinfo = Path("/proc/cpuinfo")
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")), "") if cpuinfo.exists() else ""
    return {"cpu_model": model or _platform.processor(), "cores": os.cpu_count()}


@functools.lru_cache(maxsize=4)
def measured_ceilings(dtype: str, repeats: int = 10) -> dict[str, Any]:
    """The card's matmul rate (in the benchmark dtype) and copy bandwidth, once per process."""
    return ceil.measure(dtype, repeats=repeats)


def document(*, sweep: str, results: list[dict], ceilings: dict | None,
             settings: dict[str, Any], device: dict | None = None,
             versions_: dict | None = None, schema: str = SCHEMA) -> dict[str, Any]:
    """A benchmark's JSON document: what ran where (device, versions, settings) and its rows."""
    return {
        "schema": schema,
        "sweep": sweep,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device or device_info(),
        "versions": versions_ or versions(),
        "settings": settings,
        "ceilings": ceilings,
        "results": results,
    }


def write_json(doc: dict[str, Any], path: str) -> None:
    """Write atomically (a partial file never replaces a good one)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def run_one(point: Point, *, index: int, sweep: str, warmup: int, repeats: int,
            per_sample: int | None = None, memory_budget_bytes: int | None = None,
            with_ceilings: bool = True, profile_steps: int = 0) -> dict:
    """One result row (with ``index``, ``sweep`` and the device it ran on)."""
    ceilings = measured_ceilings(point.dtype) if with_ceilings else None
    (row,) = measure([(index, point)], sweep=sweep, ceilings=ceilings, warmup=warmup,
                     repeats=repeats, per_sample=per_sample, memory_budget_bytes=memory_budget_bytes,
                     profile_steps=profile_steps)
    return row


def measure(group: Sequence[tuple[int, Point]], *, sweep: str, ceilings: dict | None,
            interleave: bool = False, warmup: int = 2, repeats: int = 10,
            per_sample: int | None = None, memory_budget_bytes: int | None = None,
            profile_steps: int = 0) -> list[dict]:
    """Rows of (index, point)s measured one after another, or side by side with ``interleave``
    (:func:`~flurka.speed.bench.run_interleaved`), each with ``index``, ``sweep`` and the device.
    ``ceilings``: this device's probes for the group's dtype, or None."""
    options = dict(warmup=warmup, repeats=repeats, per_sample=per_sample,
                   memory_budget_bytes=memory_budget_bytes, profile_steps=profile_steps)
    pts = [p for _, p in group]
    rows = (run_interleaved(pts, ceilings, **options) if interleave
            else [run_point(p, ceilings, **options) for p in pts])
    device = device_info()["name"]
    return [{"index": i, "sweep": sweep, "device_name": device, **row}
            for (i, _), row in zip(group, rows)]


def side_by_side(points: Sequence[Point], indices: Iterable[int]) -> list[list[tuple[int, Point]]]:
    """(index, point) groups that differ only in mechanism, in order of first appearance: what
    ``--interleave`` times together."""
    groups: dict[tuple, list[tuple[int, Point]]] = {}
    for i, p in zip(indices, points):
        key = tuple(getattr(p, f.name) for f in dataclasses.fields(p) if f.name != "mechanism")
        groups.setdefault(key, []).append((i, p))
    return list(groups.values())


def run_sweep(points: Sequence[Point], indices: Iterable[int], *, sweep: str, out: str | None,
              warmup: int = 2, repeats: int = 10, per_sample: int | None = None,
              memory_budget_bytes: int | None = None, with_ceilings: bool = True,
              progress: Callable[[dict], None] | None = None,
              deadline: float | None = None, profile_steps: int = 0,
              interleave: bool = False, stop=None) -> dict[str, Any]:
    """Time each point in this process; rewrite ``out`` after every point (``interleave``:
    every group of :func:`side_by_side` points, timed by :func:`~flurka.speed.bench.run_interleaved`)
    so an interrupted run keeps what it measured. ``deadline`` (a ``time.monotonic()`` value)
    stops before the next point or group once passed: a lease of fixed length ends with a
    complete file, not a kill. ``stop`` (a ``threading.Event``: ``python -m flurka.speed`` sets it
    on SIGINT / SIGTERM) stops there too; the file then says ``stopped_by_signal``."""
    dtypes = sorted({p.dtype for p in points})
    ceilings = ({d: measured_ceilings(d) for d in dtypes} if with_ceilings else None)
    settings = {"warmup": warmup, "repeats": repeats, "calls_per_sample": per_sample,
                "memory_budget_bytes": memory_budget_bytes, "runner": "local",
                **({"interleaved": True} if interleave else {})}
    groups = side_by_side(points, indices) if interleave else [[ip] for ip in zip(indices, points)]
    results: list[dict] = []
    for group in groups:
        if stop is not None and stop.is_set():
            settings["stopped_by_signal"] = True
            if out and results:
                write_json(document(sweep=sweep, results=results, ceilings=ceilings,
                                    settings=settings), out)
            break
        if deadline is not None and time.monotonic() > deadline:
            settings["stopped_at_deadline"] = True
            break
        for row in measure(group, sweep=sweep, ceilings=ceilings and ceilings[group[0][1].dtype],
                           interleave=interleave, warmup=warmup, repeats=repeats,
                           per_sample=per_sample, memory_budget_bytes=memory_budget_bytes,
                           profile_steps=profile_steps):
            results.append(row)
            if progress is not None:
                progress(row)
        if out:
            write_json(document(sweep=sweep, results=results, ceilings=ceilings,
                                settings=settings), out)
    return document(sweep=sweep, results=results, ceilings=ceilings, settings=settings)
