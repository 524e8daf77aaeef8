"""build_model picks the architecture from the data set's task; bad input fails early and clearly."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flax import nnx

from flurka.models import EncoderClassifier, MLMEncoder, ModelConfig, Seq2Seq, ViT, build_model

CFG = dict(attention="full", d_model=16, num_heads=2, num_layers=1, d_ff=32)


def info(task, **kw):
    base = dict(name="t", task=task, vocab_size=13, max_len=10, num_classes=3, pair=None,
                target_vocab_size=0, target_max_len=0, image_shape=(), cls_id=None)
    return SimpleNamespace(**{**base, **kw})


def test_build_model_per_task():
    x, m = np.ones((2, 10), np.int32), np.ones((2, 10), bool)
    clf = build_model(info("classification", cls_id=1), CFG)
    assert isinstance(clf, EncoderClassifier) and clf.pooling == "cls"
    assert clf(x, m).shape == (2, 3)
    reg = build_model(info("regression", num_classes=1), CFG)
    assert reg.pooling == "mean" and reg(x, m).shape == (2, 1)
    tower = build_model(info("classification", pair="two-tower", num_classes=2), CFG)
    assert tower(x, m, inputs2=x, mask2=m).shape == (2, 2)
    mlm = build_model(info("mlm", num_classes=13), CFG)
    assert isinstance(mlm, MLMEncoder) and mlm(x, m).shape == (2, 10, 13)
    s2s = build_model(info("translation", target_vocab_size=7, target_max_len=5), CFG)
    assert isinstance(s2s, Seq2Seq) and s2s(x, m, x[:, :5] % 7).shape == (2, 5, 7)
    vit = build_model(info("image", vocab_size=0, image_shape=(8, 8, 1), num_classes=10),
                      {**CFG, "patch_size": 4})
    assert isinstance(vit, ViT) and vit(np.zeros((2, 8, 8, 1), np.float32)).shape == (2, 10)


def test_build_model_is_seeded():
    a = build_model(info("classification"), {**CFG, "seed": 3})
    b = build_model(info("classification"), {**CFG, "seed": 3})
    c = build_model(info("classification"), {**CFG, "seed": 4})
    ka, kb, kc = (np.asarray(mod.head.logits.kernel[...]) for mod in (a, b, c))
    np.testing.assert_array_equal(ka, kb)
    assert not np.array_equal(ka, kc)


@pytest.mark.parametrize("task,cfg,match", [
    ("classification", {**CFG, "attenton_options": {}}, "unknown model_config key"),
    ("classification", {k: v for k, v in CFG.items() if k != "attention"}, "needs 'attention'"),
    ("classification", {**CFG, "attention": "softmax"}, "unknown attention mechanism"),
    ("clustering", CFG, "unknown task"),
    ("classification", {**CFG, "pooling": "max"}, "unknown pooling"),
    ("classification", {**CFG, "num_heads": 3}, "must divide d_model"),
])
def test_build_model_rejects_bad_config(task, cfg, match):
    with pytest.raises(ValueError, match=match):
        build_model(info(task), cfg)


def test_call_time_errors():
    model = EncoderClassifier(ModelConfig(**CFG), vocab_size=13, num_classes=2, max_len=8, rngs=nnx.Rngs(0))
    ok_mask = np.ones((1, 8), bool)
    with pytest.raises(ValueError, match="max_len=8"):
        model(np.ones((1, 9), np.int32), np.ones((1, 9), bool))
    with pytest.raises(ValueError, match="must be bool"):
        model(np.ones((1, 8), np.int32), np.ones((1, 8), np.int32))
    with pytest.raises(ValueError, match="mask must have shape"):
        model(np.ones((1, 8), np.int32), np.ones((1, 7), bool))
    with pytest.raises(ValueError, match="integer token ids"):
        model(np.ones((1, 8), np.float32), ok_mask)
    with pytest.raises(ValueError, match="two-tower"):
        model(np.ones((1, 8), np.int32), ok_mask, inputs2=np.ones((1, 8), np.int32), mask2=ok_mask)
    pair = EncoderClassifier(ModelConfig(**CFG), vocab_size=13, num_classes=2, max_len=8, pair="concat",
                             rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="segments"):
        pair(np.ones((1, 8), np.int32), ok_mask)
