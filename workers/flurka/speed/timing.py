"""Wall-clock timing of jitted functions, and out-of-memory as a result rather than a crash.

Timing rules: compile first (timed separately, ``compile_s``), then ``warmup`` untimed calls,
then ``repeats`` samples. A sample is ``per_sample`` back-to-back calls ended by one
``jax.block_until_ready`` (JAX dispatch is asynchronous; without it we would time the
dispatch), and its time ÷ ``per_sample`` is one call's. As in a training loop, the host
dispatches the next step while the device runs this one, so the ~50 µs of a call's dispatch and
sync is paid once a sample, not once a call (``torch.utils.benchmark``'s blocked runs, which
FlashAttention's benchmarks use, do the same). By default ``per_sample`` makes a sample last
:data:`SAMPLE_S` (:func:`calls_for`): one call for anything slower, so long steps are timed one
call a sample as before. We report the median and the 10th/90th percentiles: the median is
robust to the odd slow sample (GC, clock boost), p10–p90 is the spread.
"""

from __future__ import annotations

import math
import time
import traceback
from typing import Any, Callable, Hashable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# The XLA runtime error type moved between jaxlib versions; catch either.
_RUNTIME_ERRORS: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(jax.errors, "JaxRuntimeError", None),) if t is not None)
try:  # jaxlib < 0.5 spelling
    from jaxlib.xla_extension import XlaRuntimeError as _XlaRuntimeError  # type: ignore

    _RUNTIME_ERRORS += (_XlaRuntimeError,)
except Exception:  # noqa: BLE001 - absent on new jaxlib
    pass

OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")

# A sample lasts at least this long, so a call's dispatch and sync (~50 µs on a GPU host) is
# under 1 % of it; at most MAX_CALLS calls a sample, whose outputs are all held until it ends.
SAMPLE_S = 5e-3
MAX_CALLS = 32


def random_normal(key: jax.Array, shape: Sequence[int], dtype: Any) -> jax.Array:
    """Standard-normal benchmark input. Never zeros: zeros can take fast paths (denormal-free,
    sparse-friendly) and make the softmax uniform; random data is what a model sees."""
    return jax.random.normal(key, tuple(shape), dtype=dtype)


def is_oom(exc: BaseException) -> bool:
    """True for host MemoryError and XLA RESOURCE_EXHAUSTED (device or host allocation)."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, _RUNTIME_ERRORS) and any(m in str(exc) for m in OOM_MARKERS)


def failure(exc: BaseException) -> dict[str, Any]:
    """A result dict for a failed measurement: status ``oom`` or ``error`` plus the message."""
    message = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
    out = {"status": "oom" if is_oom(exc) else "error", "error_type": type(exc).__name__,
           "error": message}
    if out["status"] == "error":
        out["traceback"] = "".join(traceback.format_exception(exc))[-2000:]
    return out


def compile_fn(fn: Callable, args: Sequence[Any]) -> tuple[Callable, float | None]:
    """Ahead-of-time compile a ``jax.jit`` function for ``args``; returns (compiled, seconds).
    Functions without ``.lower`` are returned as they are with ``None`` seconds."""
    if not hasattr(fn, "lower"):
        return fn, None
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - start


def time_fn(fn: Callable, args: Sequence[Any], *, warmup: int = 2, repeats: int = 10,
            per_sample: int | None = None) -> dict[str, Any]:
    """Median/p10/p90/min seconds of one ``fn(*args)`` over ``repeats`` samples of ``per_sample``
    back-to-back calls each (None: :func:`calls_for` the fastest warm-up call).

    A ``jax.jit`` function is compiled first (``compile_s``); ``warmup`` calls run untimed (one
    at least when ``per_sample`` is None: it sizes the sample). Exceptions propagate (callers turn
    them into results with :func:`failure`).
    """
    check_counts(warmup, repeats, per_sample)
    fn, compile_s = compile_fn(fn, args)
    warm = [timed_sample(fn, args) for _ in range(warm_calls(warmup, per_sample))]
    per_sample = sample_size(per_sample, warm)
    times = [timed_sample(fn, args, per_sample) for _ in range(repeats)]
    return {**summary(times, warmup=warmup, per_sample=per_sample), "compile_s": compile_s}


def check_counts(warmup: int, repeats: int, per_sample: int | None = None) -> None:
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if per_sample is not None and (not isinstance(per_sample, int) or per_sample < 1):
        raise ValueError(f"per_sample (calls a sample) must be None or an int >= 1, "
                         f"got {per_sample!r}")


def calls_for(call_s: float) -> int:
    """Calls of ``call_s`` seconds a sample needs to last :data:`SAMPLE_S`: 1 for a call that
    long or longer, never more than :data:`MAX_CALLS`."""
    return MAX_CALLS if call_s <= 0 else max(1, min(MAX_CALLS, math.ceil(SAMPLE_S / call_s)))


def warm_calls(warmup: int, per_sample: int | None) -> int:
    """Untimed calls before the samples: ``warmup``, one at least where they size the sample."""
    return warmup if per_sample else max(warmup, 1)


def sample_size(per_sample: int | None, warm: Sequence[float]) -> int:
    """``per_sample``, or :func:`calls_for` the fastest of the ``warm`` call times."""
    return per_sample or calls_for(min(warm))


def timed_sample(fn: Callable, args: Sequence[Any], per_sample: int = 1) -> float:
    """Seconds per call of ``per_sample`` calls dispatched back to back, all blocked on at the
    end (every output: a backend may run independent calls out of order)."""
    start = time.perf_counter()
    jax.block_until_ready([fn(*args) for _ in range(per_sample)])
    return (time.perf_counter() - start) / per_sample


def summary(times: Sequence[float], *, warmup: int, per_sample: int = 1) -> dict[str, Any]:
    """The reported statistics of a list of samples' per-call times."""
    t = np.asarray(times, dtype=float)
    return {"median_s": float(np.median(t)), "p10_s": float(np.percentile(t, 10)),
            "p90_s": float(np.percentile(t, 90)), "min_s": float(t.min()), "repeats": len(t),
            "warmup": warmup, "calls_per_sample": per_sample}


