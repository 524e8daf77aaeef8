"""A model as plain pytrees: ``params`` and ``other`` are flat ``{"path/to/leaf": array}`` dicts.

The train step is a pure function of those dicts (``nnx.split`` / ``nnx.merge`` around it, the
NNX functional API), which keeps three things simple: orbax checkpoints of string-keyed dicts,
optax states whose ``mu``/``nu`` have the same string keys as the parameters, and up-training,
which copies every entry whose path and shape exist in both the base and the FLuRKA model.

``other`` holds the non-trainable variables (e.g. the random features ω of FAVOR+/EVA, which must
be checkpointed). RNG state is neither: every stream is reseeded from ``(seed, step)`` before each
use, so it never needs saving and a resumed run draws the same dropout masks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Flat = dict[str, jax.Array]


def _key_name(key) -> str | None:
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return None if key.name in ("value", "raw_value") else key.name
    return str(key)


def _flatten(state: nnx.State) -> tuple[list[str], Any, list[jax.Array]]:
    with_path, treedef = jax.tree_util.tree_flatten_with_path(state)
    names = ["/".join(n for n in map(_key_name, path) if n is not None) for path, _ in with_path]
    if len(set(names)) != len(names):
        raise RuntimeError("two model variables map to the same path name")
    return names, treedef, [leaf for _, leaf in with_path]


def by_path(tree: Any) -> Flat:
    """A state's (or a checkpoint's nested dict's) leaves by their path names, ``a/b/c``: the names
    a model's flat parameters and checkpoints use."""
    names, _, leaves = _flatten(tree)
    return dict(zip(names, leaves))


@dataclasses.dataclass(frozen=True, eq=False)
class ModelParts:
    """The static half of a split model; :meth:`merge` rebuilds a module from flat dicts."""

    graphdef: Any
    param_names: tuple[str, ...]
    param_treedef: Any
    other_names: tuple[str, ...]
    other_treedef: Any
    rng_treedef: Any
    rng_leaves: tuple[tuple[str, str], ...]   # (stream tag, "key" | "count") per RNG leaf
    streams: tuple[str, ...]

    def merge(self, params: Flat, other: Flat, rng_key: jax.Array | None = None) -> nnx.Module:
        """The module with these values; with ``rng_key`` every RNG stream is reseeded from it."""
        p = jax.tree_util.tree_unflatten(self.param_treedef, [params[n] for n in self.param_names])
        o = jax.tree_util.tree_unflatten(self.other_treedef, [other[n] for n in self.other_names])
        return nnx.merge(self.graphdef, p, self.rng_values(rng_key), o)

    def rng_values(self, rng_key: jax.Array | None) -> nnx.State:
        """Fresh RNG state: stream ``s`` gets key fold_in(rng_key, index of s) and count 0."""
        rng_key = jax.random.key(0) if rng_key is None else rng_key
        keys = {s: jax.random.fold_in(rng_key, i) for i, s in enumerate(self.streams)}
        leaves = [keys[tag] if kind == "key" else jnp.zeros((), jnp.uint32)
                  for tag, kind in self.rng_leaves]
        return jax.tree_util.tree_unflatten(self.rng_treedef, leaves)

    def other_of(self, model: nnx.Module) -> Flat:
        """The non-trainable, non-RNG variables of ``model`` (after a call may have changed them)."""
        return by_path(nnx.state(model, _OTHER))


_OTHER = nnx.Not(nnx.Any(nnx.Param, nnx.RngState))


def split(model: nnx.Module) -> tuple[ModelParts, Flat, Flat]:
    graphdef, params, rngs, other = nnx.split(model, nnx.Param, nnx.RngState, ...)
    pnames, ptree, pleaves = _flatten(params)
    onames, otree, oleaves = _flatten(other)
    rng_leaves = []
    for v in jax.tree_util.tree_leaves(rngs, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        if not isinstance(v, (nnx.RngKey, nnx.RngCount)):
            raise TypeError(f"unexpected RNG variable {type(v).__name__}")
        rng_leaves.append((v.tag, "key" if isinstance(v, nnx.RngKey) else "count"))
    rng_tree = jax.tree_util.tree_structure(rngs)
    if rng_tree.num_leaves != len(rng_leaves):
        raise RuntimeError("RNG state leaves do not match its flat state")
    streams = sorted({tag for tag, _ in rng_leaves})
    parts = ModelParts(graphdef, tuple(pnames), ptree, tuple(onames), otree, rng_tree,
                       tuple(rng_leaves), tuple(streams))
    return parts, dict(zip(pnames, pleaves)), dict(zip(onames, oleaves))
