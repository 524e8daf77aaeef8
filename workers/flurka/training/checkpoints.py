"""Orbax checkpoints of a run: array state (params, other, optimizer state) + JSON metadata.

One :class:`orbax.checkpoint.CheckpointManager` per run directory; each step holds two items,
``state`` (a pytree of arrays, saved with ``StandardSave``) and ``meta`` (JSON: step, the
mechanism of the model in the checkpoint, loss/eval history so far, cumulative FLOPs, config).
Restoring needs an abstract target of the same structure (a freshly built model's state), which
is also how a resumed run gets back the exact dtypes and optax namedtuples.

A step that cannot be read because its files are damaged (truncated, overwritten, missing: what
Orbax reports as a ``UnicodeDecodeError``, a JSON error, a ``FileNotFoundError`` or a TensorStore
``DATA_LOSS``/``NOT_FOUND``/``OUT_OF_RANGE`` ``ValueError``) raises :class:`CorruptCheckpoint`,
one line naming the damaged file and why. Retrying cannot help; a checkpoint that does not fit
the model (another shape or structure) stays Orbax's own ``ValueError``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import jax


def _orbax():
    """``orbax.checkpoint``, imported by the first :class:`Checkpointer`, not with this module: its
    import is a measurable part of ``flurka train``'s start-up (benchmarks/first_step.py), and a
    run without a work dir never checkpoints. The measured exception to importing at the top."""
    import orbax.checkpoint as ocp

    return ocp


class _ReadOnlyNotice(logging.Filter):
    """Drops Orbax's warning that a read-only manager's directory is read-only: every up-training
    branch and theory run reads its base's checkpoints that way, and the sweep's log repeated it
    per trial."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Given directory is read only")


logging.getLogger("absl").addFilter(_ReadOnlyNotice())


class CorruptCheckpoint(ValueError):
    """A checkpoint step whose files cannot be read: ``path`` (the damaged file, else the step's
    item or step directory) and ``reason``; its message is one line. A ``ValueError``: bad input,
    which ``flurka train`` reports in one line with exit status 2."""

    def __init__(self, path: str, reason: str):
        super().__init__(path, reason)
        self.path, self.reason = os.fspath(path), " ".join(str(reason).split())

    def __str__(self) -> str:
        return f"corrupt checkpoint {self.path}: {self.reason}"


# the files of a step that Orbax reads as JSON (an item's ``metadata`` / ``_METADATA``, the
# step's ``_CHECKPOINT_METADATA``, the arrays' ``_sharding`` and ``array_metadatas/process_*``)
_JSON_FILES = ("metadata", "_METADATA", "_CHECKPOINT_METADATA", "_sharding")
_TENSORSTORE_CODE = re.compile(r"^(DATA_LOSS|NOT_FOUND|OUT_OF_RANGE|FAILED_PRECONDITION|INTERNAL|UNKNOWN): ")


