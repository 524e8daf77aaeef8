"""``--set FIELD=VALUE``: the one parser of config overrides, for ``flurka train`` and the sweep.

A dotted FIELD sets a field of a nested config: ``--set model.d_model=64``,
``--set model.attention_options.d_k=16`` (:func:`nested` reads them as ``{"model": {...}}``).

A value is read as a Python literal (``1e6`` the float 1e6, ``16``, ``'pool'``, ``[1, 2]``,
``{'d_k': 16}``, ``None``, ``True``); as a YAML flow collection when it is one (``{d_k: 16}``);
the words ``true``/``false``/``null`` as JSON/YAML spell them; anything else is the string as
given (``--set schedule=cosine``). YAML's 1.1 quirks (``off`` a bool, ``1e6`` a string) do not
apply: the same text means the same value in both commands.
"""

from __future__ import annotations

import ast
from typing import Any, Iterable, Mapping

from flurka.cli import one_line

_WORDS = {"true": True, "false": False, "null": None, "~": None}


def parse_value(text: str) -> Any:
    """The value ``text`` stands for (see the module docstring); ValueError if a collection is
    malformed (one line)."""
    s = text.strip()
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    if s in _WORDS:
        return _WORDS[s]
    if s and s[0] in "{[":
        import yaml

        try:
            return yaml.safe_load(s)
        except yaml.YAMLError as exc:
            reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
            raise ValueError(f"cannot parse {text!r}: {reason}") from None
    return text


def parse_assignments(items: Iterable[str], flag: str = "--set") -> dict[str, Any]:
    """``["lr=1e-3", "model.attention_options={'d_k': 16}"]`` -> ``{"lr": 0.001, ...}``; ValueError
    (one line, what was typed cut to 80 characters) for an item without ``=`` or a malformed value."""
    try:
        return _assignments(items, flag)
    except ValueError as exc:
        raise ValueError(one_line(str(exc), bare=False)) from None


def _assignments(items: Iterable[str], flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"{flag} expects FIELD=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        if not key.strip():
            raise ValueError(f"{flag} expects FIELD=VALUE, got {item!r}")
        try:
            out[key.strip()] = parse_value(value)
        except ValueError as exc:
            raise ValueError(f"{flag} {key.strip()}: {exc}") from None
    return out


def nested(*overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"model.d_model": 64, "model": {"d_ff": 128}, "steps": 8}`` ->
    ``{"model": {"d_model": 64, "d_ff": 128}, "steps": 8}``: dotted keys as nested mappings, and
    mappings merged key by key with those given before them, at every depth; several layers are
    merged the same way, in order (a later value wins)."""
    out: dict[str, Any] = {}
    for layer in overrides:
        for key, value in layer.items():
            *parents, leaf = str(key).split(".")
            node = out
            for part in parents:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            if isinstance(value, Mapping):
                value = nested(node[leaf] if isinstance(node.get(leaf), dict) else {}, value)
            node[leaf] = value
    return out


__all__ = ["parse_value", "parse_assignments", "nested"]
