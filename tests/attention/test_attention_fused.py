"""The fused query side (Pallas kernels, forward and backward; Pallas's interpreter on CPU)
against the float64 formulas and the XLA path.

Most layer tests run aligned (align=16: d_h 8 → 16, m 64, N 20 → 32, d_k 8 → 16); the kernels pad
other sizes themselves (a power of two ≥ 16 up to 128, 128-wide blocks above), tested here from
d_h = 8 to the N-sweep's d_h = m = 325.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import (
    MAX_LEN, build, favor_core, forward, inputs, randomize, reference, rnn_core, sin_loss_grads,
    softmax_core)
from flax import nnx

from flurka.attention import make_attention
from flurka.attention.base import NEG_INF
from flurka.attention.feature_maps import elu_features, favor_features, gaussian_orthogonal_matrix, key_side
from flurka.kernels.query_side import (
    Tiling, fused_query_side, fused_softmax_attention, reference_query_side, use_tiling)
from flurka.attention.performer import favor_attention
from flurka.attention.rnn import elu_attention

FUSABLE = ["performer", "rnn", "flurka-performer", "flurka-rnn"]


@pytest.mark.parametrize("mechanism", FUSABLE)
def test_fused_layer_matches_float64_reference(mechanism, rng_seed):
    layer = build(mechanism, 5, align=16, fused=True)
    x, mask = inputs(rng_seed)
    got = np.asarray(forward(layer, x, mask))
    ref = reference(build(mechanism, 5), x, mask)   # same parameters, unaligned, unfused
    real = np.asarray(mask)
    np.testing.assert_allclose(got[real], ref[real], rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("mechanism", FUSABLE)
def test_fused_layer_bf16_and_gradient_match_the_xla_path(mechanism, rng_seed):
    xla, fused = (build(mechanism, 5, align=16, fused=f, dtype=jnp.bfloat16) for f in (False, True))
    x, mask = inputs(rng_seed)
    a, b = (np.asarray(forward(m, x.astype(jnp.bfloat16), mask).astype(jnp.float32))
            for m in (xla, fused))
    real = np.asarray(mask)
    assert np.linalg.norm(b[real] - a[real]) < 1e-2 * np.linalg.norm(a[real])

    xla, fused = (build(mechanism, 5, align=16, fused=f) for f in (False, True))
    g_xla, g_fused = (jax.tree.leaves(sin_loss_grads(m, x, mask)) for m in (xla, fused))
    scale = max(float(jnp.max(jnp.abs(g))) for g in g_xla)
    for gx, gf in zip(g_xla, g_fused):
        np.testing.assert_allclose(gf, gx, atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("mechanism", FUSABLE)
def test_fused_bf16_gradient_is_as_close_to_float32_as_the_xla_paths(mechanism, rng_seed):
    """The backward kernel keeps the bf16 policy (compute-dtype operands, float32 accumulation):
    its parameter gradients sit as close to the float32 ones as the XLA path's bf16 gradients
    (worst parameter, 340 seeds over the four layers: ≤ 1.29× the XLA path's error — two draws of
    bf16 rounding noise, hence the slack of 1 % of the gradient — and the two bf16 gradients
    ≤ 3.0e-2 apart relative to the float32 gradient's norm)."""
    x, mask = inputs(rng_seed)

    def grads(dtype, fused):
        layer = build(mechanism, 5, align=16, fused=fused, dtype=dtype)
        return [np.asarray(g, np.float64)
                for g in jax.tree.leaves(sin_loss_grads(layer, x.astype(dtype), mask))]

    exact, xla, fused = grads(jnp.float32, False), grads(jnp.bfloat16, False), grads(jnp.bfloat16, True)

    def worst(got, ref):
        return max(np.linalg.norm(g - r) / np.linalg.norm(e) for g, r, e in zip(got, ref, exact))

    assert worst(fused, exact) <= 1.25 * worst(xla, exact) + 1e-2
    assert worst(fused, xla) < 0.05


def _kernel_inputs(feature, seed, *, n=40, d=16, f=32):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(0.5 * rng.standard_normal((2, n, 2, d)), jnp.float32) for _ in range(3))
    omega = gaussian_orthogonal_matrix(jax.random.key(seed), f, d) if feature == "favor" else None
    return q, k, v, omega


