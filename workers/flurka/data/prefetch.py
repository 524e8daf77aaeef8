"""Batches built ahead of the training step, off its thread: :class:`Prefetcher`.

Batch ``k`` is a pure function of ``(seed, k)`` (:mod:`flurka.data.core`), so building ahead is
just calling that function for ``k+1 .. k+depth`` early: a pool of ``workers`` threads builds
them, at most ``depth`` batches ahead, and :meth:`Prefetcher.__next__` hands them over in step
order. The order of completion never matters, so the batches are exactly those of the serial
loop, and resuming at ``start_step=k`` (the checkpoint's step) replays them; no iterator state
needs saving beside the checkpoint.

Why threads around the pure function, not grain or tf.data: grain's value (a checkpointable
iterator, index sampling, per-record maps) is what the ``(seed, k)`` contract already gives, and
tf.data needs TensorFlow (1.3 GB). The decoding that costs mostly frees the GIL (ImageNet's batch
~80 % by profile: PIL's decode and resize, NumPy's normalisation; WMT's ~70 %: SentencePiece), and
where per-example Python holds it (GLUE) one core builds 30k-60k examples a second; the LRA
loaders gather from arrays decoded once (:mod:`flurka.data.cache`). Worker processes would need
each data set pickled or rebuilt per worker (closures, TFDS sources) and a batch pickled back: two
measured no faster than two threads (ImageNet's 77 MB float32 batch, GLUE-MNLI). Measurements:
``benchmarks/results/cpu/NOTES.md`` (input pipeline).

``place`` (e.g. ``jax.device_put`` of the batch) runs in the worker too, so a batch's host-to-device
copy overlaps the running step. A producer's exception is raised again in the consumer, at the
step it belongs to, with its message and traceback. :meth:`Prefetcher.close` (also ``with``, and
the end of the stream) cancels what has not started and joins every thread; a batch being built
finishes first (one batch's time at most).

JAX-free: this module only calls what it is given.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

MAX_PREFETCH = 64   # batches in flight; each holds a whole batch in host (and device) memory


def default_workers(depth: int) -> int:
    """Threads for ``depth`` batches ahead: one per batch in flight, at most one per core."""
    return max(1, min(depth, os.cpu_count() or 1))


class Prefetcher(Iterator[Any]):
    """``place(batch_fn(k))`` for ``k = start, start+1, ...`` (below ``stop`` if given), each built
    up to ``depth`` steps ahead on ``workers`` threads (default :func:`default_workers`).

    ``depth=0`` builds each batch on the caller's thread when it is asked for (the loop before
    prefetching); the batches are the same either way.
    """

    def __init__(self, batch_fn: Callable[[int], Any], *, start: int = 0, stop: int | None = None,
                 depth: int = 2, workers: int | None = None, place: Callable[[Any], Any] | None = None,
                 name: str = "flurka-prefetch"):
        if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= MAX_PREFETCH:
            raise ValueError(f"prefetch depth must be an int in [0, {MAX_PREFETCH}], got {depth!r}")
        if workers is not None and not (isinstance(workers, int) and workers >= 1):
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        self._fn = batch_fn
        self._place = place
        self._next = start        # the next step to hand out
        self._submitted = start   # the next step to submit
        self._stop = stop
        self._depth = depth
        self._pending: collections.deque[concurrent.futures.Future] = collections.deque()
        self._closed = False
        self._lock = threading.Lock()
        self._pool = None
        if depth:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=workers or default_workers(depth), thread_name_prefix=name)
            self._fill()

    def _build(self, step: int) -> Any:
        batch = self._fn(step)
        return batch if self._place is None else self._place(batch)

    def _fill(self) -> None:
        while len(self._pending) < self._depth and (self._stop is None or self._submitted < self._stop):
            self._pending.append(self._pool.submit(self._build, self._submitted))
            self._submitted += 1

    @property
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns."""
        return self._next

    def __next__(self) -> Any:
        with self._lock:
            if self._stop is not None and self._next >= self._stop:
                self._close()   # the stream's end: its threads go
            if self._closed:
                raise StopIteration
            if self._pool is None:
                batch = self._build(self._next)
            else:
                future = self._pending.popleft()
                try:
                    batch = future.result()   # a producer's exception is raised here, as it was
                except BaseException:
                    self._close()
                    raise
                self._fill()
            self._next += 1
            return batch

    def close(self) -> None:
        """Cancel the batches not started, wait for the ones being built, join the threads.
        Idempotent; ``next()`` after it raises StopIteration."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:   # a dropped iterator does not leave its threads behind
        try:
            if not self._closed and self._pool is not None:
                for future in self._pending:
                    future.cancel()
                self._pool.shutdown(wait=False, cancel_futures=True)
        except Exception:
            pass
