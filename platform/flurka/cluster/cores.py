"""Cores of its own for a CPU trial: pin the process to a free slot of its node's cores.

Ray's CPU resource is a count, not a set of cores: two one-CPU trials on a two-core node each
start XLA's thread pool over both cores, and their threads contend — the pair trains no faster
than one trial alone. Pinned to a core each (the slot is claimed with an ``flock`` that the
kernel drops when the process dies), XLA sizes its pool to that core, the pair's steps run side
by side, and one trial's single-threaded work (compiling, decoding) no longer idles a core.

Only whole cores are claimed; a trial that asks for as many cores as it may use, or a fraction,
or whose slots are all taken (another sweep on the node), runs unpinned as before.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

LOCK_DIR = Path(tempfile.gettempdir()) / "flurka-cores"

_held: dict[str, object] = {}   # the claimed slot: {"cores": tuple, "lock": open file}


def pin(n: int, *, lock_dir: str | os.PathLike | None = None) -> tuple[int, ...] | None:
    """Pin every thread of this process to ``n`` cores no other pinned process holds.

    Returns the cores, or None when it leaves the process as it was. A process that already
    holds a slot (Tune reuses a worker for trial after trial) keeps it, re-pinning threads
    started since. Call it before JAX's backend starts: XLA's pool takes its size and its
    cores from the thread that starts it.
    """
    if "cores" in _held:
        _apply(_held["cores"])
        return _held["cores"]
    if not hasattr(os, "sched_setaffinity"):   # Linux only (not macOS)
        return None
    cores = sorted(os.sched_getaffinity(0))
    if n < 1 or n >= len(cores):
        return None
    folder = Path(lock_dir) if lock_dir is not None else LOCK_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(len(cores) // n):
        slot = tuple(cores[i * n:(i + 1) * n])
        lock = open(folder / f"cores-{'-'.join(map(str, slot))}.lock", "w")  # noqa: SIM115 (held)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _held.update(cores=slot, lock=lock)
        _apply(slot)
        return slot
    return None


def _apply(cores: tuple[int, ...]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass
