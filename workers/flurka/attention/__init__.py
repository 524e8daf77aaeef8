"""The attention family: one constructor, one call signature, swappable by name.

``make_attention(mechanism, *, d_model, num_heads, max_len, rngs, d_k=None, num_features=None,
**options)`` builds a Flax NNX multi-head self-attention layer; ``layer(x, mask=None, *, rng=None)``
maps ``[batch, seq, d_model]`` (mask ``[batch, seq]`` bool, True = real token) to the same shape.
Every layer has the projections ``query``/``key``/``value``/``out``; the low-rank ones
(``linformer``, ``flurka-*``) also have ``seq_proj`` (E1/E2), so up-training can copy parameters by
path between mechanisms.

``handover_from=<base>`` (a FLuRKA variant's up-training base: ``linformer`` or its kernel) builds
the variant's hand-over layer (:mod:`flurka.attention.handover`): same parameters and paths, output
(1 − β)·base + β·variant with β a non-trainable variable. Other mechanisms ignore it (like ``d_k``),
so one options dict fits a model whose T2T stem uses another mechanism.
"""

from __future__ import annotations

import inspect
from typing import Any

from flax import nnx

from flurka.attention.base import AttentionLayer, RandomFeatures
from flurka.attention.eva import EVAAttention, eva_attention
from flurka.attention.flash import FlashAttention, flash_attention
from flurka.mechanisms import COMPRESSED, FLURKA, MECHANISMS, RANDOM_FEATURES
from flurka.attention.flurka import FlurkaEVA, FlurkaPerformer, FlurkaRNN, compressed_eva_attention
from flurka.attention.full import FullAttention, softmax_attention
from flurka.attention.fused_layer import ProjectedQuerySide
from flurka.attention.handover import HandoverBeta, handover_class
from flurka.attention.linformer import LinformerAttention
from flurka.attention.lowrank import SeqProjection
from flurka.attention.performer import PerformerAttention, favor_attention
from flurka.attention.rnn import RNNAttention, elu_attention

_CLASSES: dict[str, type[AttentionLayer]] = {
    "full": FullAttention,
    "flash": FlashAttention,
    "linformer": LinformerAttention,
    "performer": PerformerAttention,
    "rnn": RNNAttention,
    "eva": EVAAttention,
    "flurka-performer": FlurkaPerformer,
    "flurka-rnn": FlurkaRNN,
    "flurka-eva": FlurkaEVA,
}
assert tuple(_CLASSES) == MECHANISMS, "a layer class per name of flurka.mechanisms, in its order"
# Mechanisms that accept ``align`` (aligned execution, see flurka.attention.base).
ALIGNABLE: tuple[str, ...] = tuple(m for m, c in _CLASSES.items() if not c.align_unsupported)


def _accepted_options(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            for p in inspect.signature(klass.__init__).parameters.values():
                if p.kind is p.KEYWORD_ONLY and p.name not in names:
                    names.append(p.name)
    return names


# Mechanisms that accept ``fused=True`` (the query side as a Pallas kernel, flurka.attention.fused).
FUSABLE: tuple[str, ...] = tuple(m for m, c in _CLASSES.items() if "fused" in _accepted_options(c))
# ... and ``fused_projections=True`` too (W_Q and W_O in that kernel, flurka.attention.fused_layer;
# flurka-eva takes the option only to refuse it).
PROJECTABLE: tuple[str, ...] = tuple(m for m, c in _CLASSES.items()
                                     if issubclass(c, ProjectedQuerySide))


def make_attention(mechanism: str, *, d_model: int, num_heads: int, max_len: int,
                   rngs: nnx.Rngs, d_k: int | None = None, num_features: int | None = None,
                   handover_from: str | None = None, e_init: str | None = None,
                   **options: Any) -> AttentionLayer:
    """Build the ``mechanism`` layer. ``d_k`` and ``e_init`` (low-rank: E's initialisation) and
    ``num_features`` (random-feature kernels) are ignored by mechanisms that do not use them,
    so one model config fits all."""
    if mechanism not in _CLASSES:
        raise ValueError(f"unknown attention mechanism {mechanism!r}; valid: {', '.join(MECHANISMS)}")
    cls = _CLASSES[mechanism]
    if handover_from is not None and mechanism in FLURKA:
        cls = handover_class(cls)
        options["handover_from"] = handover_from
    accepted = _accepted_options(cls)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        valid = [a for a in accepted if a not in ("d_model", "num_heads", "max_len", "rngs")]
        raise ValueError(f"{mechanism}: unknown option(s) {unknown}; valid: {valid}")
    if "d_k" in accepted:
        options["d_k"] = d_k
        if e_init is not None:
            options["e_init"] = e_init
    if "num_features" in accepted and num_features is not None:
        options["num_features"] = num_features
    return cls(d_model=d_model, num_heads=num_heads, max_len=max_len, rngs=rngs, **options)


__all__ = [
    "MECHANISMS", "ALIGNABLE", "FUSABLE", "PROJECTABLE", "COMPRESSED", "RANDOM_FEATURES", "make_attention", "AttentionLayer",
    "RandomFeatures", "SeqProjection", "HandoverBeta", "handover_class",
    "FullAttention", "FlashAttention", "LinformerAttention", "PerformerAttention", "RNNAttention",
    "EVAAttention", "FlurkaPerformer", "FlurkaRNN", "FlurkaEVA",
    "softmax_attention", "flash_attention", "favor_attention", "elu_attention", "eva_attention",
    "compressed_eva_attention",
]
