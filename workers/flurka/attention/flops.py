"""Forward FLOPs of one attention layer, per mechanism, and the paper's regime claims.

Two models live here, on purpose:

* the **exact model** (:func:`flop_breakdown`, :func:`forward_flops`, :func:`dot_flops`) counts
  the FLOPs of *our* layers (``flurka.attention.*``) in the order of matrix products each
  module's docstring states: projections (W_K/W_V on the d_k compressed rows for the low-rank
  layers), E·X compression per ``sharing``, feature maps, EVA on its padded length, flurka-eva's
  exact rows + chunk control variates. Its matmul part is checked against the dot products of
  the compiled layer (:func:`hlo_dot_flops`; on jax 0.10 CPU it agrees to the FLOP for all nine
  mechanisms); ``flash`` counts the same maths as ``full`` whichever kernel runs it;
* the **paper's cost model** (appendix B, eqs. low-rank-cum / kernel-cum / swift-cum:
  :func:`paper_cost`) and the three claims stated on it (:func:`claim1`, :func:`claim2`,
  :func:`claim3`). They are kept verbatim because the claims are inequalities *of that model*.

Counting convention (exact model):

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

import collections
import dataclasses
import math
import re

from flurka.mechanisms import FLURKA, KERNELS, LOW_RANK, MECHANISMS, constituents
from flurka.mechanisms import check_mechanism as _check_mechanism

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
    ``window_size`` (eva: local window, default 16; flurka-eva: compressed rows attended
    exactly, default d_k // 4, may be 0), ``chunk_size`` (EVA's control-variate chunk, default
    16), ``sharing`` (Linformer's E sharing, lowrank.SHARINGS).
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
        for name in ("d_k", "num_features", "chunk_size"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        w = self.window_size
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 0):
            raise ValueError(f"window_size must be a non-negative integer, got {w!r}")
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
        if (mechanism == LOW_RANK or mechanism in FLURKA) and self.d_k is None:
            raise ValueError(f"{mechanism} needs d_k (the low-rank projected length)")
        if mechanism == "eva" and self.window_size == 0:
            raise ValueError("eva needs window_size >= 1 (its local window)")
        w = self.window_size
        if mechanism == "flurka-eva" and w is not None and w > self.d_k:
            raise ValueError(f"flurka-eva: window_size={self.window_size} (exact compressed rows) "
                             f"must be <= d_k={self.d_k}")


# ---------------------------------------------------------------------------------------------
# Exact model of our layers
# ---------------------------------------------------------------------------------------------
def _mm(*dims: int) -> int:
    """FLOPs of a batch of matmuls: 2 × (batch dims) × M × N × K."""
    return 2 * math.prod(dims)


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
    return {"projections": _mm(b, d, d) * rows, "bias": b * d * rows}


def _compression(s: AttentionShape) -> dict[str, int]:
    """E·X over the sequence before W_K / W_V (base.compress): [d_k, N]·[N, d_m] once per
    distinct E — two (E1, E2) for ``sharing="headwise"``, one for ``"kv"``, two per head for
    ``"none"`` (per-head E: [H, d_k, N])."""
    per_e = _mm(s.batch, s.d_k, s.seq_len, s.d_model)
    count = {"headwise": 2, "kv": 1, "none": 2 * s.num_heads}[s.sharing]
    return {"compression": count * per_e}


def _softmax_core(s: AttentionShape, kv_len: int) -> dict[str, int]:
    """softmax(Q Kᵀ/√d_h) V per head with ``kv_len`` keys (full.softmax_attention)."""
    rows = s.batch * s.num_heads * s.seq_len
    return {
        "scores": _mm(rows, kv_len, s.d_head),
        "scale": rows * kv_len,
        "softmax": 5 * rows * kv_len,
        "weighted_sum": _mm(rows, kv_len, s.d_head),
    }


def _favor_features(s: AttentionShape, rows: int) -> dict[str, int]:
    """FAVOR+ φ on ``rows`` positions (feature_maps.favor_features): x·d^-1/4, ωᵀx (a dot),
    |x|²/2, row max, then exp(dash − diag − max) + eps scaled by m^-1/2."""
    m, bh = s.num_features, s.batch * rows * s.num_heads
    return {
        "feature_projection": _mm(bh, s.d_head, m),
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
        "kv_product": _mm(b, h, f, dh, kv_len),
        "key_sum": b * kv_len * h * f,
        "query_kv_product": _mm(b, n, h, f, dh),
        "normaliser": _mm(b, n, h, f),
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
        "proposal": 2 * _mm(cv, dh, dh),
        "proposal_norm": 2 * (cv * dh + LAYER_NORM * cv * dh) + 3 * cv * dh,
        "importance_logits": _mm(rows, dh),
        "importance_weights": 2 * b * key_rows * dm + 4 * rows + 5 * rows,
        "chunk_values": _mm(rows, dh),
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
        "scores": _mm(rows, w, dh) + _mm(rows, chunks, dh),        # local and chunk logits
        "scale": 2 * rows * (w + chunks),                          # × d_h^-1/2 and masking
        "softmax": 5 * rows * (w + chunks),
        "weighted_sum": _mm(rows, w, dh) + _mm(rows, chunks, dh),
        "combine": b * p * dm,                                     # local + chunk outputs
    })


def flurka_eva_sizes(s: AttentionShape) -> tuple[int, int, int]:
    """(exact compressed rows W, chunk, chunks) of flurka-eva: W defaults to d_k // 4."""
    w = s.d_k // 4 if s.window_size is None else s.window_size
    c = s.chunk_size or EVA_CHUNK
    return w, c, -(-(s.d_k - w) // c)


def _flurka_eva(s: AttentionShape) -> dict[str, int]:
    """flurka.compressed_eva_attention on d_k compressed keys: W of them attended exactly, the
    other d_k − W summarised by chunk control variates; the query proposal uses the mean of all
    queries, broadcast to every chunk (so Lin_q runs once per chunk)."""
    w, c, chunks = flurka_eva_sizes(s)
    b, n, h, dh, dm = s.batch, s.seq_len, s.num_heads, s.d_head, s.d_model
    rows, logits = b * h * n, w + chunks
    parts = {
        "scores": _mm(rows, logits, dh),
        "scale": rows * w + 2 * rows * chunks,                     # × d_h^-1/2; chunk masking
        "softmax": 5 * rows * logits,
        "weighted_sum": _mm(rows, logits, dh),
    }
    if chunks:
        parts = _merge(parts, _control_variates(s, chunks * c, chunks),
                       {"chunk_means": b * n * dm + b * n + b * dm})  # mean query
    return parts


def _exact(mechanism: str, s: AttentionShape) -> dict[str, int]:
    if mechanism in ("full", "flash"):
        return _merge(_projections(s, s.seq_len), _softmax_core(s, s.seq_len))
    if mechanism == LOW_RANK:
        return _merge(_compression(s), _projections(s, s.d_k), _softmax_core(s, s.d_k))
    if mechanism == "eva":
        return _merge(_projections(s, s.seq_len), _eva(s))
    if mechanism in KERNELS:
        return _merge(_projections(s, s.seq_len), _kernel(s, mechanism, s.seq_len))
    kernel = mechanism.removeprefix("flurka-")
    core = _flurka_eva(s) if kernel == "eva" else _kernel(s, kernel, s.d_k)
    return _merge(_compression(s), _projections(s, s.d_k), core)


def flop_breakdown(mechanism: str, shape: AttentionShape) -> dict[str, int]:
    """Forward FLOPs of one layer of ``mechanism`` per step (see the module docstring)."""
    _check_mechanism(mechanism)
    shape.require(mechanism)
    return {k: int(v) for k, v in _exact(mechanism, shape).items() if v}


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
        unneeded += reads_x * _mm(shape.batch, shape.seq_len, shape.d_model, shape.d_model)
        unneeded += parts.get("compression", 0)
    return unneeded


def training_flops(mechanism: str, shape: AttentionShape, *, input_grad: bool = True) -> int:
    """Forward + backward FLOPs of one layer (module docstring); ``input_grad``: whether the
    layer's input needs a gradient (False for a lone layer fed data; True inside a model, where
    a LayerNorm's parameters or an earlier layer need it)."""
    return 3 * forward_flops(mechanism, shape) - _unneeded_gradients(mechanism, shape, input_grad)


def training_dot_flops(mechanism: str, shape: AttentionShape, *, input_grad: bool = True) -> int:
    """The matrix-product part of :func:`training_flops` (what :func:`hlo_dot_flops` measures
    of a compiled gradient step)."""
    return 3 * dot_flops(mechanism, shape) - _unneeded_gradients(mechanism, shape, input_grad)


def fewer_than_constituents(mechanism: str, shape: AttentionShape) -> dict[str, bool]:
    """For ``flurka-X``: whether it needs strictly fewer exact FLOPs than linformer and than X."""
    own = forward_flops(mechanism, shape)
    return {c: own < forward_flops(c, shape) for c in constituents(mechanism).values()}


# ---------------------------------------------------------------------------------------------
# The paper's approximate cost model and claims (appendix B)
# ---------------------------------------------------------------------------------------------
PAPER_KINDS = ("low-rank", "kernel", "flurka")


def paper_cost(kind: str, N: float, d_m: float, d_k: float, d_h: float, H: float) -> float:
    """Appendix B's cumulative runtime of one MHSA layer (eqs. low-rank-cum, kernel-cum,
    swift-cum), in the paper's notation: d_h is the head hidden size, which the paper also takes
    as the kernel's feature dimension. Counts multiply-adds loosely; only differences matter."""
    if kind == "low-rank":
        return 2 * N * d_k * d_m + N * d_m**2 + 2 * d_k * d_m**2 + N * d_m * d_k + N * H * d_k \
            + N * d_k * d_m
    if kind == "kernel":
        return 3 * N * d_m**2 + 2 * N * d_m + 2 * N * d_m * d_h
    if kind == "flurka":
        return 2 * N * d_k * d_m + N * d_m**2 + 2 * d_k * d_m**2 + N * d_m + d_m * d_k \
            + d_k * d_m * d_h + N * d_h * d_m
    raise ValueError(f"unknown cost kind {kind!r}; choose from {', '.join(PAPER_KINDS)}")


def claim1(N: float, d_m: float, d_k: float, d_h: float, H: float) -> bool:
    """Claim 1 (§3): N > d_k(H+2) > d_m > d_k > d_h ⇒ FLuRKA beats both constituents."""
    return N > d_k * (H + 2) > d_m > d_k > d_h


def claim2(N: float, d_k: float, d_h: float) -> bool:
    """Claim 2 (app. B): N − 1 > d_k > d_h ⇒ FLuRKA beats low-rank."""
    return N - 1 > d_k > d_h


def claim3(N: float, d_m: float, d_k: float, H: float) -> bool:
    """Claim 3 (app. B): N > d_k(H+2) and d_m > d_k ⇒ FLuRKA beats kernel methods."""
    return N > d_k * (H + 2) and d_m > d_k


def claims(shape: AttentionShape) -> dict[str, bool]:
    """The three claims at a layer shape (paper's d_h = our head size d_model / heads)."""
    if shape.d_k is None:
        raise ValueError("the paper's claims need d_k (the low-rank projected length)")
    return claims_at(shape.seq_len, shape.d_model, shape.d_k, shape.num_heads)


def claims_at(N: float, d_m: float, d_k: float, H: float) -> dict[str, bool]:
    """The three claims at raw sizes (measured rows: no shape validation), d_h = d_m // H."""
    d_h = d_m // H
    return {"claim1": claim1(N, d_m, d_k, d_h, H), "claim2": claim2(N, d_k, d_h),
            "claim3": claim3(N, d_m, d_k, H)}


def paper_speedup_at(kind: str, N: float, d_m: float, d_k: float, H: float) -> float:
    """FLuRKA's speedup over ``kind`` ("low-rank" or "kernel") by the paper's cost model
    (:func:`paper_cost`) at raw sizes, d_h = d_m // H."""
    d_h = d_m // H
    return paper_cost(kind, N, d_m, d_k, d_h, H) / paper_cost("flurka", N, d_m, d_k, d_h, H)


def claim_bounds(d_m: float, d_k: float, H: float) -> dict[str, float | None]:
    """The N above which the claims promise FLuRKA beats each constituent, at raw sizes: low-rank
    by claim 2 (N > d_k + 1, given d_k > d_h), the kernel by claim 3 (N > d_k(H+2), given
    d_m > d_k; claim 1's N bound too); None where the size condition fails."""
    d_h = d_m // H
    return {"low-rank": d_k + 1 if d_k > d_h else None,
            "kernel": d_k * (H + 2) if d_m > d_k else None}


# ---------------------------------------------------------------------------------------------
# FLOPs of the dot products in compiled HLO
# ---------------------------------------------------------------------------------------------
_COMP_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"^[a-z]\w*\[([\d,\s]*)\]")
_CALLEE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)"
                     r"=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


