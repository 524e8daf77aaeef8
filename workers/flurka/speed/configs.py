"""The paper's speed sweeps as data: one :class:`Point` per measurement.

A sweep is a list of *shapes* (N, d_model, heads, d_k, m, layers, ffn, batch); :func:`points`
crosses them with mechanisms × modes × scopes. Ranges follow the paper (§4.1, §4.3.1, app. C);
where the paper leaves a size unstated the choice is written next to it.

* ``n-sweep`` (Fig. 3): d_model 2600, 8 heads (d_h 325), d_k 1500, N = 7050, 10050, … in steps
  of 3000 to 55050, plus the paper's end point 55500.
* ``dk-sweep`` (Fig. 5 top): N 20k, head dim 128 (4 heads → d_model 512, the paper's default
  inference model), d_k 8000 → 20000 in steps of 3200 (8000, 11200, 14400, 17600) plus 20000.
* ``dmodel-sweep`` (Fig. 5 bottom): N 20k, d_k 1000, d_model 800 → 20000 in steps of 3200;
  4 heads (the paper's d_k(H+2) = 6k gives H = 4).
* ``flash-compare`` (app. C): 6 layers, FFN 512, 4 heads, N 7500 → 52500 in steps of 9000;
  d_model 512 (head dim 128, the largest cuDNN flash supports on every GPU) and d_k 1024
  (unstated in the paper).
* ``claims-boundary`` (claims 1 and 3, app. B): the N-sweep's shape (d_model 2600, 8 heads,
  d_k 1500, m 325) at N = 1560 → 16500, one layer, the low-rank and kernel mechanisms and
  FLuRKA: across both the FLOP model's crossing (FLuRKA needs fewer FLOPs than its kernel
  constituent from N ≈ 3.1k–4.1k) and the claims' boundary N > d_k(H+2) = 15000, which the
  paper calls tight; the N-sweep starts above the first at 7050.
* ``claims-boundary-small``: the same question at CPU sizes, float32 (d_model 512, 8 heads,
  d_k 128, m 64 = d_h: crossing ≈ 160–180, claims' boundary 1280).
* ``tiny``: CPU sizes for CI (every mechanism, both modes, both scopes, float32);
  ``tiny-ffn``: one model point the fused FFN block takes (d_model = FFN = 128), its dry run.

Model scope (``scope="model"``) is the paper's inference model: ``layers`` encoder blocks with an
FFN of ``ffn`` (6 and 512 unless the sweep says otherwise). ``num_features`` (m) ``None`` means
each mechanism's own default; the value used is recorded in every result. The GPU sweeps set
m = d_h, the paper's assumption in its cost model ("the kernel φ produces vectors whose
dimensionality is on the same order as the hidden dimension", app. B); EVA ignores m (its
random features are one sample per chunk).

``align`` (1 = the layer's own shapes) runs a point with aligned execution (GEMM dimensions
zero-padded to multiples of ``align``, same function; :mod:`flurka.attention.base`). ``points(...,
align=128)`` aligns the mechanisms that support it and leaves the others (EVA, flash) at 1; each
result records the value it ran with, and the FLOPs stay the FLOP model's (true shapes).
``fused`` runs the kernel mechanisms' query side as one Pallas kernel (:mod:`flurka.kernels.query_side`;
head dim and m up to 512, padded by the kernel to the blocks Triton takes).
``fused_projections`` (with ``fused``) runs the layer's W_Q and W_O inside that kernel too
(:mod:`flurka.kernels.projected_layer`, :data:`flurka.attention.PROJECTABLE`: q and the per-head
context never reach memory; d_model a multiple of 128 up to 512, a power-of-two head dim up to
128, m ≤ 128, no ``align``); in a model the low-rank layers then take the block's LayerNorm into
their kernels too (:mod:`flurka.kernels.compress`).
``fused_ffn`` (model scope) runs each block's second residual, LayerNorm and FFN as Pallas kernels
(:mod:`flurka.kernels.ffn`: d_model and FFN multiples of 128), for every mechanism alike — the
flash comparison's FLuRKA spends most of its memory traffic there; ``points(..., fused_ffn=True)``
sets it on the model points whose sizes the kernels take.
``pad_to`` (1 = none) pads the *batch*: its sequence gets ``padded_len`` = N rounded up to a
multiple of ``pad_to`` rows, the rows past N masked, and the model is built for that length (the
low-rank E is [d_k, padded_len]), as a data pipeline pads batches for the tensor cores (Hugging
Face's ``pad_to_multiple_of``). Unlike ``align`` it pads once, at the input, for every mechanism:
on a GPU, E·X over N = 52 500 (no multiple of 8) has XLA copy E and X into padded buffers every
layer whichever GEMM it picks (cuBLAS's alignment, or split-K's; benchmarks/README.md); over a
multiple of 128 it copies nothing. FLOPs stay the FLOP model's at N, and the fewest bytes count
x's N rows (and the parameters as built): the padded rows are extra work, reported as such.
``xla`` (none by default): XLA compile options the point's step is compiled with, as
(name, value) pairs (``--xla NAME=VALUE``; a row records them as a dict) — a fusion or GEMM choice
to time against XLA's default on the same card, e.g. ``xla_gpu_experimental_gemm_fusion_v2``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import re
from typing import Any, Iterable, Sequence

from flurka.attention import ALIGNABLE, FUSABLE, MECHANISMS, PROJECTABLE
from flurka.attention.base import round_up
from flurka.kernels.query_side import BLOCK as FFN_BLOCK   # the fused FFN kernels' column blocks
from flurka.kernels.projected_layer import check_projectable
from flurka.attention.performer import DEFAULT_NUM_FEATURES
from flurka.kernels.ffn import check_fusable as check_ffn_fusable

MODES: tuple[str, ...] = ("forward", "train")
SCOPES: tuple[str, ...] = ("layer", "model")
DTYPES: tuple[str, ...] = ("bfloat16", "float32")


@dataclasses.dataclass(frozen=True)
class Point:
    """One timed configuration. Field names are the result JSON's keys."""

    mechanism: str
    mode: str  # forward | train
    scope: str  # layer | model
    seq_len: int
    d_model: int
    num_heads: int
    d_k: int | None = None
    num_features: int | None = None
    layers: int = 6
    ffn: int = 512
    dtype: str = "bfloat16"
    batch: int = 1
    align: int = 1
    fused: bool = False
    pad_to: int = 1
    fused_ffn: bool = False
    fused_projections: bool = False
    xla: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        # one spelling (sorted pairs) from a dict (as a row records them) or any (name, value)s
        object.__setattr__(self, "xla", tuple(sorted(dict(self.xla).items())))
        _choice("mechanism", self.mechanism, MECHANISMS)
        _choice("mode", self.mode, MODES)
        _choice("scope", self.scope, SCOPES)
        _choice("dtype", self.dtype, DTYPES)
        for name in ("seq_len", "d_model", "num_heads", "layers", "ffn", "batch", "align",
                     "pad_to"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if self.align > 1 and self.mechanism not in ALIGNABLE:
            raise ValueError(f"{self.mechanism} does not support align (aligned execution); "
                             f"valid: {', '.join(ALIGNABLE)}")
        if self.fused and self.mechanism not in FUSABLE:
            raise ValueError(f"{self.mechanism} has no fused kernel; valid: {', '.join(FUSABLE)}")
        if self.fused_projections:
            if not self.fused or self.mechanism not in PROJECTABLE:
                raise ValueError(f"fused_projections needs fused=True and one of "
                                 f"{', '.join(PROJECTABLE)}; got {self.mechanism}, "
                                 f"fused={self.fused}")
            self.check_projectable()
        if self.fused_ffn and not self.ffn_fusable:
            raise ValueError(f"fused_ffn needs model scope and d_model, ffn multiples of "
                             f"{FFN_BLOCK}; got scope={self.scope}, d_model={self.d_model}, "
                             f"ffn={self.ffn}")

    def check_projectable(self) -> None:
        """:func:`flurka.kernels.projected_layer.check_projectable` on this point's layer."""
        features = self.num_features or (DEFAULT_NUM_FEATURES if "performer" in self.mechanism
                                         else None)
        check_projectable(self.mechanism, self.d_model, self.head_dim, features,
                          self.align if self.align > 1 else None)

    @property
    def projectable(self) -> bool:
        """Whether ``fused_projections`` can be set on this point (it is fused, its layer fits)."""
        return (self.fused and self.mechanism in PROJECTABLE
                and _passes(self.check_projectable))

    @property
    def ffn_fusable(self) -> bool:
        """Whether the fused FFN kernels take this point (:func:`flurka.kernels.ffn.check_fusable`)."""
        return self.scope == "model" and _passes(check_ffn_fusable, self.d_model, self.ffn)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def padded_len(self) -> int:
        """The batch's sequence length: N rounded up to a multiple of ``pad_to``."""
        return round_up(self.seq_len, self.pad_to)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "xla": dict(self.xla)}


