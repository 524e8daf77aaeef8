"""ViT stems against independent float64 NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from flurka.models import ModelConfig, ViT, soft_split


def numpy_unfold(x: np.ndarray, k: int, s: int, p: int) -> np.ndarray:
    """torch.nn.Unfold semantics on NHWC: [B, H', W', C*k*k], features ordered (c, i, j)."""
    b, h, w, c = x.shape
    xp = np.zeros((b, h + 2 * p, w + 2 * p, c), np.float64)
    xp[:, p:p + h, p:p + w] = x
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    out = np.zeros((b, ho, wo, c * k * k), np.float64)
    for r in range(ho):
        for q in range(wo):
            for ch in range(c):
                for i in range(k):
                    for j in range(k):
                        out[:, r, q, ch * k * k + i * k + j] = xp[:, r * s + i, q * s + j, ch]
    return out


@pytest.mark.parametrize("k,s,p", [(7, 4, 2), (3, 2, 1), (3, 1, 1), (2, 2, 0)])
def test_soft_split_equals_numpy_unfold(k, s, p):
    x = np.random.default_rng(0).normal(size=(2, 9, 12, 3)).astype(np.float32)
    got = np.asarray(soft_split(x, k, s, p), np.float64)
    np.testing.assert_allclose(got, numpy_unfold(x, k, s, p), rtol=0, atol=1e-6)


def test_patch_embedding_equals_numpy_unfold_matmul():
    rng = np.random.default_rng(1)
    image = rng.normal(size=(2, 8, 12, 3)).astype(np.float32)
    config = ModelConfig("full", patch_size=4, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    model = ViT(config, image_shape=(8, 12, 3), num_classes=4, rngs=nnx.Rngs(0))
    kernel = np.asarray(model.stem.projection.kernel[...], np.float64)
    bias = np.asarray(model.stem.projection.bias[...], np.float64)
    # independent patchify: [B, H/p, p, W/p, p, C] -> [B, H/p, W/p, C, p, p]
    p = 4
    x = image.astype(np.float64).reshape(2, 2, p, 3, p, 3).transpose(0, 1, 3, 5, 2, 4)
    expected = x.reshape(2, 6, 3 * p * p) @ kernel + bias
    got = np.asarray(model.stem(image), np.float64)
    assert got.shape == (2, 6, 16)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_t2t_stem_token_grid():
    # T2T-ViT's default splits: 32x32 -> 8x8 -> 4x4 -> 2x2 tokens (16x reduction)
    config = ModelConfig("full", t2t=True, t2t_dim=8, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    model = ViT(config, image_shape=(32, 32, 3), num_classes=4, rngs=nnx.Rngs(0))
    assert model.stem.grids == ((8, 8), (4, 4), (2, 2))
    assert model.stem(np.zeros((1, 32, 32, 3), np.float32)).shape == (1, 4, 16)
    assert model.position.shape == (5, 16)  # [CLS] + 4 tokens


def test_vit_shape_errors():
    config = ModelConfig("full", d_model=16, num_heads=2, num_layers=1, d_ff=32)
    kw = dict(num_classes=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        ViT(config.replace(patch_size=4), image_shape=(10, 8, 3), **kw)
    with pytest.raises(ValueError, match="leaves no tokens"):
        ViT(config.replace(t2t=True), image_shape=(2, 2, 3), **kw)  # 7x7 kernel, stride 4: no window fits
    model = ViT(config.replace(patch_size=4), image_shape=(8, 8, 3), **kw)
    with pytest.raises(ValueError, match=r"image must be \[batch"):
        model(np.zeros((1, 8, 8, 1), np.float32))
