"""Where the fused kernels plug into the layers: a registry, filled by :mod:`flurka.kernels`.

The layers and the encoder block compute their mathematics with XLA. The options ``fused``,
``fused_projections`` (attention layers) and ``fused_ffn`` (the encoder block) ask for the same
function as Pallas kernels; those live in :mod:`flurka.kernels`, which registers its entry points
here when it is imported (the speed harness, :mod:`flurka.speed`, does; so does any script that
asks for a kernel). The research layers never import the kernels, and a layer that asks for one
that is not loaded says so in one line, at construction.
"""

from __future__ import annotations

from typing import Any

_ENTRIES: dict[str, Any] = {}


def register(**entries: Any) -> None:
    """Make each ``name=function`` (or class) available to the layers under ``name``."""
    _ENTRIES.update(entries)


def kernel(name: str, option: str) -> Any:
    """The registered entry ``name``; ``option`` (the layer option that asked, e.g. ``fused=True``)
    names what needs it when :mod:`flurka.kernels` is not loaded."""
    try:
        return _ENTRIES[name]
    except KeyError:
        raise ValueError(f"{option} runs Pallas kernels, which are not loaded: import flurka.kernels "
                         "first (flurka.speed does)") from None


def layer_tiling(mechanism: str, fused: Any, head_dim: int, num_features: int | None = None) -> Any:
    """A layer's ``fused`` option resolved at construction: None (the XLA path), else the kernels'
    launch tiling for it (:func:`flurka.kernels.query_side.layer_tiling`, sizes checked)."""
    if not fused:
        return None
    return kernel("layer_tiling", "fused=True")(mechanism, fused, head_dim, num_features)
