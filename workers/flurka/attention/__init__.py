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
from flurka.catalogue.mechanisms import (CATALOGUE, COMPRESSED, FLURKA, MECHANISMS, RANDOM_FEATURES, SETTINGS,
                                         check_mechanism, has_setting, resolve)
from flurka.attention.flurka import FlurkaEVA, FlurkaPerformer, FlurkaRNN, compressed_eva_attention
from flurka.attention.full import FullAttention, softmax_attention
from flurka.attention.handover import HandoverBeta, handover_class
from flurka.attention.linformer import LinformerAttention
from flurka.attention.lowrank import SeqProjection
from flurka.attention.performer import PerformerAttention, favor_attention
from flurka.attention.projected import ProjectedQuerySide
from flurka.attention.rnn import RNNAttention, elu_attention


def layer_class(mechanism: str) -> type[AttentionLayer]:
    """``mechanism``'s layer class, as :data:`flurka.catalogue.mechanisms.CATALOGUE` names it."""
    check_mechanism(mechanism)
    return resolve(CATALOGUE[mechanism].layer)


_CLASSES: dict[str, type[AttentionLayer]] = {m: layer_class(m) for m in MECHANISMS}
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


# Mechanisms that accept ``fused=True`` (the query side as a Pallas kernel, flurka.kernels.query_side,
# loaded through flurka.attention.execution).
FUSABLE: tuple[str, ...] = tuple(m for m, c in _CLASSES.items() if "fused" in _accepted_options(c))
# ... and ``fused_projections=True`` too (W_Q and W_O in that kernel, flurka.kernels.projected_layer;
# flurka-eva takes the option only to refuse it).
PROJECTABLE: tuple[str, ...] = tuple(m for m, c in _CLASSES.items()
                                     if issubclass(c, ProjectedQuerySide))


def make_attention(mechanism: str, *, d_model: int, num_heads: int, max_len: int,
                   rngs: nnx.Rngs, d_k: int | None = None, num_features: int | None = None,
                   handover_from: str | None = None, e_init: str | None = None,
                   **options: Any) -> AttentionLayer:
    """Build the ``mechanism`` layer. The settings of :data:`flurka.catalogue.mechanisms.SETTINGS` (``d_k``,
    ``e_init``, ``num_features``, EVA's ``window_size`` and ``chunk_size``) go to the mechanisms
    that read them and are ignored by the rest, so one model config fits all (an up-training
    run's base and its variant, a T2T stem's mechanism); any other option must be the layer's."""
    check_mechanism(mechanism)
    settings = {"d_k": d_k, "e_init": e_init, "num_features": num_features,
                **{name: options.pop(name) for name in SETTINGS if name in options}}
    cls = _CLASSES[mechanism]
    if handover_from is not None and mechanism in FLURKA:
        cls = handover_class(cls)
        options["handover_from"] = handover_from
    accepted = _accepted_options(cls)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        valid = [a for a in accepted if a not in ("d_model", "num_heads", "max_len", "rngs")]
        raise ValueError(f"{mechanism}: unknown option(s) {unknown}; valid: {valid}")
    options.update({name: value for name, value in settings.items()
                    if has_setting(mechanism, name) and (value is not None or name == "d_k")})
    return cls(d_model=d_model, num_heads=num_heads, max_len=max_len, rngs=rngs, **options)


__all__ = [
    "MECHANISMS", "ALIGNABLE", "FUSABLE", "PROJECTABLE", "COMPRESSED", "RANDOM_FEATURES", "make_attention", "AttentionLayer",
    "RandomFeatures", "SeqProjection", "HandoverBeta", "handover_class",
    "FullAttention", "FlashAttention", "LinformerAttention", "PerformerAttention", "RNNAttention",
    "EVAAttention", "FlurkaPerformer", "FlurkaRNN", "FlurkaEVA",
    "softmax_attention", "flash_attention", "favor_attention", "elu_attention", "eva_attention",
    "compressed_eva_attention",
]
