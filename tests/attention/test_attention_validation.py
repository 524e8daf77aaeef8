"""Bad input gets one clear ValueError at construction or call, before any compute."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from attention_reference import shared
from flax import nnx

from flurka.attention import MECHANISMS, make_attention


def make(mechanism="full", **kw):
    args = dict(d_model=16, num_heads=2, max_len=24, rngs=nnx.Rngs(0))
    args.update(kw)
    return make_attention(mechanism, **args)


def test_mechanism_list_is_exact():
    assert MECHANISMS == ("full", "flash", "linformer", "performer", "rnn", "eva",
                          "flurka-performer", "flurka-rnn", "flurka-eva")


def test_unknown_mechanism_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown attention mechanism 'softmax'") as err:
        make("softmax")
    assert all(m in str(err.value) for m in MECHANISMS)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_heads_must_divide_d_model(mechanism):
    with pytest.raises(ValueError, match="num_heads=3 must divide d_model=16"):
        make(mechanism, num_heads=3, d_k=8)


@pytest.mark.parametrize("mechanism", ["linformer", "flurka-performer", "flurka-rnn", "flurka-eva"])
def test_low_rank_d_k_checks(mechanism):
    with pytest.raises(ValueError, match="d_k=25 must be <= max_len=24"):
        make(mechanism, d_k=25)
    with pytest.raises(ValueError, match="d_k .* is required"):
        make(mechanism)
    with pytest.raises(ValueError, match="sharing must be one of"):
        make(mechanism, d_k=8, sharing="layer")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_call_checks(mechanism):
    layer = shared(mechanism)
    x = jnp.zeros((2, 10, 16))
    with pytest.raises(ValueError, match="seq=25 exceeds max_len=24"):
        layer(jnp.zeros((2, 25, 16)))
    with pytest.raises(ValueError, match=r"mask must have shape \[batch, seq\] = \(2, 10\)"):
        layer(x, jnp.ones((2, 9), bool))
    with pytest.raises(ValueError, match="mask must be bool"):
        layer(x, jnp.ones((2, 10), jnp.int32))
    with pytest.raises(ValueError, match="layer expects 16"):
        layer(jnp.zeros((2, 10, 8)))
    with pytest.raises(ValueError, match=r"x must be \[batch, seq, d_model\]"):
        layer(jnp.zeros((10, 16)))


def test_option_errors():
    with pytest.raises(ValueError, match="unknown option.*'window'.*valid"):
        make("eva", window=3)
    with pytest.raises(ValueError, match="implementation='cudnn' cannot run"):
        make("flash", implementation="cudnn")
    with pytest.raises(ValueError, match="num_features must be a positive int"):
        make("performer", num_features=0)
    for window in (0, -3, 2.5, True):   # positions, as EVA's: any positive int, even past d_k
        with pytest.raises(ValueError, match="window_size must be a positive int"):
            make("flurka-eva", d_k=8, window_size=window)
    assert make("flurka-eva", d_k=8, window_size=30).compressed_window == 10   # 30 · 8 / 24
    with pytest.raises(ValueError, match="flurka-eva: fused_projections is not available"):
        make("flurka-eva", d_k=8, fused=True, fused_projections=True)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        make("eva", chunk_size=0)
