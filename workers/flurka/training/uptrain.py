"""Up-training (paper §4.2, Table 5): train a base model for α·T steps, then switch the same
model to the FLuRKA variant for the remaining steps.

The base is Linformer (``base="low-rank"``) or the variant's kernel constituent
(``base="kernel"``: performer / rnn / eva). At the switch the variant is built fresh (same seed)
and every entry whose path and shape exist in both models is carried over: parameters (W_Q, W_K,
W_V, W_O, FFN, LayerNorms, embeddings, heads, and E1/E2 when the base is low-rank), non-trainable
variables (e.g. the kernel's random features), and the optimizer state — AdamW's ``mu``/``nu``
mirror the flat parameter dict, and the step counters (``count``) carry too, so bias correction
and the learning-rate schedule continue where the base run stopped. Only what is new to the
variant keeps its fresh initialization (and zero moments).
"""

from __future__ import annotations

from typing import Any

import jax

from flurka.configs.base import base_attention


def phases(config) -> list[tuple[str, int, int]]:
    """``[(mechanism, first_step, end_step), ...]``: one phase, or base then variant.

    α = 0 is plain FLuRKA and α = 1 plain base training (no switch happens in either).
    """
    s, t = config.switch_step, config.steps
    if config.alpha == 0 or s == 0:
        return [(config.attention, 0, t)]
    base = base_attention(config.attention, config.base)
    if s >= t:
        return [(base, 0, t)]
    return [(base, 0, s), (config.attention, s, t)]


def _matching(src: dict[str, Any], dst: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    out, copied = {}, []
    for name, value in dst.items():
        old = src.get(name)
        if old is not None and old.shape == value.shape and old.dtype == value.dtype:
            out[name] = old
            copied.append(name)
        else:
            out[name] = value
    return out, copied


def carry_opt_state(src_state: Any, dst_state: Any) -> Any:
    """``dst_state`` with every leaf whose key path (and shape/dtype) exists in ``src_state``
    replaced by the source's leaf."""
    src = {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(src_state)[0]}
    paths, treedef = jax.tree_util.tree_flatten_with_path(dst_state)
    leaves = []
    for path, leaf in paths:
        old = src.get(jax.tree_util.keystr(path))
        same = (old is not None and getattr(old, "shape", None) == getattr(leaf, "shape", None)
                and getattr(old, "dtype", None) == getattr(leaf, "dtype", None))
        leaves.append(old if same else leaf)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def switch(base: dict[str, Any], variant: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Carry a base model's training state into a freshly built variant's.

    Both are ``{"params": flat, "other": flat, "opt_state": optax state}``. Returns the variant's
    new state and a report: which parameters were ``copied`` and which are ``new``.
    """
    params, copied = _matching(base["params"], variant["params"])
    other, _ = _matching(base["other"], variant["other"])
    opt_state = carry_opt_state(base["opt_state"], variant["opt_state"])
    report = {"copied": copied, "new": sorted(set(variant["params"]) - set(copied)),
              "dropped": sorted(set(base["params"]) - set(copied))}
    return {"params": params, "other": other, "opt_state": opt_state}, report
