"""Forward and training FLOPs of one attention layer, per mechanism: the exact model.

:func:`flop_breakdown`, :func:`forward_flops` and :func:`dot_flops` count the FLOPs of *our*
layers (``flurka.attention.*``) in the order of matrix products each module's docstring states:
projections (W_K/W_V on the d_k compressed rows for the low-rank layers), E·X compression per
``sharing``, feature maps, EVA on its padded length, flurka-eva's EVA on the compressed rows.
Its matmul part is tested against the dot products of the compiled layer
(:func:`flurka.hlo.dot_flops`; on jax 0.10 CPU it agrees to the FLOP but for EVA, whose count
leaves out the ones column its chunk half's weighted sum carries (2·C FLOPs per query and head),
and flurka-eva with a window or chunk of one compressed row, whose products over it XLA makes
multiplies); ``flash`` counts the same maths as ``full`` whichever kernel runs it. The paper's own, looser
cost model and its claims are :mod:`flurka.theory.cost_model`.

Counting convention:

* a matrix product [M, K]·[K, N] is 2·M·N·K FLOPs (one multiply + one add per multiply-add);
* elementwise work is 1 FLOP per arithmetic op per element (add, multiply, divide, exp, max,
  compare-select), and a reduction is 1 FLOP per input element. Softmax over a row of L logits
  is 5·L (max, subtract, exp, sum, divide). Reshapes, transposes, casts, gathers and slices are
  free. This part is a convention (XLA fuses and CSEs elementwise ops), so only the matmul part
  is compared with XLA;
* the bias adds of W_Q/W_K/W_V/W_O (``use_bias=True``, the layers' default) are elementwise;
* counts are for ``mask=None``: a padding mask adds one select per masked logit/row, which is
  negligible and omitted.

Training: :func:`training_flops` counts the backward pass product by product: the gradient of
each operand that needs one, at the product's own cost — so 3 × forward where every operand
needs it (the usual convention), less the gradients nothing needs: FAVOR+'s ω is a fixed buffer,
and a layer's input x needs none where it is the data itself (``input_grad=False``: a lone layer
fed data, as the speed benchmark times one), so x's gradient through W_Q (and W_K, W_V where
they read x) and through E·X is not computed. A lone layer's training step is then about
2.3–2.6 × its forward at the paper's N-sweep shape, not 3 ×, and a floor at 3 × would flatter it. Elementwise work counts 3 ×
(convention); rematerialisation and the optimizer update are left out.
"""

from __future__ import annotations

import dataclasses
import math

from flurka.catalogue.mechanisms import (CATALOGUE, FLURKA, KERNELS, LOW_RANK, MECHANISMS, constituents,
                                         has_setting, resolve)
from flurka.catalogue.mechanisms import check_mechanism as _check_mechanism

# Steps of the breakdown that are matrix products (the part compared with the HLO's dots).
DOT_STEPS: frozenset[str] = frozenset({
    "projections", "compression", "scores", "weighted_sum", "feature_projection",
    "kv_product", "query_kv_product", "normaliser", "proposal", "importance_logits",
    "chunk_values",
})
SHARINGS = ("headwise", "kv", "none")  # lowrank.SHARINGS: which E matrices exist