def _split_shape(rest: str) -> tuple[str, str]:
    """'f32[2,3]{1,0} dot(...)' -> ('f32[2,3]{1,0}', 'dot(...)'); tuples kept whole."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return rest[: i + 1], rest[i + 1:].lstrip()
    head, _, tail = rest.partition(" ")
    return head, tail


def _dims(shape: str) -> tuple[int, ...] | None:
    m = _ARRAY.match(shape)
    if m is None:
        return None
    return tuple(int(x) for x in m.group(1).replace(" ", "").split(",") if x)


def _int_list(attrs: str, key: str) -> tuple[int, ...]:
    m = re.search(rf"\b{key}=\{{([\d,\s]*)\}}", attrs)
    return tuple(int(x) for x in m.group(1).replace(" ", "").split(",") if x) if m else ()


def _operand_names(call: str) -> list[str]:
    """Operand names of 'op(a, b), attrs' (handles '%a', 'a' and 'f32[..]{..} %a' forms)."""
    depth, start, names = 0, call.find("(") + 1, []
    for i in range(start, len(call)):
        ch = call[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:  # the operand list's closing paren
                names.append(call[start:i])
                break
            depth -= 1
        elif ch == "," and depth == 0:
            names.append(call[start:i])
            start = i + 1
    return [n.split()[-1].lstrip("%") for n in names if n.strip()]


def _parse_hlo(text: str):
    """{computation: [(name, shape, opcode, call)]} and the entry computation's name."""
    comps: dict[str, list[tuple[str, str, str, str]]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = None if " = " in line else _COMP_HEADER.match(line.strip())
        if header:
            current = header.group(2)
            comps[current] = []
            if header.group(1):
                entry = current
            continue
        if current is None:
            continue
        if line.strip() == "}":
            current = None
            continue
        instr = _INSTR.match(line)
        if instr:
            shape, call = _split_shape(instr.group(2))
            opcode = call.partition("(")[0].strip()
            comps[current].append((instr.group(1), shape, opcode, call))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text (pass compiled.as_text())")
    return comps, entry


def _gemm_contracting(call: str) -> tuple[int, ...] | None:
    """lhs contracting dims of a GPU library GEMM custom-call (cuBLAS/cuBLASLt), whose
    backend_config carries the dot's dimension numbers; None for other custom-calls."""
    m = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', call)
    return None if m is None else tuple(int(x) for x in re.findall(r"\d+", m.group(1)))


def _operand_types(lhs: str, rhs: str) -> str:
    """'bf16' when both dot operands are bf16, 'bf16×f32' when they differ (XLA then computes in
    the wider type)."""
    a, b = (s.partition("[")[0] for s in (lhs, rhs))
    return a if a == b else "×".join(sorted((a, b)))


def _own_dot_flops(instrs) -> collections.Counter:
    shapes = {name: shape for name, shape, _, _ in instrs}
    total: collections.Counter = collections.Counter()
    for _, shape, opcode, call in instrs:
        gemm = None
        if opcode == "custom-call":
            target = re.search(r'custom_call_target="([^"]*)"', call)
            target = target.group(1).lower() if target else ""
            if "fmha" in target or "attention" in target:
                raise ValueError("fused attention custom-call (cuDNN flash) has no dot to count; "
                                 "use flops.forward_flops('flash', shape) instead")
            if "triton" in target or "mosaic" in target:
                raise ValueError("Pallas kernel custom-call (fused query side) has no dot to "
                                 "count; use the FLOP model instead")
            if "gemm" in target or "matmul" in target:
                gemm = _gemm_contracting(call)
            if gemm is None:
                continue
        if opcode not in ("dot", "convolution", "custom-call"):
            continue
        out = _dims(shape.lstrip("("))  # a GEMM custom-call returns (result, workspace)
        ops = _operand_names(call)
        if out is None or len(ops) < 2:
            raise ValueError(f"cannot read operands of: {opcode} {call[:120]}")
        lhs_shape, rhs_shape = shapes.get(ops[0], ""), shapes.get(ops[1], "")
        lhs, rhs = _dims(lhs_shape), _dims(rhs_shape)
        if lhs is None or rhs is None:
            raise ValueError(f"unknown operand shape in: {call[:120]}")
        if opcode == "dot":
            contracted = math.prod(lhs[i] for i in _int_list(call, "lhs_contracting_dims"))
        elif opcode == "custom-call":
            contracted = math.prod(lhs[i] for i in gemm)
        else:  # each output element: prod(kernel dims but the output-feature one) MACs
            labels = re.search(r"dim_labels=\w+_(\w+)->", call)
            if labels is None:
                raise ValueError(f"convolution without dim_labels: {call[:120]}")
            contracted = math.prod(d for d, c in zip(rhs, labels.group(1)) if c != "o")
        total[_operand_types(lhs_shape, rhs_shape)] += 2 * math.prod(out) * contracted
    return total


def hlo_dot_flops(compiled_text: str) -> int:
    """FLOPs of every dot / convolution in an HLO module's text (``compiled.as_text()``).

    A dot counts 2 · prod(output dims) · prod(contracting dims); a convolution
    2 · prod(output dims) · prod(kernel dims except output features) (padding not subtracted);
    a GPU GEMM custom-call (cuBLAS, from its dot_dimension_numbers) like a dot. A fused-attention
    custom-call (cuDNN flash) or a Pallas kernel (Triton / Mosaic GPU) is an error: its FLOPs are
    not visible as dots.
    Each computation counts once per call: fusions/calls once, while bodies × their known trip
    count, conditional branches each once (an upper bound). A while loop with dots and no known
    trip count is an error rather than a silent undercount.
    """
    return sum(hlo_dot_flops_by_type(compiled_text).values())


def hlo_dot_flops_by_type(hlo_text: str) -> dict[str, int]:
    """:func:`hlo_dot_flops` split by the dots' operand element types ({"bf16": …, "f32": …};
    mixed operands as "bf16×f32"). Read from the *unoptimised* HLO it shows what the program asks
    the matrix units for: a bf16 step's f32 share runs as float32 GEMMs (TF32 at best)."""
    comps, entry = _parse_hlo(text=hlo_text)
    memo: dict[str, collections.Counter] = {}

    def total(comp: str) -> collections.Counter:
        if comp in memo:
            return memo[comp]
        flops = _own_dot_flops(comps[comp])
        for _, _, opcode, call in comps[comp]:
            callees = [c for _, c in _CALLEE.findall(call)]
            branches = _BRANCHES.search(call)
            if branches:
                callees += re.findall(r"%?([\w.\-]+)", branches.group(1))
            for callee in callees:
                if callee not in comps:
                    continue
                sub = total(callee)
                if opcode == "while" and re.search(rf"body=%?{re.escape(callee)}\b", call) and sub:
                    trip = _TRIP.search(call)
                    if trip is None:
                        raise ValueError("while loop with dot products and no known trip count")
                    sub = collections.Counter({k: v * int(trip.group(1)) for k, v in sub.items()})
                flops = flops + sub
        memo[comp] = flops
        return flops

    return dict(total(entry))


def compiled_dot_flops(compiled) -> int:
    """:func:`hlo_dot_flops` of a ``jax.stages.Compiled`` (``jit(f).lower(...).compile()``)."""
    return hlo_dot_flops(compiled.as_text())


__all__ = [
    "MECHANISMS", "KERNELS", "FLURKA", "LOW_RANK", "DOT_STEPS", "PAPER_KINDS", "SHARINGS",
    "EVA_WINDOW", "EVA_CHUNK", "PERFORMER_FEATURES", "AttentionShape", "eva_sizes",
    "flurka_eva_sizes",
    "flop_breakdown", "forward_flops", "dot_flops", "training_flops", "training_dot_flops", "constituents",
    "fewer_than_constituents", "paper_cost", "paper_speedup_at", "claim1", "claim2", "claim3", "claims", "claims_at", "claim_bounds",
    "hlo_dot_flops", "hlo_dot_flops_by_type", "compiled_dot_flops",
]
