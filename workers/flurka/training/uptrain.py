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

Blended hand-over (``TrainConfig.handover_steps`` = H, default 16, and ``handover_shape``,
default "ease-out", which kept the loss lower than "linear" at every H measured; H = 0 is the
abrupt switch). The variant computes a different function of the carried parameters than the
base did. For ``flurka-performer`` the gap is large: FAVOR+ on Linformer-compressed keys, whose
norms are large, is far off softmax over the same keys, already at initialisation and still at
the switch, so an abrupt switch makes the loss jump far above the base run's noise (the
measurements: benchmarks/results/cpu/NOTES.md, "Up-training hand-over"). For H steps after the
switch every attention layer of the variant is a hand-over layer (:mod:`flurka.attention.handover`): its output is
(1 − β)·base + β·variant, both computed from the same W_Q/W_K/W_V/W_O, E1/E2 and random
features, with β = ramp(j/(H + 1)) at the j-th step after the switch (j = 1..H): from 0 (the
base, at the switch) to 1 (the variant, after H steps); ``linear`` ramp(t) = t, ``ease-out``
1 − (1 − t)². Then only the variant runs. The hand-over layer has exactly the variant's parameter
paths (plus a non-trainable β per layer), so parameters and AdamW moments pass into and out of
it unchanged; β is a traced input of the jitted step, so the ramp compiles once. H is capped at
half of the variant's steps so every run ends with pure-variant training; the effective
hand-over is recorded in the result's ``switches`` entry (``handover``), and every hand-over
step's history (and eval) entry carries ``handover_beta``. α = 0 and α = 1 have no switch and
therefore no hand-over.

What the hand-over does and does not do: it removes the step at the switch, but the variant
still has to learn to work on its own, and it is mostly pushed to as β nears 1. With a short
ramp the loss therefore climbs towards the abrupt switch's level near the end of the ramp;
long, ease-out ramps keep it low. Long hand-overs also mean more training of a hybrid model,
which changes what α measures; pick H per study.

Linformer's E ~ N(0, 1/d_k) initialisation (paper §2) is kept: with E ~ N(0, 1/N) the compressed
keys are at token scale but FAVOR+ stays nearly as far off softmax, so the init is not what makes
the switch jump.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from flurka.attention.handover import BETA
from flurka.catalogue.mechanisms import base_mechanism


def phases(config) -> list[tuple[str, int, int]]:
    """``[(mechanism, first_step, end_step), ...]``: one phase, or base then variant.

    α = 0 is plain FLuRKA and α = 1 plain base training (no switch happens in either).
    """
    s, t = config.switch_step, config.steps
    if config.alpha == 0 or s == 0:
        return [(config.model.attention, 0, t)]
    base = base_mechanism(config.model.attention, config.base)
    if s >= t:
        return [(base, 0, t)]
    return [(base, 0, s), (config.model.attention, s, t)]


@dataclasses.dataclass(frozen=True)
class Stage:
    """Steps ``[first, end)`` train ``attention``; ``handover_from`` set: its hand-over layers."""

    attention: str
    first: int
    end: int
    handover_from: str | None = None


def handover_steps(config) -> int:
    """The effective hand-over length: ``config.handover_steps``, at most half of the variant's
    steps; 0 without a switch inside the run."""
    plan = phases(config)
    if len(plan) < 2:
        return 0
    _, s, t = plan[1]
    return min(int(config.handover_steps), (t - s) // 2)


def stages(config) -> list[Stage]:
    """:func:`phases` with the variant's first :func:`handover_steps` steps as a hand-over stage."""
    plan = phases(config)
    h = handover_steps(config)
    if h == 0:
        return [Stage(m, f, e) for m, f, e in plan]
    (base, _, s), (variant, _, t) = plan
    return [Stage(base, 0, s), Stage(variant, s, s + h, base), Stage(variant, s + h, t)]


def ramp(t: float, shape: str = "linear") -> float:
    """β at ramp position t ∈ [0, 1]: ``linear`` t, ``ease-out`` 1 − (1 − t)² (the base's share
    falls fast first, while the loss hardly notices, and slowly as the variant takes over)."""
    if shape == "linear":
        return t
    if shape == "ease-out":
        return 1.0 - (1.0 - t) ** 2
    raise ValueError(f"unknown handover_shape {shape!r}; valid: linear, ease-out")


def handover_beta(config, step: int) -> float:
    """β of the training step that starts at ``step`` (0-based count of steps done): the j-th
    step after the switch (j = step − switch + 1 = 1..H) has β = ramp(j / (H + 1)); 1.0 outside."""
    h, s = handover_steps(config), config.switch_step
    j = step - s + 1
    return ramp(j / (h + 1), config.handover_shape) if h and 1 <= j <= h else 1.0


def handover_info(config) -> dict | None:
    """The switch report's ``handover`` entry: steps (1-based history numbering) and β range."""
    h, s = handover_steps(config), config.switch_step
    if not h:
        return None
    return {"steps": h, "first_step": s + 1, "last_step": s + h, "from": phases(config)[0][0],
            "shape": config.handover_shape, "beta_first": handover_beta(config, s),
            "beta_last": handover_beta(config, s + h - 1)}


def set_beta(other: dict[str, Any], beta: float) -> dict[str, Any]:
    """A flat ``other`` dict with every hand-over layer's β (``.../handover_beta``) set."""
    value = jnp.asarray(beta, jnp.float32)
    return {k: (value if k == BETA or k.endswith("/" + BETA) else v) for k, v in other.items()}


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
