"""The checks a config's fields go through: one line naming the valid choices (plain Python)."""

from __future__ import annotations

import numbers
from typing import Any, Sequence

MAX_INT = 2**31 - 1    # sizes and step counts reach the device as int32


def choice(name: str, value: Any, valid: Sequence[Any]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(map(str, valid))}")


def positive(name: str, value: Any, *, zero_ok: bool = False) -> None:
    ok = (isinstance(value, numbers.Integral) and not isinstance(value, bool)
          and (value >= 0 if zero_ok else value > 0))
    if not ok or value > MAX_INT:
        raise ValueError(f"{name} must be a {'non-negative' if zero_ok else 'positive'} int of at most "
                         f"{MAX_INT}, got {repr(value)[:80]}")
