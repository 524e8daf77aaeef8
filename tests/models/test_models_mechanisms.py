"""Every model runs with every attention mechanism: output shapes, finite gradients that reach
the attention, and padding exactness (padded tokens never change real outputs)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import padded_batch, repad, tiny_kwargs
from flax import nnx

from flurka.attention import MECHANISMS
from flurka.models import EncoderClassifier, MLMEncoder, Seq2Seq, ViT

VOCAB, MAX_LEN, N = 23, 16, 12
LENGTHS = (12, 7)
KINDS = ("classifier-concat", "classifier-two-tower", "mlm", "seq2seq", "vit", "vit-t2t")


def build(kind: str, mechanism: str):
    """(model, call(model, deterministic) -> output, expected output shape)."""
    rng = np.random.default_rng(0)
    x, m = padded_batch(rng, LENGTHS, N, VOCAB)
    b = len(LENGTHS)
    if kind == "classifier-concat":
        model = EncoderClassifier(vocab_size=VOCAB, num_classes=3, max_len=MAX_LEN, pair="concat",
                                  **tiny_kwargs(mechanism, pooling="cls"))
        seg = (np.arange(N)[None] >= 4).astype(np.int32) * m
        return model, lambda mod, det: mod(x, m, segments=seg, deterministic=det), (b, 3)
    if kind == "classifier-two-tower":
        model = EncoderClassifier(vocab_size=VOCAB, num_classes=2, max_len=MAX_LEN,
                                  pair="two-tower", **tiny_kwargs(mechanism, pooling="mean"))
        x2, m2 = padded_batch(rng, (5, 12), N, VOCAB)
        return model, lambda mod, det: mod(x, m, inputs2=x2, mask2=m2, deterministic=det), (b, 2)
    if kind == "mlm":
        model = MLMEncoder(vocab_size=VOCAB, max_len=MAX_LEN, **tiny_kwargs(mechanism))
        return model, lambda mod, det: mod(x, m, deterministic=det), (b, N, VOCAB)
    if kind == "seq2seq":
        model = Seq2Seq(vocab_size=VOCAB, target_vocab_size=11, max_len=MAX_LEN, target_max_len=8,
                        **tiny_kwargs(mechanism))
        y, ym = padded_batch(rng, (6, 3), 6, 11)
        return model, lambda mod, det: mod(x, m, y, ym, deterministic=det), (b, 6, 11)
    image = rng.normal(size=(b, 8, 8, 3)).astype(np.float32)
    if kind == "vit":
        model = ViT(image_shape=(8, 8, 3), num_classes=5, **tiny_kwargs(mechanism, patch_size=2))
    else:  # soft split 8x8 -> 4x4, re-structurize, soft split -> 2x2 tokens
        model = ViT(image_shape=(8, 8, 3), num_classes=5,
                    **tiny_kwargs(mechanism, t2t=True, t2t_splits=((3, 2, 1), (3, 2, 1)), t2t_dim=8))
    return model, lambda mod, det: mod(image, deterministic=det), (b, 5)


# Every model reaches the mechanism through the one shared Encoder, so the full 9-mechanism matrix
# runs on the classifier; the other models run with one mechanism of each family (low-rank with E1/E2,
# random features, local windows + control variates fused with E1/E2) to keep CI time in budget.
CASES = [("classifier-concat", m) for m in MECHANISMS] + [
    (kind, m) for kind in KINDS[1:] for m in ("linformer", "performer", "flurka-eva")]


@pytest.mark.parametrize(("kind", "mechanism_name"), CASES)
def test_shapes_and_finite_grads(kind, mechanism_name):
    model, call, shape = build(kind, mechanism_name)

    def loss_fn(mod):  # dropout on: the training path
        return jnp.mean(jnp.square(call(mod, False)))

    # one program per case: the file ran in 111 s op by op and 90 s so (-n 2, 2-core host)
    @nnx.jit
    def step(mod):
        return call(mod, True), *nnx.value_and_grad(loss_fn)(mod)

    out, loss, grads = step(model)
    assert out.shape == shape
    assert np.isfinite(np.asarray(out)).all()
    assert np.isfinite(float(loss))
    flat = dict(nnx.to_flat_state(grads))
    assert flat, "no gradients"
    for path, g in flat.items():
        assert np.isfinite(np.asarray(g[...])).all(), f"non-finite grad at {path}"
    # the gradient reaches the swapped attention of the shared encoder
    q = np.asarray(flat[("encoder", "layers", 0, "attention", "query", "kernel")][...])
    assert np.abs(q).max() > 0


def max_abs_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_ignores_padding(mechanism, pooling):
    rng = np.random.default_rng(1)
    x, m = padded_batch(rng, LENGTHS, N, VOCAB)
    model = EncoderClassifier(vocab_size=VOCAB, num_classes=4, max_len=MAX_LEN,
                              **tiny_kwargs(mechanism, pooling=pooling))
    base = model(x, m)
    assert max_abs_diff(base, model(repad(rng, x, m, VOCAB), m)) < 1e-5
    # the real tokens do matter (the check above is not vacuous)
    x_real = x.copy()
    x_real[1, 2] = x[1, 2] % (VOCAB - 1) + 1
    assert max_abs_diff(base[1], model(x_real, m)[1]) > 1e-6


def test_two_tower_ignores_padding(mechanism):
    rng = np.random.default_rng(2)
    x, m = padded_batch(rng, LENGTHS, N, VOCAB)
    x2, m2 = padded_batch(rng, (4, 9), N, VOCAB)
    model = EncoderClassifier(vocab_size=VOCAB, num_classes=2, max_len=MAX_LEN, pair="two-tower",
                              **tiny_kwargs(mechanism, pooling="mean"))
    base = model(x, m, inputs2=x2, mask2=m2)
    other = model(repad(rng, x, m, VOCAB), m, inputs2=repad(rng, x2, m2, VOCAB), mask2=m2)
    assert max_abs_diff(base, other) < 1e-5


def test_mlm_ignores_padding_at_real_positions(mechanism):
    rng = np.random.default_rng(3)
    x, m = padded_batch(rng, LENGTHS, N, VOCAB)
    model = MLMEncoder(vocab_size=VOCAB, max_len=MAX_LEN, **tiny_kwargs(mechanism))
    base, other = model(x, m), model(repad(rng, x, m, VOCAB), m)
    assert max_abs_diff(np.asarray(base)[m], np.asarray(other)[m]) < 1e-5


def test_seq2seq_ignores_source_padding(mechanism):
    rng = np.random.default_rng(4)
    x, m = padded_batch(rng, LENGTHS, N, VOCAB)
    y, ym = padded_batch(rng, (6, 4), 6, 11)
    model = Seq2Seq(vocab_size=VOCAB, target_vocab_size=11, max_len=MAX_LEN, target_max_len=8,
                    **tiny_kwargs(mechanism))
    base = model(x, m, y, ym)
    assert max_abs_diff(base, model(repad(rng, x, m, VOCAB), m, y, ym)) < 1e-5
