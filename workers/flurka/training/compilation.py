"""XLA compilation across processes: JAX's persistent cache, and what a run spent compiling.

A sweep compiles the same programs in many processes: the α branches of one variant on
different Tune actors, the retry of a killed trial, a resumed sweep. With the persistent cache
every process after the first loads the executable from disk instead of compiling it again (on a
GPU, tens of seconds per step function; XLA's GPU autotuning results are kept there too).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.monitoring
from jax.experimental.compilation_cache import compilation_cache

# jax._src.dispatch.BACKEND_COMPILE_EVENT (an XLA compile, or a load from the persistent cache)
# and the cache's hit event in jax._src.compiler.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def cache_dir(given: str | None) -> str | None:
    """``--compilation-cache`` as a single run reads it: a DIR; "off": none; unset: JAX's own
    ``JAX_COMPILATION_CACHE_DIR``, else ``$XDG_CACHE_HOME/flurka/jax`` (``~/.cache``), so that
    the second run of a program on a machine loads it instead of compiling it."""
    if given == "off":
        return None
    if given:
        return given
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(Path(home) / "flurka" / "jax")


def use_persistent_cache(path: str | Path) -> None:
    """Keep every compiled program of this process in ``path`` and load it from there next time.

    Every program, not only those over JAX's default 1 s: a sweep's trials compile the same small
    programs (initialisation, evaluation) too. JAX opens its cache at a process's first compile
    and keeps it; a new ``path`` resets it (a reused worker, a second sweep in one process), so
    the next compile opens this one. Entries are keyed by the program, the compiler options, the
    device kind and the JAX version, so a stale or foreign entry is never used; a damaged one is
    recompiled with a warning.
    """
    path = str(Path(path).expanduser().resolve())
    Path(path).mkdir(parents=True, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != path:
        compilation_cache.set_cache_dir(path)
        compilation_cache.reset_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@contextlib.contextmanager
def accounting(cache: str | Path | None = None) -> Iterator[dict[str, float]]:
    """Count the block's XLA compiles, their seconds, and how many came from the persistent cache;
    ``cache``: the block uses that one (:func:`use_persistent_cache`)."""
    if cache:
        use_persistent_cache(cache)
    stats = {"compiles": 0, "compile_s": 0.0, "cache_hits": 0}

    def on_duration(event: str, duration: float, **_) -> None:
        if event == COMPILE_EVENT:
            stats["compiles"] += 1
            stats["compile_s"] += duration

    def on_event(event: str, **_) -> None:
        if event == CACHE_HIT_EVENT:
            stats["cache_hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    try:
        yield stats
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
        jax.monitoring.unregister_event_listener(on_event)
