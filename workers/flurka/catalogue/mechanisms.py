"""The attention mechanisms, each declared once (:data:`CATALOGUE`: its family, its layer, the
settings it reads), and what follows from them: the names, the families, the FLuRKA variants'
constituents, the no-attention control. Attention, configs, training, results, sweeps, reports
and benchmarks import this one table. Plain Python (no JAX), so a sweep's driver or a database
reader can name mechanisms without loading the layers.

FLuRKA-X (Table 5) unifies two constituents: the low-rank one (Linformer: E1, E2 compress the
keys and values from N positions to d_k) and the kernel one X (a feature map φ, or EVA).
"""

from __future__ import annotations

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """One attention mechanism: its family, its Flax layer (``module:Class`` under
    :mod:`flurka.attention`, imported only when built), its FLOP count (``module:function`` of an
    :class:`~flurka.attention.flops.AttentionShape`, the exact model of that layer) and the
    settings it reads from a config's ``attention_options`` (every other setting is ignored by
    it, so one options dict fits all)."""

    name: str
    family: str                        # one of FAMILIES
    layer: str
    flops: str
    settings: tuple[str, ...] = ()


FAMILIES = ("softmax", "low-rank", "kernel", "flurka")
LOW_RANK_SETTINGS = ("d_k", "e_init")                 # E1, E2: the compressed length and E's initialisation
E_INITS = ("pool", "gaussian")                        # E's initialisations (flurka.attention.lowrank), default first
EVA_SETTINGS = ("window_size", "chunk_size")
_A, _F = "flurka.attention.", "flurka.attention.flops:"
CATALOGUE: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("full", "softmax", _A + "full:FullAttention", _F + "softmax_layer"),
    Mechanism("flash", "softmax", _A + "flash:FlashAttention", _F + "softmax_layer"),
    Mechanism("linformer", "low-rank", _A + "linformer:LinformerAttention", _F + "linformer_layer",
              LOW_RANK_SETTINGS),
    Mechanism("performer", "kernel", _A + "performer:PerformerAttention", _F + "performer_layer",
              ("num_features",)),
    Mechanism("rnn", "kernel", _A + "rnn:RNNAttention", _F + "rnn_layer"),
    Mechanism("eva", "kernel", _A + "eva:EVAAttention", _F + "eva_layer", EVA_SETTINGS),
    Mechanism("flurka-performer", "flurka", _A + "flurka:FlurkaPerformer", _F + "flurka_performer_layer",
              (*LOW_RANK_SETTINGS, "num_features")),
    Mechanism("flurka-rnn", "flurka", _A + "flurka:FlurkaRNN", _F + "flurka_rnn_layer", LOW_RANK_SETTINGS),
    Mechanism("flurka-eva", "flurka", _A + "flurka:FlurkaEVA", _F + "flurka_eva_layer",
              (*LOW_RANK_SETTINGS, *EVA_SETTINGS)),
)}
MECHANISMS: tuple[str, ...] = tuple(CATALOGUE)
SETTINGS: tuple[str, ...] = tuple(dict.fromkeys(s for m in CATALOGUE.values() for s in m.settings))
LOW_RANK = "linformer"                                   # the low-rank constituent
KERNELS: tuple[str, ...] = tuple(n for n, m in CATALOGUE.items() if m.family == "kernel")   # the kernel constituents
FLURKA: tuple[str, ...] = tuple(n for n, m in CATALOGUE.items() if m.family == "flurka")   # flurka-X: X a kernel
KERNEL_OF: dict[str, str] = {v: v.removeprefix("flurka-") for v in FLURKA}
COMPRESSED: tuple[str, ...] = tuple(n for n, m in CATALOGUE.items() if "d_k" in m.settings)   # with E1, E2
# Compressed mechanisms whose E cannot be cut to a shorter sequence (flurka.training.init_from):
# their windows and chunks are rows of E in proportion to its length (flurka-eva)
LENGTH_BOUND: tuple[str, ...] = tuple(n for n in COMPRESSED if "window_size" in CATALOGUE[n].settings)
RANDOM_FEATURES: tuple[str, ...] = ("performer", "eva", "flurka-performer", "flurka-eva")   # drawn ω (``redraw``)
# Up-training bases (``--base``), by family: the variant's low-rank constituent or its kernel one.
BASES: tuple[str, ...] = ("low-rank", "kernel")
# The no-attention control, a task's floor: Linformer at d_k = 1, where every query sees one
# compressed row (with pooled E the mean of the sequence), so no position attends to another.
# A mechanism that does not clear it beyond noise used no attention worth the name.
CONTROL: tuple[str, int] = (LOW_RANK, 1)
CONTROL_LABEL = "no attention"                        # its row (column) in a quality table
CONTROL_NAME = "no attention (linformer d_k=1)"       # and in words


def is_control(mechanism: str, d_k: int | None) -> bool:
    """Whether a run of ``mechanism`` at ``d_k`` is the no-attention control (:data:`CONTROL`)."""
    return (mechanism, d_k) == CONTROL


def has_setting(mechanism: str, setting: str) -> bool:
    """Whether ``mechanism`` reads ``setting`` (``d_k``, ``num_features``, ...) from its options."""
    check_mechanism(mechanism)
    return setting in CATALOGUE[mechanism].settings


def resolve(reference: str):
    """The object a catalogue reference ``module:name`` names, its module imported now (so the
    catalogue itself loads no JAX)."""
    module, name = reference.split(":")
    return getattr(importlib.import_module(module), name)


def check_mechanism(mechanism: str) -> None:
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown attention mechanism {mechanism!r}; valid: {', '.join(MECHANISMS)}")


def constituents(mechanism: str) -> dict[str, str]:
    """``{"low_rank": "linformer", "kernel": X}`` for ``flurka-X``."""
    check_mechanism(mechanism)
    if mechanism not in FLURKA:
        raise ValueError(f"{mechanism!r} is not a FLuRKA variant; choose from {', '.join(FLURKA)}")
    return {"low_rank": LOW_RANK, "kernel": KERNEL_OF[mechanism]}


def base_mechanism(variant: str, base: str) -> str:
    """The mechanism of ``variant``'s up-training ``base`` ("low-rank" or "kernel", :data:`BASES`):
    flurka-rnn with "kernel" -> rnn."""
    if base not in BASES:
        raise ValueError(f"unknown up-training base {base!r}; valid: {', '.join(BASES)}")
    return constituents(variant)["low_rank" if base == "low-rank" else "kernel"]


def base_family(mechanism: str) -> str:
    """The :data:`BASES` word for a base model's mechanism: linformer -> "low-rank", rnn -> "kernel"."""
    if mechanism == LOW_RANK:
        return "low-rank"
    if mechanism in KERNELS:
        return "kernel"
    raise ValueError(f"{mechanism!r} is no up-training base; bases are {LOW_RANK} or one of {', '.join(KERNELS)}")
