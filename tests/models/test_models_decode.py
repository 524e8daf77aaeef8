"""Decoder causality and decoding: greedy against an independent argmax loop over __call__,
beam_size=1 against greedy, and beam search against brute-force enumeration."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import padded_batch
from flax import nnx

from flurka.models import ModelConfig, Seq2Seq

SRC_VOCAB, PAD, BOS, EOS = 17, 0, 1, 2


def tiny_seq2seq(target_vocab: int, seed: int = 0, **kw) -> Seq2Seq:
    # untied output layer: logits of order 1, so the decoding choices are not near-ties
    config = ModelConfig("full", d_model=16, num_heads=2, num_layers=2, d_ff=32,
                         **({"tie_output": False} | kw))
    return Seq2Seq(config, vocab_size=SRC_VOCAB, target_vocab_size=target_vocab, max_len=10,
                   target_max_len=8, rngs=nnx.Rngs(params=seed, dropout=seed + 1))


@nnx.jit
def logits(model, x, m, dec):
    """__call__ on a whole decoder input (compiled: eagerly each operation would compile on its
    own, for every decoder length)."""
    return model(x, m, dec, jnp.ones_like(dec, bool))


def test_decoder_is_causal():
    rng = np.random.default_rng(0)
    model = tiny_seq2seq(11)
    x, m = padded_batch(rng, (10, 6), 10, SRC_VOCAB)
    y = rng.integers(3, 11, size=(2, 7)).astype(np.int32)
    y[:, 0] = BOS
    base = np.asarray(logits(model, x, m, y))
    for j in (1, 4, 6):
        y2 = y.copy()
        y2[:, j] = (y[:, j] - 2) % 8 + 3  # another real token
        out = np.asarray(logits(model, x, m, y2))
        np.testing.assert_array_equal(out[:, :j], base[:, :j])
        assert np.abs(out[:, j:] - base[:, j:]).max() > 1e-6  # the change is seen from j on


@pytest.mark.parametrize("kw", [{}, {"positions": "sinusoidal", "tie_output": True}])
def test_cached_step_equals_call_at_every_position(kw):
    """Decoder.step, fed one token at a time with its cache, gives __call__'s logits at each
    position (the decoders' per-position cost without recomputing the prefix)."""
    rng = np.random.default_rng(3)
    model = tiny_seq2seq(11, seed=4, **kw)
    x, m = padded_batch(rng, (10, 6, 3), 10, SRC_VOCAB)
    y = rng.integers(3, 11, size=(3, 8)).astype(np.int32)
    y[:, 0] = BOS
    full = np.asarray(logits(model, x, m, y))

    @nnx.jit
    def stepwise(model, x, m, y):
        encoded = model.encode(x, m)
        cross = model.decoder.cross_keys_values(encoded)
        cache, out = model.decoder.init_cache(y.shape[0], y.shape[1]), []
        for t in range(y.shape[1]):
            step, cache = model.decoder.step(y[:, t], jnp.int32(t), cache, cross, m)
            out.append(step)
        return jnp.stack(out, axis=1)

    np.testing.assert_allclose(np.asarray(stepwise(model, x, m, y)), full, rtol=1e-5, atol=1e-5)


def reference_greedy(model, x, m, max_len):
    """Independent: grow the decoder input one token at a time through __call__."""
    b = x.shape[0]
    dec = np.full((b, 1), BOS, np.int32)
    out = np.full((b, max_len), PAD, np.int32)
    done = np.zeros(b, bool)
    for t in range(max_len):
        step = np.asarray(logits(model, x, m, dec))
        tok = np.where(done, PAD, step[:, -1].argmax(-1)).astype(np.int32)
        out[:, t] = tok
        done |= tok == EOS
        dec = np.concatenate([dec, tok[:, None]], axis=1)
    return out


@pytest.fixture(scope="module")
def greedy_case():
    rng = np.random.default_rng(5)
    x, m = padded_batch(rng, (10, 7, 4, 9, 10, 3), 10, SRC_VOCAB)
    model = tiny_seq2seq(5, seed=2)
    kernel = model.decoder.logits.kernel  # sharper logits: varied tokens, early and late EOS
    kernel[...] = kernel[...] * 8.0
    greedy = nnx.jit(lambda mod, a, b: mod.greedy_decode(a, b, max_len=6, bos_id=BOS, eos_id=EOS))
    return model, x, m, np.asarray(greedy(model, x, m))


def test_greedy_matches_step_by_step_argmax(greedy_case):
    model, x, m, out = greedy_case
    assert out.shape == (6, 6) and out.dtype == np.int32
    np.testing.assert_array_equal(out, reference_greedy(model, x, m, 6))
    # the batch exercises both an early EOS (then padding) and a run to max_len
    ends = [(row == EOS).any() for row in out]
    assert any(ends) and not all(ends), out


def test_beam_size_one_equals_greedy(greedy_case):
    model, x, m, out = greedy_case
    for alpha in (0.0, 0.6, 2.0):
        beam = model.beam_search(x, m, beam_size=1, max_len=6, bos_id=BOS, eos_id=EOS,
                                 length_penalty=alpha)
        np.testing.assert_array_equal(np.asarray(beam), out)


def brute_force_best(model, x, m, vocab, max_len, alpha):
    """Score every hypothesis that ends in EOS within max_len: log p / ((5 + len) / 6) ** alpha."""
    others = [v for v in range(vocab) if v != EOS]
    b = x.shape[0]
    best = [(-np.inf, None)] * b
    for length in range(1, max_len + 1):
        for prefix in itertools.product(others, repeat=length - 1):
            seq = list(prefix) + [EOS]
            dec = np.array([[BOS] + seq[:-1]] * b, np.int32)
            logp = np.asarray(jax.nn.log_softmax(logits(model, x, m, dec), -1), np.float64)
            total = logp[:, np.arange(length), seq].sum(-1)
            score = total / ((5.0 + length) / 6.0) ** alpha
            padded = seq + [PAD] * (max_len - length)
            best = [(s, padded) if s > best[i][0] else best[i] for i, s in enumerate(score)]
    return best


@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_beam_search_finds_brute_force_optimum(alpha):
    vocab, max_len = 5, 3
    rng = np.random.default_rng(7)
    x, m = padded_batch(rng, (10, 5, 8), 10, SRC_VOCAB)
    model = tiny_seq2seq(vocab, seed=11)
    # wide enough to keep every hypothesis: 4 x 4 live after two steps, 80 candidates at step 3
    seqs, scores = model.beam_search(x, m, beam_size=128, max_len=max_len, bos_id=BOS,
                                     eos_id=EOS, length_penalty=alpha, return_scores=True)
    expected = brute_force_best(model, x, m, vocab, max_len, alpha)
    np.testing.assert_allclose(np.asarray(scores), [s for s, _ in expected], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(seqs), np.array([s for _, s in expected]))


def test_decode_rejects_bad_arguments():
    model = tiny_seq2seq(5)
    x = np.ones((1, 4), np.int32)
    m = np.ones((1, 4), bool)
    with pytest.raises(ValueError, match="target_max_len"):
        model.greedy_decode(x, m, max_len=9, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="eos_id"):
        model.beam_search(x, m, beam_size=2, max_len=3, bos_id=BOS, eos_id=5)
    with pytest.raises(ValueError, match="max_len"):
        model.greedy_decode(np.ones((1, 11), np.int32), np.ones((1, 11), bool), max_len=3,
                            bos_id=BOS, eos_id=EOS)