def chained(fn: Callable, chain: int) -> Callable:
    """Jitted ``fn(*args)`` run ``chain`` times per call, for timing one kernel without the ~50 µs
    of a call's dispatch and sync (a 0.1 ms kernel timed alone reads 1.5× slow): each step sets
    ``args[0]``'s first element to the step's index (in place: one copy of it per call) and keeps
    the result, so every step differs and XLA can neither hoist it out of the loop nor drop it.
    Returns the last step's result; a call's time ÷ ``chain`` is one kernel's."""
    if not isinstance(chain, int) or chain < 1:
        raise ValueError(f"chain must be an int >= 1, got {chain!r}")

    @jax.jit
    def run(first, *rest):
        def step(i, carry):
            x = carry[0].at[(0,) * first.ndim].set(i.astype(first.dtype))
            return x, jax.lax.optimization_barrier(fn(x, *rest))
        out = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, first, *rest))
        return jax.lax.fori_loop(0, chain, step, (first, out))[1]
    return run


def round_robin(items: Sequence[Any], rounds: int) -> list[list[Any]]:
    """``rounds`` passes over ``items``, each starting one place later than the last, so no item
    is always first after a pause (a cold cache, a clock ramp) or always after the same one."""
    n = len(items)
    return [[items[(r + k) % n] for k in range(n)] for r in range(rounds)] if n else []


def time_interleaved(calls: Mapping[Hashable, tuple[Callable, Sequence[Any]]], *, warmup: int = 2,
                     repeats: int = 10, per_sample: int | None = None, samples: bool = False
                     ) -> dict[Hashable, dict[str, Any]]:
    """:func:`time_fn` for several calls side by side: each compiled first, then ``warmup +
    repeats`` :func:`round_robin` rounds of one sample each, so none is always timed first (a
    launch timed first reads slower than the same launch timed later). A sample is
    ``per_sample`` calls (None: :func:`calls_for` each call's fastest warm-up, one warm-up round
    at least). Per key the summary with ``status``
    "ok", or the failure (:func:`failure`) of a call that did not compile or run, the others
    going on. ``samples``: each summary also lists its seconds a call per round (``samples_s``;
    the i-th of every key's list was timed in round i, so they pair across keys)."""
    check_counts(warmup, repeats, per_sample)
    out: dict[Hashable, dict[str, Any]] = {}
    live: dict[Hashable, tuple[Callable, Sequence[Any]]] = {}
    for key, (fn, args) in calls.items():
        try:
            compiled, compile_s = compile_fn(fn, args)
        except Exception as exc:  # noqa: BLE001 - a call that does not compile is a result
            out[key] = failure(exc)
            continue
        live[key], out[key] = (compiled, args), {"compile_s": compile_s}
    warm_rounds = warm_calls(warmup, per_sample)
    warm: dict[Hashable, list[float]] = {key: [] for key in live}
    times: dict[Hashable, list[float]] = {key: [] for key in live}
    sizes: dict[Hashable, int] = {}
    for rnd, order in enumerate(round_robin(list(live), warm_rounds + repeats)):
        for key in order:
            if key not in live:
                continue
            n = 1 if rnd < warm_rounds else sizes.setdefault(key, sample_size(per_sample, warm[key]))
            try:
                t = timed_sample(*live[key], n)
            except Exception as exc:  # noqa: BLE001 - a failing call leaves the others running
                out[key] = failure(exc)
                del live[key]
                continue
            (warm if rnd < warm_rounds else times)[key].append(t)
    for key in live:
        out[key] = {"status": "ok", **summary(times[key], warmup=warmup, per_sample=sizes[key]),
                    **out[key], **({"samples_s": times[key]} if samples else {})}
    return out
