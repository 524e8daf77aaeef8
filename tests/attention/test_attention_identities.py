"""Identities: Linformer with E = I is full attention; FLuRKA with E = I is its kernel;
flurka-eva with E = I is EVA; FAVOR+ error falls like 1/√m."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import MAX_LEN, inputs, shared
from flax import nnx

from flurka.attention import favor_attention, make_attention, softmax_attention
from flurka.attention.feature_maps import gaussian_orthogonal_matrix


def with_identity_e(layer):
    eye = jnp.eye(MAX_LEN, dtype=jnp.float32)
    layer.seq_proj.e1[...] = eye
    if layer.seq_proj.e2 is not None:
        layer.seq_proj.e2[...] = eye
    return layer


def copy_shared(src, dst):
    """Up-training style: copy every state path that exists in both."""
    nnx.update(dst, nnx.state(src))
    return dst


@pytest.mark.parametrize("fused, base", [("linformer", "full"),
                                         ("flurka-performer", "performer"),
                                         ("flurka-rnn", "rnn")])
def test_identity_projection_recovers_the_constituent(fused, base, rng_seed):
    base_layer = shared(base, seed=11)
    layer = make_attention(fused, d_model=16, num_heads=2, max_len=MAX_LEN, rngs=nnx.Rngs(0),
                           d_k=MAX_LEN, num_features=64)
    copy_shared(base_layer, layer)
    with_identity_e(layer)
    x, _ = inputs(rng_seed, seq=MAX_LEN, padded=False)
    np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(base_layer(x)), rtol=1e-4,
                               atol=1e-4)
    # ...and E matters: a random E gives something else
    layer.seq_proj.e1[...] = jnp.asarray(np.random.default_rng(0).normal(size=(MAX_LEN, MAX_LEN)),
                                         jnp.float32) / MAX_LEN ** 0.5
    assert not np.allclose(np.asarray(layer(x)), np.asarray(base_layer(x)), atol=1e-3)


def test_flurka_eva_with_identity_e_is_eva(rng_seed):
    """flurka-eva is EVA on the compressed rows: with E = I and d_k = L every query sits at its
    own row, the windows and chunks are EVA's, and so is the output (the adaptive proposal and
    the noise ε copied from EVA; padded batch)."""
    eva = shared("eva", seed=12, window_size=6, chunk_size=4)
    fe = make_attention("flurka-eva", d_model=16, num_heads=2, max_len=MAX_LEN, rngs=nnx.Rngs(1),
                        d_k=MAX_LEN, window_size=6, chunk_size=4)
    copy_shared(eva, fe)
    with_identity_e(fe)
    assert (fe.compressed_window, fe.compressed_chunk) == (6, 4)
    x, mask = inputs(rng_seed)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(fe(x, mask))[real], np.asarray(eva(x, mask))[real],
                               rtol=1e-5, atol=1e-5)
    # ...and E matters: compressed to a third, the same options see another function
    third = make_attention("flurka-eva", d_model=16, num_heads=2, max_len=MAX_LEN,
                           rngs=nnx.Rngs(1), d_k=MAX_LEN // 3, window_size=6, chunk_size=4)
    assert (third.compressed_window, third.compressed_chunk) == (2, 1)
    nnx.update(third, nnx.state(eva, nnx.Param))          # its noise has 8 chunks, not 6
    assert not np.allclose(np.asarray(third(x, mask))[real], np.asarray(eva(x, mask))[real],
                           atol=1e-3)


def test_favor_error_falls_like_inverse_sqrt_m():
    key = jax.random.key(0)
    q, k, v = (0.5 * jax.random.normal(jax.random.fold_in(key, i), (2, 32, 2, 16))
               for i in range(3))
    exact = softmax_attention(q, k, v)
    ms = np.array([64, 256, 1024, 4096])

    # 8 independent draws of the largest ω; its first m rows (whole orthogonal blocks, independent
    # norms) are a valid m-feature draw, so one QR compile serves every m.
    omegas = jax.jit(jax.vmap(lambda key: gaussian_orthogonal_matrix(key, int(ms[-1]), 16)))(
        jax.random.split(jax.random.key(1), 8))
    rmse = jax.jit(lambda omega: jnp.sqrt(jnp.mean((favor_attention(q, k, v, None, omega)
                                                    - exact) ** 2)))
    err = [float(np.mean([rmse(omegas[s, :m]) for s in range(8)])) for m in ms]
    slope = np.polyfit(np.log(ms), np.log(err), 1)[0]
    assert -0.65 < slope < -0.35, (slope, err)
    assert err[-1] < err[0] / 4
