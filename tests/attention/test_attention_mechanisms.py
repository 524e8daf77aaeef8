"""Every mechanism against its float64 NumPy reference; padding, jit, dtypes, gradients, RNG."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import build, inputs, reference, shared
from flax import nnx

from flurka.attention import MECHANISMS, RANDOM_FEATURES, RandomFeatures, make_attention

TOL = dict(rtol=2e-4, atol=2e-4)


def real_rows(a, mask):
    return np.asarray(a)[np.asarray(mask)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_matches_float64_reference(mechanism, rng_seed):
    layer = shared(mechanism)
    for padded in (False, True):
        x, mask = inputs(rng_seed + padded, padded=padded)
        got = layer(x, mask if padded else None)
        assert got.shape == x.shape and got.dtype == jnp.float32
        np.testing.assert_allclose(real_rows(got, mask),
                                   real_rows(reference(layer, x, mask), mask), **TOL)


@pytest.mark.parametrize("sharing", ["kv", "none"])
@pytest.mark.parametrize("mechanism", ["linformer", "flurka-rnn"])
def test_low_rank_sharing_options_match_reference(mechanism, sharing, rng_seed):
    layer = shared(mechanism, seed=3, sharing=sharing)
    assert (layer.seq_proj.e2 is None) == (sharing == "kv")
    assert layer.seq_proj.e1.shape == ((2, 8, 24) if sharing == "none" else (8, 24))
    x, mask = inputs(rng_seed)
    np.testing.assert_allclose(real_rows(layer(x, mask), mask),
                               real_rows(reference(layer, x, mask), mask), **TOL)


def test_layerwise_shared_seq_proj_is_one_module():
    first = build("linformer")
    second = make_attention("flurka-performer", d_model=16, num_heads=2, max_len=24,
                            rngs=nnx.Rngs(1), seq_proj=first.seq_proj)
    assert second.seq_proj is first.seq_proj and second.d_k == first.d_k


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_padding_is_exact(mechanism, rng_seed):
    """Real outputs ignore padded content, and right padding equals the unpadded sequence."""
    layer = shared(mechanism)
    x, mask = inputs(rng_seed)
    junk = jnp.asarray(np.random.default_rng(rng_seed + 1).normal(size=x.shape) * 50, x.dtype)
    y1 = layer(x, mask)
    y2 = layer(jnp.where(mask[..., None], x, junk), mask)
    np.testing.assert_allclose(real_rows(y1, mask), real_rows(y2, mask), rtol=0, atol=1e-6)
    # batch row 2 is right-padded to length 5: same as running on the 5 real tokens alone
    alone = layer(x[2:3, :5])
    np.testing.assert_allclose(np.asarray(y1[2, :5]), np.asarray(alone[0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_jit_bf16_and_finite_gradients(mechanism, rng_seed):
    layer = shared(mechanism)
    x, mask = inputs(rng_seed)
    eager = layer(x, mask)
    jitted = nnx.jit(lambda m, x, k: m(x, k))(layer, x, mask)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-5, atol=1e-5)

    y16 = layer(x.astype(jnp.bfloat16), mask)
    assert y16.dtype == jnp.bfloat16
    err = real_rows(y16.astype(jnp.float32), mask) - real_rows(eager, mask)
    assert np.linalg.norm(err) < 2e-2 * np.linalg.norm(real_rows(eager, mask))

    graphdef, state = nnx.split(layer)
    junk = jnp.where(mask[..., None], x, 1e4)  # huge padded content must not poison gradients

    def loss(state, x):  # real positions only: padded query rows are nobody's output
        return jnp.sum(jnp.where(mask[..., None], nnx.merge(graphdef, state)(x, mask), 0.0) ** 2)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(state, junk)
    leaves = jax.tree.leaves(grads)
    assert leaves and all(bool(jnp.isfinite(g).all()) for g in leaves)
    assert float(jnp.abs(grads[1]).max()) > 0
    np.testing.assert_array_equal(np.asarray(grads[1])[~np.asarray(mask)], 0.0)


@pytest.mark.parametrize("mechanism", RANDOM_FEATURES)
def test_random_features_are_not_params(mechanism):
    layer = shared(mechanism)
    fixed = nnx.state(layer, RandomFeatures)
    assert jax.tree.leaves(fixed), "random draws live in a RandomFeatures variable"
    params = nnx.state(layer, nnx.Param)
    n_all = len(jax.tree.leaves(nnx.state(layer)))
    assert len(jax.tree.leaves(params)) + len(jax.tree.leaves(fixed)) == n_all


@pytest.mark.parametrize("mechanism", ["performer", "flurka-performer"])
def test_performer_redraw_uses_the_explicit_key(mechanism, rng_seed):
    layer = shared(mechanism, redraw=True)
    x, mask = inputs(rng_seed)
    with pytest.raises(ValueError, match="rng"):
        layer(x, mask)
    key = jax.random.key(rng_seed)
    got = layer(x, mask, rng=key)
    want = reference(layer, x, mask, omega=np.asarray(layer.draw_features(key), np.float64))
    np.testing.assert_allclose(real_rows(got, mask), real_rows(want, mask), **TOL)
    again = layer(x, mask, rng=key)
    other = layer(x, mask, rng=jax.random.key(rng_seed + 1))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(again))
    assert not np.allclose(np.asarray(got), np.asarray(other))


@pytest.mark.parametrize("mechanism", ["eva", "flurka-eva"])
def test_eva_eval_mode_uses_the_proposal_mean(mechanism, rng_seed):
    layer = build(mechanism)
    x, mask = inputs(rng_seed)
    train_out = layer(x, mask)
    layer.eval()
    assert layer.deterministic
    got = layer(x, mask, rng=None)
    np.testing.assert_allclose(real_rows(got, mask), real_rows(reference(layer, x, mask, noise=None),
                                                               mask), **TOL)
    assert not np.allclose(np.asarray(got), np.asarray(train_out))


def test_eva_redraw_draws_per_batch_noise(rng_seed):
    layer = shared("eva", redraw=True)
    x, mask = inputs(rng_seed)
    with pytest.raises(ValueError, match="rng"):
        layer(x, mask)
    key = jax.random.key(rng_seed)
    got = layer(x, mask, rng=key)
    noise = np.asarray(layer.draw_noise(key, x.shape[0]), np.float64)
    for b in range(x.shape[0]):
        want = reference(layer, x[b:b + 1], mask[b:b + 1], noise=noise[b])
        np.testing.assert_allclose(real_rows(got[b:b + 1], mask[b:b + 1]),
                                   real_rows(want, mask[b:b + 1]), **TOL)


def test_parameter_paths_line_up_for_uptraining():
    """FLuRKA shares every parameter path (and shape) with its constituents."""
    def paths(mech):
        state = nnx.state(shared(mech))
        return {p: v.shape for p, v in jax.tree_util.tree_leaves_with_path(state)}

    full, lin = paths("full"), paths("linformer")
    assert set(full) <= set(lin)
    for kernel in ("performer", "rnn", "eva"):
        base, fused = paths(kernel), paths("flurka-" + kernel)
        assert set(base) <= set(fused) and set(lin) <= set(fused)
        assert all(fused[p] == s for p, s in {**lin, **{p: s for p, s in base.items()
                                                        if "noise" not in str(p)}}.items())
    names = {str(p[0].key) for p in full}
    assert names == {"query", "key", "value", "out"}


def test_flash_reports_xla_on_cpu_and_equals_full(rng_seed):
    flash, full = shared("flash", seed=2), shared("full", seed=2)
    assert flash.implementation == "xla"
    x, mask = inputs(rng_seed)
    np.testing.assert_allclose(real_rows(flash(x, mask), mask), real_rows(full(x, mask), mask),
                               rtol=1e-5, atol=1e-5)
    right = shared("flash", seed=2, padding="right")
    xr, mr = x[1:], mask[1:].at[0, 3].set(True)   # right-padded rows only
    np.testing.assert_allclose(real_rows(right(xr, mr), mr), real_rows(full(xr, mr), mr),
                               rtol=1e-5, atol=1e-5)