# ---------------------------------------------------------------------------------------------
# Shape
# ---------------------------------------------------------------------------------------------
def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """One attention layer's configuration (the FLOP model's only input).

    ``d_k`` (Linformer's projected length; paper's "downsampling factor") is needed by
    linformer and flurka-*. The others mirror the layers' options, ``None`` meaning the layer's
    default: ``num_features`` (m, FAVOR+ features per head; performer and flurka-performer),
    ``window_size`` and ``chunk_size`` (EVA's local window and control-variate chunk in
    positions, default 16 each; flurka-eva covers them with compressed rows, :func:`flurka_eva_sizes`),
    ``sharing`` (Linformer's E sharing, lowrank.SHARINGS).
    """

    batch: int
    seq_len: int
    d_model: int
    num_heads: int
    d_k: int | None = None
    num_features: int | None = None
    window_size: int | None = None
    chunk_size: int | None = None
    sharing: str = "headwise"

    def __post_init__(self):
        for name in ("batch", "seq_len", "d_model", "num_heads"):
            _positive(name, getattr(self, name))
        for name in ("d_k", "num_features", "window_size", "chunk_size"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.sharing not in SHARINGS:
            raise ValueError(f"sharing must be one of {', '.join(SHARINGS)}, got {self.sharing!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if self.d_k is not None and self.d_k > self.seq_len:
            raise ValueError(f"d_k={self.d_k} must not exceed seq_len={self.seq_len} "
                             "(the low-rank projection shortens the sequence)")

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    def require(self, mechanism: str) -> None:
        """Clear error when the mechanism needs a size the shape lacks."""
        if has_setting(mechanism, "d_k") and self.d_k is None:
            raise ValueError(f"{mechanism} needs d_k (the low-rank projected length)")


# ---------------------------------------------------------------------------------------------
# Exact model of our layers
# ---------------------------------------------------------------------------------------------
def matmul_flops(*dims: int) -> int:
    """FLOPs of a batch of matmuls: 2 × (batch dims) × M × N × K."""
    return 2 * math.prod(int(d) for d in dims)


def _merge(*parts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


def _projections(s: AttentionShape, kv_len: int) -> dict[str, int]:
    """W_Q and W_O on N rows, W_K and W_V on ``kv_len`` rows (N, or d_k after compression);
    ``nnx.Linear`` with bias (base.AttentionLayer)."""
    b, n, d = s.batch, s.seq_len, s.d_model
    rows = 2 * n + 2 * kv_len
    return {"projections": matmul_flops(b, d, d) * rows, "bias": b * d * rows}


def _compression(s: AttentionShape) -> dict[str, int]:
    """E·X over the sequence before W_K / W_V (base.compress): [d_k, N]·[N, d_m] once per
    distinct E — two (E1, E2) for ``sharing="headwise"``, one for ``"kv"``, two per head for
    ``"none"`` (per-head E: [H, d_k, N])."""
    per_e = matmul_flops(s.batch, s.d_k, s.seq_len, s.d_model)
    count = {"headwise": 2, "kv": 1, "none": 2 * s.num_heads}[s.sharing]
    return {"compression": count * per_e}


def _softmax_core(s: AttentionShape, kv_len: int) -> dict[str, int]:
    """softmax(Q Kᵀ/√d_h) V per head with ``kv_len`` keys (full.softmax_attention)."""
    rows = s.batch * s.num_heads * s.seq_len
    return {
        "scores": matmul_flops(rows, kv_len, s.d_head),
        "scale": rows * kv_len,
        "softmax": 5 * rows * kv_len,
        "weighted_sum": matmul_flops(rows, kv_len, s.d_head),
    }


def _favor_features(s: AttentionShape, rows: int) -> dict[str, int]:
    """FAVOR+ φ on ``rows`` positions (feature_maps.favor_features): x·d^-1/4, ωᵀx (a dot),
    |x|²/2, row max, then exp(dash − diag − max) + eps scaled by m^-1/2."""
    m, bh = s.num_features, s.batch * rows * s.num_heads
    return {
        "feature_projection": matmul_flops(bh, s.d_head, m),
        "feature_map": 3 * bh * s.d_head + bh + 6 * bh * m,
    }


def _elu_features(s: AttentionShape, rows: int) -> dict[str, int]:
    """elu(x) + 1 (feature_maps.elu_features): select, expm1, add per element."""
    return {"feature_map": 3 * s.batch * rows * s.d_model}


def _linear_core(s: AttentionShape, kv_len: int, f: int, denominator: int) -> dict[str, int]:
    """φ(Q)[φ(K)ᵀV] / (φ(Q)[φ(K)ᵀ1]) with f features and ``kv_len`` keys
    (feature_maps.key_side/query_side); ``denominator`` FLOPs per query row and head."""
    b, n, h, dh = s.batch, s.seq_len, s.num_heads, s.d_head
    return {
        "kv_product": matmul_flops(b, h, f, dh, kv_len),
        "key_sum": b * kv_len * h * f,
        "query_kv_product": matmul_flops(b, n, h, f, dh),
        "normaliser": matmul_flops(b, n, h, f),
        "denominator": denominator * b * n * h,
        "divide": b * n * s.d_model,
    }


PERFORMER_FEATURES = 256  # performer.DEFAULT_NUM_FEATURES, used when num_features is None
FAVOR_DENOMINATOR = 4  # r + 2·eps·[|r| <= eps]: abs, compare, multiply, add
RNN_DENOMINATOR = 1    # r + eps


def _kernel(s: AttentionShape, kernel: str, kv_len: int) -> dict[str, int]:
    """The kernel part of performer / rnn (and of their FLuRKA variants, on d_k keys)."""
    if kernel == "performer":
        s = dataclasses.replace(s, num_features=s.num_features or PERFORMER_FEATURES)
        feats = _merge(_favor_features(s, s.seq_len), _favor_features(s, kv_len))
        return _merge(feats, _linear_core(s, kv_len, s.num_features, FAVOR_DENOMINATOR))
    feats = _merge(_elu_features(s, s.seq_len), _elu_features(s, kv_len))  # rnn
    return _merge(feats, _linear_core(s, kv_len, s.d_head, RNN_DENOMINATOR))


EVA_WINDOW = 16  # eva.EVAAttention defaults (a test checks they agree)
EVA_CHUNK = 16
LAYER_NORM = 8   # per element: mean, subtract, square, mean, multiply by rsqrt, scale, shift, +eps


def eva_sizes(s: AttentionShape) -> tuple[int, int, int]:
    """(window, chunk, padded length): EVA pads N to a multiple of lcm(window, chunk)."""
    w, c = s.window_size or EVA_WINDOW, s.chunk_size or EVA_CHUNK
    unit = math.lcm(w, c)
    return w, c, -(-s.seq_len // unit) * unit


def _control_variates(s: AttentionShape, key_rows: int, chunks: int) -> dict[str, int]:
    """eva.chunk_control_variates on ``key_rows`` (padded) keys cut into ``chunks`` chunks: the
    chunk means of the keys, the adaptive proposal (Lin_q, Lin_k + LayerNorm, ω = ½(μ_q + k̃)
    + ε), self-normalised importance weights and the chunk values β."""
    b, h, dh, dm = s.batch, s.num_heads, s.d_head, s.d_model
    rows, cv = b * h * key_rows, b * chunks * h
    return {
        "chunk_means": b * key_rows * dm + b * key_rows + cv * dh,
        "proposal": 2 * matmul_flops(cv, dh, dh),
        "proposal_norm": 2 * (cv * dh + LAYER_NORM * cv * dh) + 3 * cv * dh,
        "importance_logits": matmul_flops(rows, dh),
        "importance_weights": 2 * b * key_rows * dm + 4 * rows + 5 * rows,
        "chunk_values": matmul_flops(rows, dh),
    }


def _eva(s: AttentionShape) -> dict[str, int]:
    """EVA (eva.eva_attention) on the padded length P: local windows of w, C = P/c chunk
    control variates, one joint softmax over w + C logits per query."""
    w, c, p = eva_sizes(s)
    b, h, dh, dm = s.batch, s.num_heads, s.d_head, s.d_model
    chunks, rows = p // c, b * h * p
    return _merge(_control_variates(s, p, chunks), {
        "padding_mask": 3 * b * p * dm,                            # zero_padding of q, k, v
        "chunk_means": b * p * dm + b * p + b * chunks * dm,       # query chunk means
        "scores": matmul_flops(rows, w, dh) + matmul_flops(rows, chunks, dh),        # local and chunk logits
        "scale": 2 * rows * (w + chunks),                          # × d_h^-1/2 and masking
        "softmax": 5 * rows * (w + chunks),
        "weighted_sum": matmul_flops(rows, w, dh) + matmul_flops(rows, chunks, dh),
        "combine": b * p * dm,                                     # local + chunk outputs
    })


def flurka_eva_sizes(s: AttentionShape) -> tuple[int, int, int]:
    """(window w', chunk c', padded rows) of flurka-eva in compressed rows: EVA's window and chunk
    (positions) scaled by d_k / N, at least one row each (flurka.compressed_size); the d_k rows
    padded to a multiple of lcm(w', c')."""
    w, c = (max(1, (2 * size * s.d_k + s.seq_len) // (2 * s.seq_len))
            for size in (s.window_size or EVA_WINDOW, s.chunk_size or EVA_CHUNK))
    unit = math.lcm(w, c)
    return w, c, -(-s.d_k // unit) * unit


def _flurka_eva(s: AttentionShape) -> dict[str, int]:
    """flurka.compressed_eva_attention: EVA on the d_k compressed rows (padded to P rows), each of
    the N queries attending the w' rows of its window and the C = P/c' chunk summaries, q̄ per
    chunk from the queries whose compressed position lies in it. The chunk half's weighted sum
    carries a ones column beside β (eva._joint_softmax: the softmax's denominator, d_h + 1
    wide)."""
    w, c, p = flurka_eva_sizes(s)
    b, n, h, dh, dm = s.batch, s.seq_len, s.num_heads, s.d_head, s.d_model
    chunks, rows = p // c, b * h * n
    return _merge(_control_variates(s, p, chunks), {
        "padding_mask": 2 * b * p * dm + b * n * dm,               # zero_padding of k, v and q
        "chunk_means": b * n * dm + b * n + b * chunks * dm,       # query chunk means
        "scores": matmul_flops(rows, w, dh) + matmul_flops(rows, chunks, dh),
        "scale": 2 * rows * (w + chunks),
        "softmax": 5 * rows * (w + chunks),
        "weighted_sum": matmul_flops(rows, w, dh) + matmul_flops(rows, chunks, dh + 1),
        "combine": b * n * dm,
    })


def _gradient_multiplies(mechanism: str, s: AttentionShape) -> int:
    """FLOPs of the backward products with nothing to contract, which XLA computes as
    multiplies, not dots: flurka-eva's ∂K and ∂V of the w' rows each query gathered (an outer
    product per query of its window weights' or logits' cotangent and its q or output
    cotangent), and of its chunk summaries' rows (∂k through the one logit k·ω each row has,
    ∂v through the one weight). Counted in :func:`training_flops`, left out of
    :func:`training_dot_flops`."""
    if mechanism != "flurka-eva":
        return 0
    w, _, p = flurka_eva_sizes(s)
    b, h, dh = s.batch, s.num_heads, s.d_head
    return 2 * matmul_flops(b * h * s.seq_len, w, dh) + 2 * matmul_flops(b * h * p, dh)


# One function per layer, each named by its mechanism's catalogue entry (``Mechanism.flops``).
def softmax_layer(s: AttentionShape) -> dict[str, int]:
    """full and flash: the same maths whichever kernel runs it."""
    return _merge(_projections(s, s.seq_len), _softmax_core(s, s.seq_len))


def linformer_layer(s: AttentionShape) -> dict[str, int]:
    return _merge(_compression(s), _projections(s, s.d_k), _softmax_core(s, s.d_k))


def performer_layer(s: AttentionShape) -> dict[str, int]:
    return _merge(_projections(s, s.seq_len), _kernel(s, "performer", s.seq_len))


def rnn_layer(s: AttentionShape) -> dict[str, int]:
    return _merge(_projections(s, s.seq_len), _kernel(s, "rnn", s.seq_len))


def eva_layer(s: AttentionShape) -> dict[str, int]:
    return _merge(_projections(s, s.seq_len), _eva(s))


def flurka_performer_layer(s: AttentionShape) -> dict[str, int]:
    return _merge(_compression(s), _projections(s, s.d_k), _kernel(s, "performer", s.d_k))


def flurka_rnn_layer(s: AttentionShape) -> dict[str, int]:
    return _merge(_compression(s), _projections(s, s.d_k), _kernel(s, "rnn", s.d_k))


def flurka_eva_layer(s: AttentionShape) -> dict[str, int]:
    return _merge(_compression(s), _projections(s, s.d_k), _flurka_eva(s))


def flop_breakdown(mechanism: str, shape: AttentionShape) -> dict[str, int]:
    """Forward FLOPs of one layer of ``mechanism`` per step (see the module docstring)."""
    _check_mechanism(mechanism)
    shape.require(mechanism)
    return {k: int(v) for k, v in resolve(CATALOGUE[mechanism].flops)(shape).items() if v}


def forward_flops(mechanism: str, shape: AttentionShape) -> int:
    """Exact forward FLOPs of one layer (matmuls + elementwise, our convention)."""
    return sum(flop_breakdown(mechanism, shape).values())


def dot_flops(mechanism: str, shape: AttentionShape) -> int:
    """The matrix-product part of :func:`forward_flops` (what :func:`hlo_dot_flops` measures)."""
    return sum(v for k, v in flop_breakdown(mechanism, shape).items() if k in DOT_STEPS)


def _unneeded_gradients(mechanism: str, shape: AttentionShape, input_grad: bool) -> int:
    """FLOPs of the backward products 3 × forward counts that nothing needs (module docstring):
    ω's gradient in the FAVOR+ feature projection and, without ``input_grad``, x's through the
    products that read x (W_Q; W_K and W_V unless E·X compresses x first; E·X itself)."""
    parts = flop_breakdown(mechanism, shape)
    unneeded = parts.get("feature_projection", 0)
    if not input_grad:
        reads_x = 1 if "compression" in parts else 3   # x·W_Q, and x·W_K, x·W_V without E
        unneeded += reads_x * matmul_flops(shape.batch, shape.seq_len, shape.d_model, shape.d_model)
        unneeded += parts.get("compression", 0)
    return unneeded


def training_flops(mechanism: str, shape: AttentionShape, *, input_grad: bool = True) -> int:
    """Forward + backward FLOPs of one layer (module docstring); ``input_grad``: whether the
    layer's input needs a gradient (False for a lone layer fed data; True inside a model, where
    a LayerNorm's parameters or an earlier layer need it)."""
    return 3 * forward_flops(mechanism, shape) - _unneeded_gradients(mechanism, shape, input_grad)


def training_dot_flops(mechanism: str, shape: AttentionShape, *, input_grad: bool = True) -> int:
    """The matrix-product part of :func:`training_flops` (what :func:`hlo_dot_flops` measures
    of a compiled gradient step): its backward products that contract nothing are multiplies
    (:func:`_gradient_multiplies`)."""
    return (3 * dot_flops(mechanism, shape) - _unneeded_gradients(mechanism, shape, input_grad)
            - _gradient_multiplies(mechanism, shape))


def fewer_than_constituents(mechanism: str, shape: AttentionShape) -> dict[str, bool]:
    """For ``flurka-X``: whether it needs strictly fewer exact FLOPs than linformer and than X."""
    own = forward_flops(mechanism, shape)
    return {c: own < forward_flops(c, shape) for c in constituents(mechanism).values()}


__all__ = [
    "MECHANISMS", "KERNELS", "FLURKA", "LOW_RANK", "DOT_STEPS", "SHARINGS",
    "EVA_WINDOW", "EVA_CHUNK", "PERFORMER_FEATURES", "AttentionShape", "eva_sizes",
    "flurka_eva_sizes",
    "flop_breakdown", "forward_flops", "dot_flops", "training_flops", "training_dot_flops", "constituents",
    "fewer_than_constituents",
]