# (head dim, feature count): one block each; 2 head-dim blocks (200 → 256) and one padded feature
# block (100 → 128; elu: 2 × 2); the N-sweep's 325 → 3 × 3 blocks of 128. Past 128 the forward
# is the blocked kernel and the gradient the XLA path's.
KERNEL_SIZES = [(16, 32), (200, 100), (325, 325)]


@pytest.mark.parametrize("d,f", KERNEL_SIZES)
@pytest.mark.parametrize("feature", ["favor", "elu"])
def test_fused_core_matches_float64_formulas_and_finite_differences(feature, d, f, rng_seed):
    """The fused core's output against the float64 formulas (attention_reference's favor_core /
    rnn_core, per batch element and head), and its gradient: d/dt Σ G·core(x + tU) at t = 0 by
    central differences of those formulas against ⟨∂, U⟩ — for q, k and v one at a time (k and v
    reach the kernel through KV and Σφ(K))."""
    q, k, v, omega = _kernel_inputs(feature, rng_seed, d=d, f=f)
    _assert_fused_core_matches_float64(feature, q, k, v, omega, rng_seed)


def _assert_fused_core_matches_float64(feature, q, k, v, omega, seed):
    """The fused kernel attention (FAVOR+ with ``omega``, or elu) against the float64 core."""
    attend = (functools.partial(favor_attention, omega=omega, fused=True) if feature == "favor"
              else functools.partial(elu_attention, fused=True))
    core = (functools.partial(favor_core, omega=np.asarray(omega, np.float64))
            if feature == "favor" else rnn_core)
    _assert_matches_float64(lambda q, k, v: attend(q, k, v, None), core, (q, k, v),
                            np.random.default_rng(seed + 1))


def _assert_matches_float64(fn, core, args, rng, per_batch=False):
    """fn(q, k, v) against the float64 ``core`` per batch element and head (``per_batch``: core
    takes the batch index first), and its gradient: d/dt Σ G·core(x + tU) at t = 0 by central
    differences against ⟨∂, U⟩, for q, k and v one at a time. Returns fn's output."""
    out, vjp = jax.vjp(fn, *args)
    cot = rng.standard_normal(out.shape)
    grads = vjp(jnp.asarray(cot, jnp.float32))

    def per_head(q, k, v):
        return np.stack([np.stack([(functools.partial(core, b) if per_batch else core)(
                                       q[b, :, h], k[b, :, h], v[b, :, h])
                                   for h in range(q.shape[2])], axis=1)
                         for b in range(q.shape[0])])

    base = [np.asarray(a, np.float64) for a in args]
    exact = per_head(*base)
    np.testing.assert_allclose(np.asarray(out, np.float64), exact, rtol=0,
                               atol=1e-5 * np.abs(exact).max())
    for i, grad in enumerate(grads):
        u = rng.standard_normal(base[i].shape)
        shifted = [[a + t * u if j == i else a for j, a in enumerate(base)] for t in (1e-4, -1e-4)]
        finite = (np.sum(cot * per_head(*shifted[0])) - np.sum(cot * per_head(*shifted[1]))) / 2e-4
        analytic = float(np.sum(np.asarray(grad, np.float64) * u))
        bound = np.linalg.norm(np.asarray(grad, np.float64)) * np.linalg.norm(u)
        assert abs(analytic - finite) < 1e-5 * bound, ("qkv"[i], analytic, finite)
    return out


