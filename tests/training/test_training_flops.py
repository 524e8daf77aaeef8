"""The whole-model FLOP model against the dot products XLA actually compiles (forward pass and
training step)."""

import jax
import numpy as np
import pytest
from training_helpers import tiny

from flurka.hlo import compiled_dot_flops
from flurka.data import DatasetInfo
from flurka.training import flops as flops_lib
from flurka.training import loop, state
from flurka.training.tasks import make_task


def _compiled_forward_dots(config, info, batch):
    parts, params, other = state.split(loop.build_model(config, info, config.model.attention))
    task = make_task(config)
    fwd = jax.jit(lambda p, o, b: task.forward(parts.merge(p, o), b, deterministic=True))
    return compiled_dot_flops(fwd.lower(params, other, batch).compile())


def _shapes(batch):
    return {k: v.shape for k, v in batch.items()}


@pytest.mark.parametrize("attention", ["full", "linformer", "performer", "flurka-rnn", "flurka-eva"])
def test_classifier_dots_match_hlo(attention, digits):
    config = tiny(model=dict(attention=attention, num_layers=2))
    batch = loop._device_batch(next(digits.train_batches(config.batch_size)))
    model = flops_lib.forward_flops(config, digits.info, _shapes(batch), dots_only=True)
    assert model == _compiled_forward_dots(config, digits.info, batch)
    # the full count adds elementwise work on top of the matmuls
    assert flops_lib.forward_flops(config, digits.info, _shapes(batch)) > model


def test_mlm_dots_match_hlo():
    info = DatasetInfo(name="x", task="mlm", vocab_size=50, max_len=32, num_classes=50)
    config = tiny("mlm-small", max_len=32, model=dict(attention="flurka-performer"))
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(0, 50, (4, 32)).astype(np.int32), "mask": np.ones((4, 32), bool)}
    assert (flops_lib.forward_flops(config, info, _shapes(batch), dots_only=True)
            == _compiled_forward_dots(config, info, batch))


def test_seq2seq_dots_match_hlo():
    info = DatasetInfo(name="x", task="translation", vocab_size=30, max_len=16, num_classes=0,
                       target_vocab_size=40, target_max_len=12, bos_id=1, eos_id=2)
    config = tiny("nmt-small", max_len=16, model=dict(attention="linformer", num_decoder_layers=2))
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(3, 30, (4, 16)).astype(np.int32), "mask": np.ones((4, 16), bool),
             "targets": rng.integers(3, 40, (4, 12)).astype(np.int32), "targets_mask": np.ones((4, 12), bool)}
    assert (flops_lib.forward_flops(config, info, _shapes(batch), dots_only=True)
            == _compiled_forward_dots(config, info, batch))


def _soft_split_conv_flops(batch, size, channels, splits, token_dim=64):
    """How HLO counts ``conv_general_dilated_patches`` (an identity-kernel grouped convolution,
    pure data movement that the FLOP model leaves out): 2 · |output| · k²."""
    total = 0
    for i, (k, s, p) in enumerate(splits):
        size = (size + 2 * p - k) // s + 1
        total += 2 * batch * size * size * channels * k * k * k * k
        channels = token_dim
    return total


@pytest.mark.parametrize("t2t", [False, True])
def test_vit_dots_match_hlo(t2t):
    from flurka.models.vit import T2T_SPLITS
    info = DatasetInfo(name="x", task="image", vocab_size=0, max_len=0, num_classes=10, image_shape=(32, 32, 3))
    config = tiny("imagenet", max_len=17, model=dict(attention="full", patch_size=8, t2t=t2t))
    batch = {"image": np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype(np.float32)}
    model = flops_lib.forward_flops(config, info, _shapes(batch), dots_only=True)
    splits = T2T_SPLITS if t2t else ((8, 8, 0),)
    assert model + _soft_split_conv_flops(2, 32, 3, splits) == _compiled_forward_dots(config, info, batch)


def _compiled_gradient_dots(config, info, batch):
    parts, params, other = state.split(loop.build_model(config, info, config.model.attention))
    task = make_task(config)

    def loss(p, o, b):
        out = task.loss(parts.merge(p, o), b, deterministic=True)
        return out[0] if isinstance(out, tuple) else out

    return compiled_dot_flops(jax.jit(jax.grad(loss)).lower(params, other, batch).compile())


@pytest.mark.parametrize("attention", ["full", "performer", "flurka-rnn"])
def test_training_step_dots_match_the_compiled_gradient(attention, digits):
    """One convention for training FLOPs, the attention FLOP model's: the loop's count of a
    step's matrix products is the dots of the compiled gradient (performer: its fixed ω needs no
    gradient, so fewer than 3 × forward). Exact for softmax attention; within 1 % for the linear
    kernels, whose normaliser φ(q)·z has a backward outer product XLA writes as a multiply."""
    config = tiny(model=dict(attention=attention, num_layers=2))
    batch = loop._device_batch(next(digits.train_batches(config.batch_size)))
    train = flops_lib.train_step_flops(config, digits.info, _shapes(batch), dots_only=True)
    measured = _compiled_gradient_dots(config, digits.info, batch)
    assert train == measured if attention == "full" else abs(train - measured) <= 0.01 * measured
    forward = flops_lib.forward_flops(config, digits.info, _shapes(batch), dots_only=True)
    assert (train == 3 * forward) is (attention != "performer")
