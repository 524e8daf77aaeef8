"""The exact FLOP model of each layer, checked against the dot products XLA compiles for it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flurka import hlo
from flurka.attention import flops as F

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
    with pytest.raises(ValueError, match="valid: full, flash"):
        F.forward_flops("sparse", F.AttentionShape(1, 64, 64, 4))
    with pytest.raises(ValueError, match="not a FLuRKA variant"):
        F.constituents("performer")
    for window in (0, -1):   # the EVAs' window, in positions: any positive int, even past d_k
        with pytest.raises(ValueError, match="window_size must be a positive integer"):
            F.AttentionShape(1, 64, 64, 4, d_k=8, window_size=window)
    assert F.forward_flops("flurka-eva", F.AttentionShape(1, 64, 64, 4, d_k=8, window_size=9)) > 0
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
    """flurka-eva beats Linformer only where its chunks summarise several compressed rows: with
    EVA's 16-position window and chunks at d_k/N = 1500/55 500 each covers one row (w' = c' =
    1), so every query attends one row exactly and all 1500 as chunk summaries — Linformer's
    products plus the summaries'; with chunks of 64 positions (c' = 2) it halves the chunk
    logits."""
    s = F.AttentionShape(1, 55500, 2600, 8, d_k=1500, num_features=325)
    for m in ("flurka-performer", "flurka-rnn"):
        assert F.fewer_than_constituents(m, s) == {"linformer": True,
                                                   m.removeprefix("flurka-"): True}
    assert F.flurka_eva_sizes(s) == (1, 1, 1500)
    assert F.fewer_than_constituents("flurka-eva", s) == {"linformer": False, "eva": True}
    wider = dataclasses.replace(s, chunk_size=64)
    assert F.flurka_eva_sizes(wider) == (1, 2, 1500)
    assert F.fewer_than_constituents("flurka-eva", wider) == {"linformer": True, "eva": True}


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
        return hlo.compiled_dot_flops(compiled)
    graph, params, rest = nnx.split(layer, nnx.Param, ...)

    def loss(params, x):
        return jnp.sum(jnp.sin(nnx.merge(graph, params, rest)(x)))

    return hlo.compiled_dot_flops(jax.jit(jax.grad(loss, argnums=grad)).lower(params, x).compile())


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
        F.EVA_WINDOW, F.EVA_CHUNK)
    assert DEFAULT_NUM_FEATURES == F.PERFORMER_FEATURES


@pytest.mark.parametrize("size,sizes", [
    # w' = max(1, ⌊size·d_k/N + ½⌋) rows, likewise c'; the d_k rows padded to lcm(w', c')
    (dict(seq_len=64, d_k=40), (10, 10, 40)),                 # the defaults: 16 · 40/64 = 10
    (dict(seq_len=96, d_k=40, window_size=20, chunk_size=8), (8, 3, 48)),   # 8.33, 3.33; lcm 24
    (dict(seq_len=64, d_k=20, window_size=8, chunk_size=16), (3, 5, 30)),   # 2.5 rounds up; 15
    (dict(seq_len=55500, d_k=1500), (1, 1, 1500)),            # 0.43: at least one row
])
def test_flurka_eva_sizes_are_the_layers_compressed_rows(size, sizes):
    from flurka.attention import make_attention

    shape = F.AttentionShape(1, d_model=32, num_heads=4, **size)
    assert F.flurka_eva_sizes(shape) == sizes
    if shape.seq_len > 1000:
        return
    layer = make_attention("flurka-eva", d_model=32, num_heads=4, max_len=shape.seq_len,
                           rngs=nnx.Rngs(0), d_k=shape.d_k,
                           **{k: v for k, v in size.items() if k.endswith("_size")})
    w, c = layer.compressed_window, layer.compressed_chunk
    assert (w, c, layer.num_chunks() * c) == sizes


@pytest.mark.parametrize("shape", [
    F.AttentionShape(2, 96, 64, 4, d_k=40, window_size=20, chunk_size=8),   # w' 8, c' 3: 48 rows
    F.AttentionShape(2, 100, 32, 2, d_k=30, window_size=7, chunk_size=5),   # w' = c' = 2
    F.AttentionShape(1, 64, 32, 2, d_k=64, window_size=4, chunk_size=8, sharing="none"),
], ids=["padded", "even", "per-head-e"])
def test_flurka_eva_model_counts_every_dot_the_layer_runs(shape):
    """flurka-eva's forward dots to the FLOP (its chunk half's ones column included), and its
    gradient step's, the backward products that contract nothing left out (XLA multiplies
    them: the per-query windows' ∂K, ∂V and the chunk rows'). With one row a window or chunk
    (w' or c' = 1) XLA makes multiplies of the forward products too: CONFIGS' N = 200 shape."""
    assert _layer_dot_flops("flurka-eva", shape) == F.dot_flops("flurka-eva", shape)
    for grad, input_grad in ((0, False), ((0, 1), True)):
        assert _layer_dot_flops("flurka-eva", shape, grad=grad) == F.training_dot_flops(
            "flurka-eva", shape, input_grad=input_grad)


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
