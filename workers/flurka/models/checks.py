"""Input checks on static shapes: one readable ValueError before any tracing or XLA work."""

from __future__ import annotations

import numbers
from typing import Any, Iterable

import jax.numpy as jnp


def check_positive_int(name: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(map(repr, choices))}")
    return value


def check_tokens(name: str, ids: Any, max_len: int) -> None:
    """ids must be integer [batch, seq] with seq <= max_len."""
    shape = getattr(ids, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"{name} must be [batch, seq] token ids, got shape {shape}")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    if shape[1] > max_len:
        raise ValueError(f"{name} has seq={shape[1]} > max_len={max_len}; "
                         f"truncate the data or build the model with a larger max_len")


def check_mask(name: str, mask: Any, shape: tuple[int, ...]) -> None:
    """mask must be bool with the given shape (True = real token)."""
    if getattr(mask, "shape", None) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {getattr(mask, 'shape', None)}")
    if mask.dtype != jnp.bool_:
        raise ValueError(f"{name} must be bool (True = real token), got dtype {mask.dtype}")