def _json_damage(path: str) -> str | None:
    """Why the JSON file at ``path`` cannot be read (None: it can)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if not data.strip():
        return f"empty ({len(data)} bytes)"
    try:
        json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start} of {len(data)})"
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno} of {len(data)} bytes)"
    return None


def _damaged_json(step_dir: str) -> tuple[str, str] | None:
    """(file, reason) of the first damaged JSON file of a step: the ``meta`` item's, the
    ``state`` item's, then the step's own."""
    found = []
    for root, dirs, files in os.walk(step_dir):
        dirs.sort()
        for name in sorted(files):
            if name in _JSON_FILES or os.path.basename(root) == "array_metadatas":
                found.append(os.path.join(root, name))
    order = {"meta": 0, "state": 1}
    for path in sorted(found, key=lambda p: (order.get(os.path.relpath(p, step_dir).split(os.sep)[0], 2), p)):
        reason = _json_damage(path)
        if reason is not None:
            return path, reason
    return None


def diagnose(step_dir: str, exc: BaseException) -> CorruptCheckpoint | None:
    """The :class:`CorruptCheckpoint` that explains ``exc``, raised reading ``step_dir``; None
    when ``exc`` is no sign of damaged files (a target of another shape, say)."""
    damaged = _damaged_json(step_dir)
    if damaged is not None:
        return CorruptCheckpoint(*damaged)
    if isinstance(exc, FileNotFoundError):
        path = exc.filename or next(iter(re.findall(r"(/\S+) not found", str(exc))), step_dir)
        return CorruptCheckpoint(os.fspath(path), "missing")
    if isinstance(exc, (UnicodeDecodeError, json.JSONDecodeError)):   # a file the scan does not know
        return CorruptCheckpoint(step_dir, f"{type(exc).__name__}: {exc}")
    message = str(exc)
    code = _TENSORSTORE_CODE.match(message)
    if isinstance(exc, ValueError) and code:
        # TensorStore: '<CODE>: Error … local file "<item dir>": … local file "<file>": <detail> [tensorstore_spec…'
        head = message.split(" [tensorstore_spec", 1)[0]
        files = list(re.finditer(r'local file "([^"]+)"', head))
        path = files[-1].group(1) if files else step_dir
        detail = head[files[-1].end():].lstrip(": ").strip() if files else ""
        if path.endswith("/") or not detail:   # a directory (its database lacks an entry): what is missing
            what = re.sub(r'^(Error opening "[^"]+" driver: )+', "", head[code.end():])
            detail = re.sub(r' (in|of) [\w ]*local file "[^"]+"', "", what) if path.endswith("/") else ""
        reason = {"NOT_FOUND": "missing", "OUT_OF_RANGE": "wrong size"}.get(code.group(1), "unreadable")
        return CorruptCheckpoint(path.rstrip("/"), f"{reason} ({code.group(1)}{': ' + detail if detail else ''})")
    return None


def _quiet_closed_loop(hook, unraisable) -> None:
    """``sys.unraisablehook`` less the leftovers of a failed Orbax read (see ``_reading``)."""
    exc, obj = unraisable.exc_value, unraisable.object
    if (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed") or \
            getattr(obj, "__qualname__", "").startswith("_read_array_index"):
        return
    hook(unraisable)


class Checkpointer:
    """Save/restore ``(state pytree, meta dict)`` per step under ``directory``."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = None,
                 read_only: bool = False):
        self.directory = os.path.abspath(os.fspath(directory))
        if read_only and not os.path.isdir(self.directory):
            raise FileNotFoundError(f"no checkpoint directory {self.directory}")
        ocp = _orbax()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else max_to_keep, create=not read_only,
            save_interval_steps=0 if read_only else 1, enable_async_checkpointing=False,
            read_only=read_only)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "meta"))

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, meta: dict) -> None:
        ocp = _orbax()
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def meta(self, step: int) -> dict:
        self._require(step)
        ocp = _orbax()
        with self._reading(step):
            return dict(self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)

    def restore(self, step: int, target: Any) -> tuple[Any, dict]:
        """State shaped like ``target`` (arrays or ShapeDtypeStructs) and the step's metadata."""
        self._require(step)
        ocp = _orbax()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        with self._reading(step):
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        # same pytree classes as the target (chain tuples, optax namedtuples), so jit sees one structure
        state = jax.tree.unflatten(jax.tree.structure(target), jax.tree.leaves(out.state))
        return state, dict(out.meta)

    def restore_saved(self, step: int) -> tuple[Any, dict]:
        """The state as saved (nested dicts of host arrays, no target to shape it: another
        model's checkpoint) and the step's metadata."""
        self._require(step)
        ocp = _orbax()
        with self._reading(step):
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
        return out.state, dict(out.meta)

    @contextlib.contextmanager
    def _reading(self, step: int) -> Iterator[None]:
        """Reads of ``step``: an error that damaged files explain becomes :class:`CorruptCheckpoint`.
        A failed array read leaves Orbax's asyncio reads to finish on a closed event loop, which
        Python printed as "Event loop is closed" tracebacks beside the one line: not while reading."""
        hook = sys.unraisablehook
        sys.unraisablehook = functools.partial(_quiet_closed_loop, hook)
        try:
            yield
        except CorruptCheckpoint:
            raise
        except Exception as exc:
            step_dir = os.path.join(self.directory, str(step))   # Orbax's default step names
            corrupt = diagnose(step_dir if os.path.isdir(step_dir) else self.directory, exc)
            if corrupt is None:
                raise
            gc.collect()   # the abandoned reads' coroutines, under the quiet hook
            raise corrupt from exc
        finally:
            sys.unraisablehook = hook

    def _require(self, step: int) -> None:
        if step not in self.manager.all_steps():
            raise ValueError(f"no checkpoint for step {step} in {self.directory}; "
                             f"available: {self.steps() or 'none'}")

    def close(self) -> None:
        self.manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def run_checkpoint(workdir: str, step: int | None = None) -> Iterator[tuple[Checkpointer, int]]:
    """A run's checkpoints, read-only, and the step to read (default: its latest); one-line
    ValueError when the directory holds none — cheap, so the CLI checks it before any compute."""
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        raise ValueError(f"{workdir} is not a training work dir with checkpoints "
                         f"(no {directory}; train with --workdir and checkpoint_every > 0)")
    with Checkpointer(directory, read_only=True) as ckpt:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"{directory} holds no checkpoint yet")
        yield ckpt, step


def checkpoint_meta(workdir: str, step: int | None = None) -> tuple[int, dict]:
    """(step, metadata) of a run's checkpoint (default: its latest; :func:`run_checkpoint`)."""
    with run_checkpoint(workdir, step) as (ckpt, step):
        return step, ckpt.meta(step)
