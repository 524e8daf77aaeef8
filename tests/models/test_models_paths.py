"""Parameter paths are identical across mechanisms where up-training copies by path."""

from __future__ import annotations

import numpy as np
from model_helpers import tiny_kwargs
from flax import nnx

from flurka.attention import MECHANISMS
from flurka.models import EncoderClassifier

ROLES = ("query", "key", "value", "out", "seq_proj")


def attention_params(mechanism: str) -> dict[tuple, np.ndarray]:
    """{path inside layers[i].attention: value} for a 2-layer classifier."""
    model = EncoderClassifier(vocab_size=11, num_classes=2, max_len=16,
                              **tiny_kwargs(mechanism, num_layers=2))
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if path[:2] == ("encoder", "layers") and path[3] == "attention":
            out[path] = np.asarray(var[...])
    return out


def test_attention_paths_are_mechanism_independent():
    for mechanism in MECHANISMS:
        roles = {p[4] for p in attention_params(mechanism)}
        assert {"query", "key", "value", "out"} <= roles, (mechanism, roles)


def test_linformer_and_flurka_performer_share_copyable_paths():
    lin = attention_params("linformer")
    fp = attention_params("flurka-performer")
    shared = {p for p in lin if p[4] in ROLES}
    assert {p[4] for p in shared} == set(ROLES)
    assert {p[2] for p in shared} == {0, 1}
    assert shared <= set(fp), sorted(shared - set(fp))
    for path in shared:  # same shapes: the values can be copied as they are
        assert lin[path].shape == fp[path].shape, path


def test_copy_by_path_from_linformer_into_flurka_performer():
    """The up-training switch: every Param path present in both models takes the base value."""
    base = EncoderClassifier(vocab_size=11, num_classes=2, max_len=16, **tiny_kwargs("linformer"))
    target = EncoderClassifier(vocab_size=11, num_classes=2, max_len=16,
                               **tiny_kwargs("flurka-performer", rngs=nnx.Rngs(params=5, dropout=6)))
    src = dict(nnx.to_flat_state(nnx.state(base, nnx.Param)))
    dst = nnx.state(target, nnx.Param)
    flat = dict(nnx.to_flat_state(dst))
    assert set(src) <= set(flat)
    for path, var in src.items():
        flat[path].set_value(var[...])
    nnx.update(target, dst)
    after = dict(nnx.to_flat_state(nnx.state(target, nnx.Param)))
    for path, var in src.items():
        np.testing.assert_array_equal(np.asarray(after[path][...]), np.asarray(var[...]))
