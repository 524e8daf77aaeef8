"""FLOP model: the HLO dot counter, the paper's cost model and claims, and the exact model of
each layer checked against the dot products XLA compiles for it."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flurka.attention import flops as F

PAPER = dict(d_m=2600, d_k=1500, d_h=325, H=8)  # appendix B / §4.1 sequence-length sweep


# ---------------------------------------------------------------------------------------------
# HLO dot counter
# ---------------------------------------------------------------------------------------------
def _compile(f, *args):
    return jax.jit(f).lower(*args).compile()


@pytest.mark.parametrize("m,k,n", [(8, 16, 4), (33, 7, 65), (128, 64, 96)])
def test_hlo_counter_plain_matmul(m, k, n):
    c = _compile(jnp.matmul, jnp.ones((m, k)), jnp.ones((k, n)))
    assert F.compiled_dot_flops(c) == 2 * m * n * k


def test_hlo_counter_batched_chain_agrees_with_xla():
    def f(a, b, c):
        return jnp.einsum("bnd,bmd->bnm", a, b) @ c

    c = _compile(f, jnp.ones((2, 64, 16)), jnp.ones((2, 32, 16)), jnp.ones((2, 32, 8)))
    expected = 2 * 2 * 64 * 32 * 16 + 2 * 2 * 64 * 8 * 32
    assert F.compiled_dot_flops(c) == expected
    assert c.cost_analysis()["flops"] == expected  # XLA's own count: only dots here


def test_hlo_counter_multiplies_loop_bodies_by_trip_count():
    def f(a, w):
        return jax.lax.scan(lambda c, x: (c @ w + x, None), a, jnp.ones((5,) + a.shape))[0]

    c = _compile(f, jnp.ones((8, 16)), jnp.ones((16, 16)))
    assert F.compiled_dot_flops(c) == 5 * 2 * 8 * 16 * 16


def test_hlo_counter_convolution():
    # 1-D conv, 2 groups: every output element is (kernel width 3) × (2 input features) MACs.
    def f(x, k):
        return jax.lax.conv_general_dilated(x, k, (1,), "VALID", feature_group_count=2)

    c = _compile(f, jnp.ones((2, 4, 10)), jnp.ones((6, 2, 3)))
    assert F.compiled_dot_flops(c) == 2 * (2 * 6 * 8) * (3 * 2)


# GPU-compiled HLO cannot be produced on a CPU machine; these texts follow XLA's GPU output
# (gemm_rewriter: cuBLAS custom-calls returning (result, workspace) with dot_dimension_numbers).
GPU_GEMM_HLO = """HloModule jit_f, is_scheduled=true