@pytest.mark.parametrize("feature", ["favor", "elu"])
def test_fused_backward_over_several_programs_matches_the_xla_vjp(feature, rng_seed):
    """Small blocks (16 rows per step, 32 per program) over N = 100 with padded head-dim columns
    and features: four programs whose partial dKV/dΣφ(K) XLA sums, and padded rows that must add
    nothing."""
    d, head_dim, f, m = 16, 12, 32, 27
    q, k, v, _ = _kernel_inputs(feature, rng_seed, n=100, d=d, f=f)
    q, k = (a.at[..., head_dim:].set(0.0) for a in (q, k))
    if feature == "favor":
        omega = gaussian_orthogonal_matrix(jax.random.key(rng_seed), m, head_dim)
        omega = jnp.pad(omega, ((0, f - m), (0, d - head_dim)))
        k_feat = favor_features(k, omega, is_query=False, head_dim=head_dim, num_features=m)
    else:
        omega, m = None, None
        k_feat = elu_features(k, head_dim=head_dim)
    kv, k_sum = key_side(k_feat, v)
    sizes = dict(feature=feature, head_dim=head_dim, num_features=m)
    fused = functools.partial(fused_query_side, omega=omega, **sizes,
                              tiling=Tiling(block_n=16, bwd_block_n=16, bwd_rows=32))
    reference = functools.partial(reference_query_side, omega=omega, **sizes)
    cot = jnp.asarray(np.random.default_rng(rng_seed).standard_normal(q.shape), jnp.float32)
    for dtype in (jnp.float32, jnp.bfloat16):
        (got, got_vjp), (ref, ref_vjp) = (jax.vjp(fn, q.astype(dtype), kv, k_sum)
                                          for fn in (fused, reference))
        for a, b in zip(got_vjp(cot), ref_vjp(cot)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if dtype == jnp.float32:
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
            else:
                assert np.linalg.norm(a - b) < 2e-2 * np.linalg.norm(b)


@pytest.mark.parametrize("feature", ["favor", "elu"])
def test_wide_kernel_over_several_programs_matches_float64_formulas_and_the_xla_path(feature,
                                                                                      rng_seed):
    """The wide kernel (d_h = m = 325 → 3 × 3 blocks of 128) over N = 150: three 64-row
    programs, the last one 22 rows short. q is scaled up so the rows' FAVOR+ logits span ~±20:
    a row's largest logit sits in any of the three feature blocks, so the running max rescales
    the sums of earlier blocks (a missed or doubled rescale is off by e^Δ). Float32 against the
    float64 formulas (the gradient is the XLA path's); bf16 against the XLA path in bf16."""
    q, k, v, omega = _kernel_inputs(feature, rng_seed, n=150, d=325, f=325)
    q = 4.0 * q if feature == "favor" else q
    _assert_fused_core_matches_float64(feature, q, k, v, omega, rng_seed)
    if feature == "favor":
        k_feat, m = favor_features(k, omega, is_query=False), 325
    else:
        k_feat, m = elu_features(k), None
    kv, k_sum = key_side(k_feat, v.astype(jnp.bfloat16))
    sizes = dict(omega=omega, feature=feature, head_dim=325, num_features=m)
    got, ref = (np.asarray(fn(q.astype(jnp.bfloat16), kv, k_sum, **sizes), np.float64)
                for fn in (fused_query_side, reference_query_side))
    assert np.linalg.norm(got - ref) < 1e-2 * np.linalg.norm(ref)


@pytest.mark.parametrize("mechanism,options", [("rnn", {}),                 # d_h 8 → 16
                                               ("flurka-performer", {"num_features": 100})])
def test_fused_layer_pads_unaligned_sizes_itself(mechanism, options, rng_seed):
    """Without align the kernel pads the head dim and feature count itself: same function."""
    layer = build(mechanism, 5, fused=True, **options)
    x, mask = inputs(rng_seed)
    got, ref = np.asarray(forward(layer, x, mask)), reference(build(mechanism, 5, **options), x, mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(got[real], ref[real], rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_fused_takes_widths_up_to_512_and_a_kernel_mechanism():
    with pytest.raises(ValueError, match="up to 512 .* got 513; use the XLA path"):
        build("performer", fused=True, num_features=513)
    with pytest.raises(ValueError, match="head dim .*up to 512 .* got 640"):
        make_attention("rnn", d_model=1280, num_heads=2, max_len=64, fused=True,
                       rngs=nnx.Rngs(0))
    assert build("performer", fused=True, num_features=512).fused == Tiling()
    with pytest.raises(ValueError, match="unknown option"):
        build("linformer", fused=True)


@pytest.mark.parametrize("n,keys,d,tiling", [
    (40, 37, 16, None),      # one ragged row block, one ragged 64-key step
    (100, 150, 16, Tiling(block_n=16, bwd_block_n=16, bwd_rows=32)),   # many blocks and chunks
    (40, 37, 200, None),     # two 128-wide head-dim blocks: the XLA path's gradient
    (150, 37, 200, Tiling(softmax_block_n=32)),   # wide, five row blocks, the last one ragged
])
def test_fused_softmax_matches_float64_formula_and_finite_differences(n, keys, d, tiling, rng_seed):
    """The EVAs' chunk-half kernel: softmax(q kᵀ / √d) v over a short key set (not a
    multiple of the kernels' 64-key steps, N not of their row blocks) against
    attention_reference's float64 softmax core per batch element and head; its gradient (the
    backward kernels: dq per row block, dK/dV partials per key block and row chunk) against
    central differences of that formula."""
    rng = np.random.default_rng(rng_seed)
    q = jnp.asarray(0.5 * rng.standard_normal((2, n, 2, d)), jnp.float32)
    k, v = (jnp.asarray(0.5 * rng.standard_normal((2, keys, 2, d)), jnp.float32) for _ in range(2))
    out = _assert_matches_float64(
        lambda q, k, v: fused_softmax_attention(q, k, v, scale=d ** -0.5, tiling=tiling),
        softmax_core, (q, k, v), rng)
    assert out.dtype == jnp.float32


@pytest.mark.parametrize("n,keys,d,tiling", [
    (40, 37, 16, None),
    (100, 150, 16, Tiling(block_n=16, bwd_block_n=16, bwd_rows=32)),
    (150, 37, 200, Tiling(softmax_block_n=32)),
])
def test_fused_softmax_with_key_bias_and_lse_matches_float64_formula(n, keys, d, tiling,
                                                                     rng_seed):
    """The EVAs' chunk half: keys a batch element lacks (its empty chunks) masked by a NEG_INF
    key bias — batch element 1 lacks its last third of keys and one in the middle — and each
    row's lse returned beside the output, differentiable (the layer joins this softmax with its
    windows' through it). Output and lse against the float64 softmax over each batch element's kept keys
    (dropped, not masked); the gradient of Σ G·out + Σ g·lse by central differences."""
    rng = np.random.default_rng(rng_seed)
    q = jnp.asarray(0.5 * rng.standard_normal((2, n, 2, d)), jnp.float32)
    k, v = (jnp.asarray(0.5 * rng.standard_normal((2, keys, 2, d)), jnp.float32) for _ in range(2))
    kept = np.ones((2, keys), bool)
    kept[1, 2 * keys // 3:] = kept[1, keys // 3] = False
    bias = jnp.where(jnp.asarray(kept), 0.0, NEG_INF)

    def fused(q, k, v):
        out, lse = fused_softmax_attention(q, k, v, scale=d ** -0.5, bias=bias, with_lse=True,
                                           tiling=tiling)
        return jnp.concatenate([out, lse.transpose(0, 2, 1)[..., None]], axis=-1)

    def core(b, q, k, v):
        logits = q @ k[kept[b]].T / np.sqrt(d)
        top = logits.max(axis=1, keepdims=True)
        lse = top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
        return np.concatenate([softmax_core(q, k[kept[b]], v[kept[b]]), lse], axis=1)

    _assert_matches_float64(fused, core, (q, k, v), rng, per_batch=True)


@pytest.mark.parametrize("mechanism,align", [("flurka-eva", None), ("flurka-eva", 16),
                                             ("eva", None), ("eva", 16)])
def test_fused_eva_layer_matches_float64_reference_and_the_xla_path(mechanism, align, rng_seed):
    """EVA and flurka-eva with their chunk half fused (joined with their windows through the
    lse); aligned, d_h 8 → 16 in the layer, the proposal on the true 8. The layer against the
    float64 reference (float32), and in bf16 against the XLA path (its output written in bf16),
    gradients included. The inputs' third sequence (5 of 20 rows) leaves EVA's last chunks
    empty: the kernel's key bias masks them."""
    x, mask = inputs(rng_seed)
    real = np.asarray(mask)
    fused = build(mechanism, 5, fused=True, align=align)
    got = np.asarray(forward(fused, x, mask))
    ref = reference(build(mechanism, 5), x, mask)
    np.testing.assert_allclose(got[real], ref[real], rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    xla, fused = (build(mechanism, 5, fused=f, align=align, dtype=jnp.bfloat16)
                  for f in (False, True))
    a, b = (np.asarray(forward(m, x.astype(jnp.bfloat16), mask).astype(jnp.float32))
            for m in (xla, fused))
    assert np.linalg.norm(b[real] - a[real]) < 1e-2 * np.linalg.norm(a[real])

    g_xla, g_fused = (jax.tree.leaves(sin_loss_grads(build(mechanism, 5, fused=f, align=align), x, mask))
                      for f in (False, True))
    scale = max(float(jnp.max(jnp.abs(g))) for g in g_xla)
    for gx, gf in zip(g_xla, g_fused):
        np.testing.assert_allclose(gf, gx, atol=1e-5 * scale, rtol=0)


def test_fused_flurka_eva_masks_compressed_rows_that_see_only_padding(rng_seed):
    """Pooled E (the layers' default) on a padded batch leaves compressed rows that weigh only
    padding — row 7 (positions 21-23, past the 20 given) in every sequence, rows 5-7 of the
    second, 2-7 of the third: bias-only keys, masked in the windows (w' = 3 rows: row 5 of the
    second sequence's window 3-5), left out of their chunk's summary (c' = 2: row 5 of chunk
    4-5) and, a chunk with none left, masked in the kernel by its key bias. The fused layer
    against the float64 reference, which drops those rows, and its gradients against the XLA
    layer's."""
    from flurka.attention.lowrank import pool_matrix

    def pooled(fused):
        layer = build("flurka-eva", 5, fused=fused)
        for e in (layer.seq_proj.e1, layer.seq_proj.e2):
            if e is not None:
                e[...] = jnp.asarray(pool_matrix(8, MAX_LEN), jnp.float32)
        return layer

    x, mask = inputs(rng_seed)
    xla = pooled(False)
    assert (xla.compressed_window, xla.compressed_chunk) == (3, 2)
    assert np.asarray(xla.real_rows(3, mask, 20)).tolist() == [
        [True] * 7 + [False], [True] * 5 + [False] * 3, [True] * 2 + [False] * 6]
    real = np.asarray(mask)
    got = np.asarray(forward(pooled(True), x, mask))
    ref = reference(xla, x, mask)
    np.testing.assert_allclose(got[real], ref[real], rtol=1e-5, atol=1e-5 * np.abs(ref).max())

    g_xla, g_fused = (jax.tree.leaves(sin_loss_grads(pooled(f), x, mask)) for f in (False, True))
    scale = max(float(jnp.max(jnp.abs(g))) for g in g_xla)
    for gx, gf in zip(g_xla, g_fused):
        np.testing.assert_allclose(gf, gx, atol=1e-5 * scale, rtol=0)


def test_wide_fused_eva_matches_float64_reference_and_trains_as_the_xla_path(rng_seed):
    """EVA past one block of head dim (d_h 136 → 2 × 128 in the kernel): its forward runs the
    kernel (float32, against the float64 reference, the third sequence's empty chunks masked),
    and a differentiated step runs XLA's joint softmax, whose gradients it then has."""
    d_model = 2 * 136
    x = jnp.asarray(np.random.default_rng(rng_seed).normal(size=(3, 20, d_model)), jnp.float32)
    _, mask = inputs(rng_seed)
    real = np.asarray(mask)

    def layer(fused):
        return randomize(make_attention("eva", d_model=d_model, num_heads=2, max_len=24,
                                        window_size=4, chunk_size=3, fused=fused,
                                        rngs=nnx.Rngs(5)), 1005)

    got = np.asarray(forward(layer(True), x, mask))
    ref = reference(layer(False), x, mask)
    np.testing.assert_allclose(got[real], ref[real], rtol=1e-5, atol=1e-5 * np.abs(ref).max())

    g_xla, g_fused = (jax.tree.leaves(sin_loss_grads(layer(f), x, mask)) for f in (False, True))
    scale = max(float(jnp.max(jnp.abs(g))) for g in g_xla)
    for gx, gf in zip(g_xla, g_fused):
        np.testing.assert_allclose(gf, gx, atol=1e-6 * scale, rtol=0)


def _lowered_for_gpu(mechanism, *, grad, d_model=512, **options):
    """(layer, StableHLO text) of a bf16 layer's forward (``grad``: its parameter gradient) on a
    [1, 1024, d_model] input, lowered for CUDA here without a GPU (Pallas's Triton lowering runs;
    compiling to PTX needs the card)."""
    layer = nnx.eval_shape(lambda: make_attention(
        mechanism, d_model=d_model, num_heads=4, max_len=1024, d_k=128, dtype=jnp.bfloat16,
        rngs=nnx.Rngs(0), **options))
    graphdef, state = nnx.split(layer)
    x = jax.ShapeDtypeStruct((1, 1024, d_model), jnp.bfloat16)

    def forward(s, x):
        return nnx.merge(graphdef, s)(x)

    def loss(s, x):
        return jnp.sum(forward(s, x).astype(jnp.float32) ** 2)
    fn = jax.grad(loss) if grad else forward
    return layer, jax.jit(fn).trace(state, x).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("mechanism", ["flurka-performer", "flurka-rnn"])
def test_fused_layer_lowers_to_a_triton_kernel_for_the_gpu(mechanism):
    """Pallas's Triton lowering runs here, without a GPU: block shapes, dots, the backward's loop
    and the feature maths of the appendix-C size (d_h = m = 128, bf16) are accepted; the layer's
    query side is one Triton custom call, two in its gradient. (Compiling them to PTX and timing
    them need the card.)"""
    for grad, kernels in ((False, 1), (True, 2)):   # training: the forward and backward kernels
        _, text = _lowered_for_gpu(mechanism, grad=grad, num_features=128, fused=True)
        calls = re.findall(r"custom_call @([\w$.]+)", text)
        assert calls.count("__gpu$xla.gpu.triton") == kernels, calls


@pytest.mark.parametrize("mechanism", ["flurka-performer", "flurka-rnn"])
def test_wide_fused_layer_lowers_to_triton_blocks_of_128(mechanism):
    """The N-sweep's d_h = m = 325 (padded to 3 blocks of 128): Pallas's Triton lowering accepts
    every load and store (power-of-two blocks; a whole [rows, 384] block would be refused), the
    forward runs its wide kernel (64 rows per program on 8 warps, whatever the tiling says of
    one-block launches), and the gradient is the forward kernel plus the XLA path's backward."""
    for grad in (False, True):
        _, text = _lowered_for_gpu(mechanism, grad=grad, d_model=1300, num_features=325,
                                   fused=Tiling(block_n=16, num_warps=4))
        assert _triton_launches(text) == [(1024 // 64, 8, 1)]


@pytest.mark.parametrize("mechanism", ["flurka-eva", "eva"])
def test_wide_fused_softmax_takes_the_wide_launch(mechanism):
    """The EVAs' chunk half at the N-sweep's head dim (325 → 384) runs the wide launch too:
    64-row programs on 8 warps in one stage (two overflow the card's shared memory); a
    differentiated step runs the XLA path there, forward included (no kernel)."""
    _, text = _lowered_for_gpu(mechanism, grad=False, d_model=1300,
                               fused=Tiling(block_n=16, num_warps=4))
    assert _triton_launches(text) == [(1024 // 64, 8, 1)]
    _, text = _lowered_for_gpu(mechanism, grad=True, d_model=1300, fused=True)
    assert _triton_launches(text) == []


def _triton_launches(lowered_text: str) -> list[tuple[int, int, int]]:
    """(grid_z, num_warps, num_stages) of every Triton custom call in a lowered module."""
    calls = re.findall(r"__gpu\$xla\.gpu\.triton.*?grid_z = (\d+).*?num_stages = (\d+).*?num_warps = (\d+)",
                       lowered_text, flags=re.S)
    return [(int(z), int(w), int(s)) for z, s, w in calls]


def test_tiling_is_the_layers_and_shapes_its_launch():
    """A layer takes the tiling current at its construction (or the one it is given) and keeps
    it: its lowered kernels' grids, warps and stages follow it, and a layer built afterwards
    with another tiling is not served the first one's trace."""
    def lowered(**kw):
        layer, text = _lowered_for_gpu("flurka-rnn", grad=True, **kw)
        return layer.fused, text

    tuned = Tiling(block_n=64, num_warps=4, bwd_block_n=32, bwd_rows=256, bwd_num_warps=2,
                   num_stages=3)
    with use_tiling(tuned):
        kept, text = lowered(fused=True)
    assert kept == tuned
    assert _triton_launches(text) == [(1024 // 64, 4, 3), (1024 // 256, 2, 3)]   # forward, backward
    kept, text = lowered(fused=True)                                              # the default again
    assert kept == Tiling() and _triton_launches(text) == [(1024 // 128, 8, 2), (1, 8, 2)]
    kept, text = lowered(fused=Tiling(block_n=256))
    assert _triton_launches(text)[0] == (1024 // 256, 8, 2)
    assert lowered()[0] is None                                                   # the XLA path


def test_wide_softmax_has_a_launch_of_its_own():
    """Past one block of head dim the softmax kernel (EVA's chunk summaries) and the feature-map
    kernel (flurka-rnn's elu) are different kernels: each takes its own launch, so tuning one
    leaves the other as it was (d_h 192, forward)."""
    tiling = Tiling(wide_block_n=32, wide_num_warps=4, softmax_block_n=16, softmax_num_warps=2,
                    softmax_num_stages=3)
    (eva,) = _triton_launches(_lowered_for_gpu("eva", grad=False, d_model=768, fused=tiling)[1])
    (rnn,) = _triton_launches(_lowered_for_gpu("flurka-rnn", grad=False, d_model=768,
                                               fused=tiling)[1])
    assert eva[1:] == (2, 3) and rnn[1:] == (4, 1)
    assert (eva[0], rnn[0]) == (1024 // 16, 1024 // 32)


@pytest.mark.parametrize("mechanism", ["flurka-performer", "flurka-rnn"])
def test_every_tiling_computes_the_same_function(mechanism, rng_seed):
    """Launch shape never changes the result: one program per row block or several, one backward
    program or many (Pallas's interpreter; N = 20 padded to 32)."""
    x, mask = inputs(rng_seed)

    def run(tiling):
        layer = build(mechanism, 5, align=16, fused=tiling)
        out, grads = forward(layer, x, mask), sin_loss_grads(layer, x, mask)
        return np.asarray(out), [np.asarray(g) for g in jax.tree.leaves(grads)]

    (a, ga), (b, gb) = (run(Tiling(block_n=n, bwd_block_n=16, bwd_rows=r)) for n, r in ((16, 16), (32, 32)))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * abs(a).max())
    for x1, x2 in zip(ga, gb):
        np.testing.assert_allclose(x1, x2, rtol=0, atol=1e-6 * abs(x2).max())


def test_tiling_rejects_untileable_launches():
    for kw, message in (({"block_n": 96}, "block_n must be a power of two >= 16"),
                        ({"bwd_block_n": 8}, "bwd_block_n must be a power of two >= 16"),
                        ({"bwd_rows": 16, "bwd_block_n": 32}, "bwd_rows .16. must be >= bwd_block_n"),
                        ({"num_warps": 3}, "num_warps must be None or 1, 2, 4, 8, 16"),
                        ({"num_stages": 0}, "num_stages must be an int >= 1"),
                        ({"wide_block_n": 96}, "wide_block_n must be a power of two >= 16"),
                        ({"wide_num_warps": 6}, "wide_num_warps must be None or 1, 2, 4, 8, 16"),
                        ({"wide_num_stages": 0}, "wide_num_stages must be an int >= 1"),
                        ({"softmax_block_n": 48}, "softmax_block_n must be a power of two >= 16"),
                        ({"softmax_num_warps": 3}, "softmax_num_warps must be None or 1, 2, 4"),
                        ({"softmax_num_stages": 0}, "softmax_num_stages must be an int >= 1")):
        with pytest.raises(ValueError, match=message):
            Tiling(**kw)