def _passes(check, *args) -> bool:
    """Whether ``check(*args)`` (one of the kernels' size checks) raises no ValueError."""
    try:
        check(*args)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Shape:
    """The mechanism-independent part of a point."""

    seq_len: int
    d_model: int
    num_heads: int
    d_k: int | None
    num_features: int | None = None
    layers: int = 6
    ffn: int = 512
    batch: int = 1


@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    shapes: tuple[Shape, ...]
    mechanisms: tuple[str, ...] = MECHANISMS
    modes: tuple[str, ...] = MODES
    scopes: tuple[str, ...] = SCOPES
    dtype: str = "bfloat16"
    description: str = ""


# The mechanisms the claims compare: low-rank, the kernels and FLuRKA (no softmax over all N).
BOUNDARY_MECHANISMS = ("linformer", "performer", "rnn", "eva", "flurka-performer", "flurka-rnn",
                       "flurka-eva")


def _choice(name: str, value, choices: Sequence) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(map(str, choices))}")


def _range(start: int, stop: int, step: int) -> list[int]:
    """start, start+step, … ≤ stop (inclusive)."""
    return list(range(start, stop + 1, step))


SWEEPS: dict[str, Sweep] = {
    "n-sweep": Sweep(
        "n-sweep",
        tuple(Shape(n, 2600, 8, 1500, 325) for n in _range(7050, 55500, 3000) + [55500]),
        description="Fig. 3: step time vs sequence length, d_model 2600, 8 heads, d_k 1500"),
    "dk-sweep": Sweep(
        "dk-sweep",
        tuple(Shape(20000, 512, 4, dk, 128) for dk in _range(8000, 20000, 3200) + [20000]),
        description="Fig. 5 top: step time vs d_k, N 20k, head dim 128"),
    "dmodel-sweep": Sweep(
        "dmodel-sweep",
        tuple(Shape(20000, dm, 4, 1000, dm // 4) for dm in _range(800, 20000, 3200)),
        description="Fig. 5 bottom: step time vs d_model, N 20k, d_k 1k, 4 heads"),
    "flash-compare": Sweep(
        "flash-compare",
        tuple(Shape(n, 512, 4, 1024, 128) for n in _range(7500, 52500, 9000)),
        mechanisms=("flash", "full", "flurka-performer", "flurka-rnn", "flurka-eva"),
        scopes=("model",),
        description="Appendix C: 6-layer model, FFN 512, 4 heads vs flash attention"),
    "claims-boundary": Sweep(
        "claims-boundary",
        tuple(Shape(n, 2600, 8, 1500, 325) for n in (1560, 2000, 2500, 3000, 3500, 4000, 5000,
                                                     6000, 7050, 9000, 12000, 15000, 16500)),
        mechanisms=BOUNDARY_MECHANISMS, scopes=("layer",),
        description="Claims 1 and 3: N across the FLOP model's crossing and N = d_k(H+2)"),
    "claims-boundary-small": Sweep(
        "claims-boundary-small",
        tuple(Shape(n, 512, 8, 128, 64) for n in (128, 160, 192, 256, 384, 512, 768, 1024,
                                                  1280, 1536, 2048, 3072, 4096)),
        mechanisms=BOUNDARY_MECHANISMS, scopes=("layer",), dtype="float32",
        description="claims-boundary at CPU sizes (d_model 512, 8 heads, d_k 128; bound 1280)"),
    "tiny": Sweep(
        "tiny",
        (Shape(64, 32, 4, 16, num_features=8, layers=2, ffn=32, batch=2),),
        dtype="float32",
        description="CPU CI sizes: every mechanism, forward and train, layer and model"),
    "tiny-ffn": Sweep(
        "tiny-ffn",
        (Shape(64, 128, 4, 16, num_features=8, layers=1, ffn=128),),
        mechanisms=("flurka-rnn",), modes=("forward",), scopes=("model",), dtype="float32",
        description="CPU sizes the fused FFN block takes (d_model = FFN = 128): its dry run"),
}
SWEEP_NAMES: tuple[str, ...] = tuple(SWEEPS)


def points(sweep: str, *, mechanisms: Iterable[str] | None = None,
           modes: Iterable[str] | None = None, scopes: Iterable[str] | None = None,
           dtype: str | None = None, align: int = 1, fused: bool = False,
           pad_to: int = 1, xla: Iterable[tuple[str, Any]] = (),
           fused_ffn: bool = False, fused_projections: bool = False) -> list[Point]:
    """Every point of ``sweep`` (shape-major, then mechanism, mode, scope), optionally filtered.

    Filters must name valid values; ``dtype`` overrides the sweep's default; ``align`` and
    ``fused`` apply to the mechanisms that support them (:data:`flurka.attention.ALIGNABLE`,
    :data:`flurka.attention.FUSABLE`), ``fused_projections`` to the fused points whose layer
    takes it, ``fused_ffn`` to the model points the kernels take, ``pad_to`` and ``xla`` to
    every point.
    """
    _choice("sweep", sweep, SWEEP_NAMES)
    spec = SWEEPS[sweep]
    chosen = {}
    for name, given, valid in (("mechanism", mechanisms, MECHANISMS), ("mode", modes, MODES),
                               ("scope", scopes, SCOPES)):
        if given is None:
            chosen[name] = None
            continue
        given = tuple(given)
        for g in given:
            _choice(name, g, valid)
        chosen[name] = given
    if dtype is not None:
        _choice("dtype", dtype, DTYPES)
    out, xla = [], dict(xla)
    for shape, mech, mode, scope in itertools.product(spec.shapes, spec.mechanisms, spec.modes,
                                                      spec.scopes):
        if any(chosen[k] is not None and v not in chosen[k]
               for k, v in (("mechanism", mech), ("mode", mode), ("scope", scope))):
            continue
        point = Point(mechanism=mech, mode=mode, scope=scope, dtype=dtype or spec.dtype,
                      align=align if mech in ALIGNABLE else 1,
                      fused=fused and mech in FUSABLE, pad_to=pad_to,
                      xla=xla, **dataclasses.asdict(shape))
        out.append(dataclasses.replace(point, fused_ffn=fused_ffn and point.ffn_fusable,
                                       fused_projections=fused_projections and point.projectable))
    return out


def xla_option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` (``--xla``) as a compile option: an int, true/false, or the text."""
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("xla_"):
        raise argparse.ArgumentTypeError(f"--xla takes NAME=VALUE with an XLA option name "
                                         f"(xla_...), got {text!r}")
    if re.fullmatch(r"-?\d+", value):
        return name, int(value)
    return name, {"true": True, "false": False}.get(value.lower(), value)


def select(pts: Sequence[Point], indices: Iterable[int]) -> list[Point]:
    """``pts[i]`` for each index, with a readable error for out-of-range ones."""
    out = []
    for i in indices:
        if not 0 <= i < len(pts):
            raise ValueError(f"point index {i} out of range: this selection has {len(pts)} "
                             f"points (0..{len(pts) - 1})")
        out.append(pts[i])
    return out
