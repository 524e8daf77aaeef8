"""E's initialisation (pooled block means, the paper's Gaussian) and the compressed rows that see
only padding: masked out of the key set, checked against the float64 references."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import HEADS, MAX_LEN, D_MODEL, build, f64, inputs, reference
from flax import nnx

from flurka.attention import make_attention
from flurka.catalogue.mechanisms import COMPRESSED

TOL = dict(rtol=2e-4, atol=2e-4)
KERNEL_OF = {"linformer": "full", "flurka-performer": "performer", "flurka-rnn": "rnn"}


def real_rows(a, mask):
    return np.asarray(a)[np.asarray(mask)]


def pooled(mechanism, seed=0, **options):
    """A layer whose other parameters are randomised but whose E is the pooled init as built."""
    layer = build(mechanism, seed, **options)
    fresh = make_attention(mechanism, d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN,
                           rngs=nnx.Rngs(seed), **{"d_k": 8, "num_features": 64, **options})
    layer.seq_proj.e1[...] = fresh.seq_proj.e1[...]
    if layer.seq_proj.e2 is not None:
        layer.seq_proj.e2[...] = fresh.seq_proj.e2[...]
    return layer


@pytest.mark.parametrize("d_k, length, edges", [
    (8, 24, [0, 3, 6, 9, 12, 15, 18, 21, 24]),
    (5, 24, [0, 4, 9, 14, 19, 24]),        # ⌊i·24/5⌋: blocks of 4 and 5
    (24, 24, list(range(25))),             # d_k = length: the identity
])
def test_pool_init_is_block_means(d_k, length, edges):
    layer = make_attention("linformer", d_model=D_MODEL, num_heads=HEADS, max_len=length,
                           rngs=nnx.Rngs(0), d_k=d_k)
    expected = np.zeros((d_k, length))
    for i in range(d_k):
        expected[i, edges[i]:edges[i + 1]] = 1.0 / (edges[i + 1] - edges[i])
    for e in (layer.seq_proj.e1, layer.seq_proj.e2):
        np.testing.assert_allclose(f64(e[...]), expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(f64(layer.seq_proj.e1[...]).sum(axis=1), 1.0, atol=1e-6)


def test_gaussian_init_is_the_papers():
    layer = make_attention("linformer", d_model=D_MODEL, num_heads=HEADS, max_len=512,
                           rngs=nnx.Rngs(0), d_k=64, e_init="gaussian")
    e = f64(layer.seq_proj.e1[...])
    assert abs(e.mean()) < 0.01 and abs(e.std() - 64 ** -0.5) < 0.01
    assert not np.allclose(e, f64(layer.seq_proj.e2[...]))
    per_head = make_attention("flurka-rnn", d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN,
                              rngs=nnx.Rngs(0), d_k=8, sharing="none")
    assert per_head.seq_proj.e1.shape == (HEADS, 8, MAX_LEN)
    np.testing.assert_array_equal(f64(per_head.seq_proj.e1[...])[0],
                                  f64(per_head.seq_proj.e1[...])[1])


def test_unknown_e_init_is_one_line():
    with pytest.raises(ValueError, match=r"e_init must be one of \('pool', 'gaussian'\)"):
        make_attention("linformer", d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN,
                       rngs=nnx.Rngs(0), d_k=8, e_init="orthogonal")


@pytest.mark.parametrize("mechanism", COMPRESSED)
def test_pooled_e_with_padding_matches_reference(mechanism, rng_seed):
    """Sequences of 20, 13 and 5 real positions of 24 under pooled E (blocks of 3): the rows past
    a sequence's end see only padding; the reference drops them."""
    layer = pooled(mechanism, seed=5)
    x, mask = inputs(rng_seed, seq=MAX_LEN)
    seen = np.asarray(layer.seen_rows(mask, MAX_LEN))
    assert seen.shape == (3, 8) and not seen[2].all() and seen[0].all()
    np.testing.assert_allclose(real_rows(layer(x, mask), mask),
                               real_rows(reference(layer, x, mask), mask), **TOL)


@pytest.mark.parametrize("mechanism", COMPRESSED)
def test_padding_content_changes_nothing(mechanism, rng_seed):
    layer = pooled(mechanism, seed=6)
    x, mask = inputs(rng_seed, seq=MAX_LEN)
    junk = jnp.where(mask[..., None], x, 1e3 * jnp.ones_like(x))
    np.testing.assert_allclose(real_rows(layer(junk, mask), mask),
                               real_rows(layer(x, mask), mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mechanism", list(KERNEL_OF))
def test_identity_e_with_padding_is_the_constituent(mechanism, rng_seed):
    """E = I (d_k = N): each compressed row is one position, so the padded ones are masked
    exactly as the constituent masks padded keys. Before the mask they were bias-only keys
    every query attended."""
    base = build(KERNEL_OF[mechanism], seed=7)
    layer = make_attention(mechanism, d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN,
                           rngs=nnx.Rngs(0), d_k=MAX_LEN, num_features=64)
    nnx.update(layer, nnx.state(base))
    eye = jnp.eye(MAX_LEN, dtype=jnp.float32)
    layer.seq_proj.e1[...] = eye
    layer.seq_proj.e2[...] = eye
    x, mask = inputs(rng_seed, seq=MAX_LEN)
    np.testing.assert_allclose(real_rows(layer(x, mask), mask),
                               real_rows(base(x, mask), mask), rtol=1e-4, atol=1e-4)