ENTRY %main.3 (a.1: f32[4,32,64], b.1: f32[4,64,16]) -> f32[4,32,16] {
  %a.1 = f32[4,32,64]{2,1,0} parameter(0)
  %b.1 = f32[4,64,16]{2,1,0} parameter(1)
  %custom-call.1 = (f32[4,32,16]{2,1,0}, s8[4194304]{0}) custom-call(f32[4,32,64]{2,1,0} %a.1, \
f32[4,64,16]{2,1,0} %b.1), custom_call_target="__cublas$gemm", backend_config={"operation_queue_id":"0",\
"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":\
["2"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  ROOT %get-tuple-element.1 = f32[4,32,16]{2,1,0} get-tuple-element((f32[4,32,16]{2,1,0}, \
s8[4194304]{0}) %custom-call.1), index=0
}
"""


def test_hlo_counter_gpu_gemm_custom_call():
    assert F.hlo_dot_flops(GPU_GEMM_HLO) == 2 * 4 * 32 * 16 * 64
    assert F.hlo_dot_flops_by_type(GPU_GEMM_HLO) == {"f32": 2 * 4 * 32 * 16 * 64}
    mixed = GPU_GEMM_HLO.replace("%b.1 = f32[4,64,16]", "%b.1 = bf16[4,64,16]")
    assert F.hlo_dot_flops_by_type(mixed) == {"bf16×f32": 2 * 4 * 32 * 16 * 64}


def test_hlo_counter_refuses_what_it_cannot_count():
    fmha = GPU_GEMM_HLO.replace('"__cublas$gemm"', '"__cudnn$fmhaSoftmax"').replace(
        '"dot_dimension_numbers"', '"bmm1_dot_dimension_numbers"')
    with pytest.raises(ValueError, match="fused attention"):
        F.hlo_dot_flops(fmha)
    pallas = GPU_GEMM_HLO.replace('"__cublas$gemm"', '"__gpu$xla.gpu.triton"')
    with pytest.raises(ValueError, match="Pallas kernel"):
        F.hlo_dot_flops(pallas)
    loop = """HloModule m

%body (p: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %p = (s32[], f32[8,8]{1,0}) parameter(0)
  %x = f32[8,8]{1,0} get-tuple-element(%p), index=1
  %d = f32[8,8]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[8,8]{1,0}) tuple(%i, %d)
}

%cond (p.1: (s32[], f32[8,8])) -> pred[] {
  %p.1 = (s32[], f32[8,8]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[8,8]) -> f32[8,8] {
  %a = f32[8,8]{1,0} parameter(0)
  %z = s32[] constant(0)
  %t0 = (s32[], f32[8,8]{1,0}) tuple(%z, %a)
  %w = (s32[], f32[8,8]{1,0}) while(%t0), condition=%cond, body=%body
  ROOT %r = f32[8,8]{1,0} get-tuple-element(%w), index=1
}
"""
    with pytest.raises(ValueError, match="no known trip count"):
        F.hlo_dot_flops(loop)
    trip = 'body=%body, backend_config={"known_trip_count":{"n":"7"}}'
    with_trip = loop.replace("body=%body", trip)
    assert F.hlo_dot_flops(with_trip) == 7 * 2 * 8 * 8 * 8


def test_hlo_counter_rejects_non_hlo():
    with pytest.raises(ValueError, match="ENTRY"):
        F.hlo_dot_flops("not an hlo module")


# ---------------------------------------------------------------------------------------------
# Paper's cost model and claims (appendix B)
# ---------------------------------------------------------------------------------------------
def test_paper_cost_terms():
    # Each equation at a point where every term is distinguishable (powers of different primes).
    N, d_m, d_k, d_h, H = 7.0, 3.0, 2.0, 5.0, 11.0
    low = 2*N*d_k*d_m + N*d_m**2 + 2*d_k*d_m**2 + N*d_m*d_k + N*H*d_k + N*d_k*d_m
    ker = 3*N*d_m**2 + 2*N*d_m + 2*N*d_m*d_h
    swift = 2*N*d_k*d_m + N*d_m**2 + 2*d_k*d_m**2 + N*d_m + d_m*d_k + d_k*d_m*d_h + N*d_h*d_m
    assert F.paper_cost("low-rank", N, d_m, d_k, d_h, H) == low
    assert F.paper_cost("kernel", N, d_m, d_k, d_h, H) == ker
    assert F.paper_cost("flurka", N, d_m, d_k, d_h, H) == swift
    with pytest.raises(ValueError, match="low-rank, kernel, flurka"):
        F.paper_cost("sparse", N, d_m, d_k, d_h, H)
    # the speedup at raw sizes, d_h = d_m // H: here 55 // 11 = 5, the point above with d_m = 55
    d_m = 55.0
    low = 2*N*d_k*d_m + N*d_m**2 + 2*d_k*d_m**2 + N*d_m*d_k + N*H*d_k + N*d_k*d_m
    swift = 2*N*d_k*d_m + N*d_m**2 + 2*d_k*d_m**2 + N*d_m + d_m*d_k + d_k*d_m*d_h + N*d_h*d_m
    assert F.paper_speedup_at("low-rank", N, d_m, d_k, H) == pytest.approx(low / swift, rel=1e-15)


def test_claims_at_the_papers_configurations():
    assert F.claim1(55500, **PAPER)
    assert not F.claim1(7050, **PAPER)  # d_k(H+2) = 15000 > 7050
    assert F.claim2(7050, PAPER["d_k"], PAPER["d_h"])
    assert not F.claim3(7050, PAPER["d_m"], PAPER["d_k"], PAPER["H"])
    s = F.AttentionShape(1, 55500, 2600, 8, d_k=1500, num_features=325)
    assert F.claims(s) == {"claim1": True, "claim2": True, "claim3": True}
    # the N thresholds: the claims' predicates switch exactly there (strict inequalities)
    assert F.claim_bounds(2600, 1500, 8) == {"low-rank": 1501, "kernel": 15000}
    for n, expected in ((1501, False), (1502, True)):
        assert F.claims_at(n, 2600, 1500, 8)["claim2"] is expected
    for n, expected in ((15000, False), (15001, True)):
        assert F.claims_at(n, 2600, 1500, 8)["claim3"] is expected
    assert F.claim_bounds(512, 1024, 8) == {"low-rank": 1025, "kernel": None}    # d_m ≤ d_k
    assert F.claim_bounds(2600, 300, 8) == {"low-rank": None, "kernel": 3000}    # d_k ≤ d_h = 325


def test_claims_imply_the_cost_inequalities_they_state():
    """The paper's arguments, checked numerically: in each regime (with d_m = H·d_h, the paper's
    assumption) FLuRKA's cumulative cost is below low-rank's / kernel's."""
    checked = {1: 0, 2: 0, 3: 0}
    for N, d_k, d_h, H in itertools.product([64, 500, 3001, 20000, 90000], [16, 100, 1500, 4000],
                                            [8, 64, 325], [1, 2, 8, 16]):
        d_m = H * d_h
        low, ker, fl = (F.paper_cost(k, N, d_m, d_k, d_h, H) for k in F.PAPER_KINDS)
        if F.claim2(N, d_k, d_h):
            checked[2] += 1
            assert fl < low, (N, d_m, d_k, d_h, H)
        if F.claim3(N, d_m, d_k, H):
            checked[3] += 1
            assert fl < ker, (N, d_m, d_k, d_h, H)
        if F.claim1(N, d_m, d_k, d_h, H):
            checked[1] += 1
            assert fl < low and fl < ker, (N, d_m, d_k, d_h, H)
    assert min(checked.values()) >= 5, checked  # every regime was actually exercised


# ---------------------------------------------------------------------------------------------
# Exact model
# ---------------------------------------------------------------------------------------------
def test_shape_validation():
    with pytest.raises(ValueError, match="must divide"):
        F.AttentionShape(1, 64, 64, 5)
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        F.AttentionShape(1, 0, 64, 4)
    with pytest.raises(ValueError, match="d_k=65 must not exceed seq_len=64"):
        F.AttentionShape(1, 64, 64, 4, d_k=65)
    with pytest.raises(ValueError, match="needs d_k"):
        F.forward_flops("linformer", F.AttentionShape(1, 64, 64, 4))
    with pytest.raises(ValueError, match="choose from full, flash"):
        F.forward_flops("sparse", F.AttentionShape(1, 64, 64, 4))
    with pytest.raises(ValueError, match="not a FLuRKA variant"):
        F.constituents("performer")
    with pytest.raises(ValueError, match="eva needs window_size >= 1"):
        F.forward_flops("eva", F.AttentionShape(1, 64, 64, 4, window_size=0))
    with pytest.raises(ValueError, match="window_size=9 .* must be <= d_k=8"):
        F.forward_flops("flurka-eva", F.AttentionShape(1, 64, 64, 4, d_k=8, window_size=9))
    with pytest.raises(ValueError, match="sharing must be one of headwise, kv, none"):
        F.AttentionShape(1, 64, 64, 4, sharing="layer")


def test_full_attention_by_hand():
    """Full attention from the textbook formula (float64 arithmetic, independent of flops.py)."""
    b, n, d, h = 3, 100, 48, 6
    s = F.AttentionShape(b, n, d, h)
    matmuls = np.float64(2) * (4 * b * n * d * d + 2 * b * h * n * n * (d // h))
    assert F.dot_flops("full", s) == matmuls == F.dot_flops("flash", s)
    assert F.forward_flops("full", s) > matmuls
    assert F.training_flops("full", s) == 3 * F.forward_flops("full", s)
    # a lone layer fed data: x's gradient through W_Q, W_K, W_V is not computed
    proj = np.float64(2) * b * n * d * d   # one of x·W_Q, x·W_K, x·W_V
    assert F.training_flops("full", s, input_grad=False) == 3 * F.forward_flops("full", s) - 3 * proj


def test_flurka_beats_both_constituents_at_the_papers_long_sequence():
    s = F.AttentionShape(1, 55500, 2600, 8, d_k=1500, num_features=325)
    for m in F.FLURKA:
        assert F.fewer_than_constituents(m, s) == {"linformer": True,
                                                   m.removeprefix("flurka-"): True}


# ---------------------------------------------------------------------------------------------
# Exact model vs the compiled layer's dot products (the spec's 5 % check)
# ---------------------------------------------------------------------------------------------
CONFIGS = [
    F.AttentionShape(2, 128, 64, 4, d_k=32, num_features=32),
    # EVA pads 200 to a multiple of lcm(8, 12) = 24; Linformer with one shared E.
    F.AttentionShape(2, 200, 64, 4, d_k=24, num_features=20, window_size=8, chunk_size=12,
                     sharing="kv"),
]


def _layer_dot_flops(mechanism: str, s: F.AttentionShape, grad: tuple[int, ...] | None = None) -> int:
    """Dot FLOPs of the compiled layer: its forward, or (``grad``: argnums, 0 the parameters, 1
    the input) a step computing Σ sin(out) and its gradient."""
    from flurka.attention import make_attention

    options = {}  # None: the layer's own default, which the model must mirror
    if mechanism.endswith("eva"):
        options.update({k: v for k, v in (("window_size", s.window_size),
                                          ("chunk_size", s.chunk_size)) if v is not None})
    if mechanism == "linformer" or mechanism in F.FLURKA:
        options["sharing"] = s.sharing
    layer = make_attention(mechanism, d_model=s.d_model, num_heads=s.num_heads,
                           max_len=s.seq_len, rngs=nnx.Rngs(0), d_k=s.d_k,
                           num_features=s.num_features, **options)
    x = jnp.ones((s.batch, s.seq_len, s.d_model), jnp.float32)
    if grad is None:
        graph, state = nnx.split(layer)
        compiled = jax.jit(lambda st, x: nnx.merge(graph, st)(x)).lower(state, x).compile()
        return F.compiled_dot_flops(compiled)
    graph, params, rest = nnx.split(layer, nnx.Param, ...)

    def loss(params, x):
        return jnp.sum(jnp.sin(nnx.merge(graph, params, rest)(x)))

    return F.compiled_dot_flops(jax.jit(jax.grad(loss, argnums=grad)).lower(params, x).compile())


def test_defaults_match_the_layers():
    """The model mirrors the layers' defaults for options a shape leaves as None."""
    import inspect

    from flurka.attention.eva import EVAAttention
    from flurka.attention.flurka import FlurkaEVA
    from flurka.attention.performer import DEFAULT_NUM_FEATURES

    def default(cls, name):
        return inspect.signature(cls.__init__).parameters[name].default

    assert (default(EVAAttention, "window_size"), default(EVAAttention, "chunk_size")) == (
        F.EVA_WINDOW, F.EVA_CHUNK)
    assert (default(FlurkaEVA, "window_size"), default(FlurkaEVA, "chunk_size")) == (
        None, F.EVA_CHUNK)
    assert F.flurka_eva_sizes(F.AttentionShape(1, 64, 32, 4, d_k=40)) == (10, 16, 2)
    assert DEFAULT_NUM_FEATURES == F.PERFORMER_FEATURES


def test_linformer_sharing_counts_each_distinct_projection():
    s = dict(batch=2, seq_len=64, d_model=32, num_heads=4, d_k=8)
    per_e = 2 * 2 * 8 * 64 * 32  # one [d_k, N]·[N, d_m] per batch element
    counts = {sh: F.flop_breakdown("linformer", F.AttentionShape(**s, sharing=sh))["compression"]
              for sh in F.SHARINGS}
    assert counts == {"headwise": 2 * per_e, "kv": per_e, "none": 2 * 4 * per_e}


@pytest.mark.parametrize("shape", CONFIGS, ids=lambda s: f"N{s.seq_len}")
@pytest.mark.parametrize("mechanism", F.MECHANISMS)
def test_model_matches_compiled_dot_products(mechanism, shape):
    measured = _layer_dot_flops(mechanism, shape)
    modelled = F.dot_flops(mechanism, shape)
    assert abs(modelled - measured) <= 0.05 * measured, (mechanism, modelled, measured)


@pytest.mark.parametrize("input_grad", [False, True], ids=["params", "params+x"])
@pytest.mark.parametrize("shape", CONFIGS, ids=lambda s: f"N{s.seq_len}")
@pytest.mark.parametrize("mechanism", F.MECHANISMS)
def test_training_model_matches_compiled_gradient_dot_products(mechanism, shape, input_grad):
    """A gradient step's dots (forward and backward) as XLA compiles them: the parameters'
    gradient alone, as a lone layer fed data trains (no gradient of x), or x's too, as inside a
    model. Within 1 %: the linear kernels' normaliser φ(q)·z has a backward outer product XLA
    writes as a multiply, not a dot; and fewer than 3 × the forward without x's."""
    measured = _layer_dot_flops(mechanism, shape, grad=(0, 1) if input_grad else 0)
    modelled = F.training_dot_flops(mechanism, shape, input_grad=input_grad)
    assert abs(modelled - measured) <= 0.01 * measured, (mechanism, modelled, measured)
    if not input_grad:
        assert modelled < 3 * F.dot_flops(mechanism, shape)
