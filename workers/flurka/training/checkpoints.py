"""Orbax checkpoints of a run: array state (params, other, optimizer state) + JSON metadata.

One :class:`orbax.checkpoint.CheckpointManager` per run directory; each step holds two items,
``state`` (a pytree of arrays, saved with ``StandardSave``) and ``meta`` (JSON: step, the
mechanism of the model in the checkpoint, loss/eval history so far, cumulative FLOPs, config).
Restoring needs an abstract target of the same structure (a freshly built model's state), which
is also how a resumed run gets back the exact dtypes and optax namedtuples.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class _ReadOnlyNotice(logging.Filter):
    """Drops Orbax's warning that a read-only manager's directory is read-only: every up-training
    branch and theory run reads its base's checkpoints that way, and the sweep's log repeated it
    per trial."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Given directory is read only")


logging.getLogger("absl").addFilter(_ReadOnlyNotice())


class Checkpointer:
    """Save/restore ``(state pytree, meta dict)`` per step under ``directory``."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = None,
                 read_only: bool = False):
        self.directory = os.path.abspath(os.fspath(directory))
        if read_only and not os.path.isdir(self.directory):
            raise FileNotFoundError(f"no checkpoint directory {self.directory}")
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
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def meta(self, step: int) -> dict:
        self._require(step)
        return dict(self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)

    def restore(self, step: int, target: Any) -> tuple[Any, dict]:
        """State shaped like ``target`` (arrays or ShapeDtypeStructs) and the step's metadata."""
        self._require(step)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        # same pytree classes as the target (chain tuples, optax namedtuples), so jit sees one structure
        state = jax.tree.unflatten(jax.tree.structure(target), jax.tree.leaves(out.state))
        return state, dict(out.meta)

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
