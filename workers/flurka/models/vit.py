"""Vision transformer with a patch stem or a tokens-to-token (T2T-ViT, Yuan et al. 2021) stem.

Patch stem: non-overlapping p×p patches, flattened channel-major (C, p, p), linear to d_model.
T2T stem: soft split (overlapping unfold, like torch ``nn.Unfold``) -> re-structurization (a
small transformer block over the tokens, reshaped back to an image) -> soft split ... -> linear
to d_model; T2T-ViT's default splits are kernel/stride/padding (7,4,2), (3,2,1), (3,2,1), i.e. a
16× reduction. The stem's blocks use the model's attention mechanism unless ``t2t_attention``
names another, so the whole model swaps only the attention. A learned [CLS] token and learned
positions precede the shared encoder.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from flurka.models.checks import check_positive_int
from flurka.configs.model import T2T_SPLITS, ModelConfig
from flurka.models.embedding import EMBED_INIT
from flurka.models.encoder import Encoder, EncoderBlock

__all__ = ["T2T_SPLITS", "ViT", "soft_split"]


def split_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def soft_split(x: jax.Array, kernel: int, stride: int, padding: int) -> jax.Array:
    """Unfold [B, H, W, C] -> [B, H', W', C*kernel*kernel], features ordered (C, kh, kw) as
    torch ``nn.Unfold``; zero padding on all sides."""
    return jax.lax.conv_general_dilated_patches(
        x, filter_shape=(kernel, kernel), window_strides=(stride, stride),
        padding=((padding, padding), (padding, padding)),
        dimension_numbers=("NHWC", "OIHW", "NHWC"), precision=jax.lax.Precision.HIGHEST)


class PatchEmbedding(nnx.Module):
    """[B, H, W, C] -> [B, (H/p)(W/p), d_model]."""

    def __init__(self, *, image_shape: Sequence[int], patch_size: int, d_model: int,
                 rngs: nnx.Rngs):
        h, w, c = image_shape
        if h % patch_size or w % patch_size:
            raise ValueError(f"image {h}x{w} is not divisible by patch_size={patch_size}")
        self.patch_size = patch_size
        self.grid = (h // patch_size, w // patch_size)
        self.projection = nnx.Linear(c * patch_size * patch_size, d_model, rngs=rngs)

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    def __call__(self, image: jax.Array, *, deterministic: bool = True) -> jax.Array:
        p = self.patch_size
        patches = soft_split(image, p, p, 0)
        return self.projection(patches.reshape(patches.shape[0], -1, patches.shape[-1]))


class T2TEmbedding(nnx.Module):
    """Tokens-to-token stem: (soft split -> linear -> transformer block -> fold back) × (n-1),
    final soft split -> linear to d_model."""

    def __init__(self, config: ModelConfig, *, image_shape: Sequence[int], rngs: nnx.Rngs):
        """The stem of ``config``'s T2T fields; its blocks are ``t2t_dim`` wide, one head each,
        ``t2t_attention`` (default: ``attention``)."""
        d_model, splits, token_dim = config.d_model, config.t2t_splits, config.t2t_dim
        check_positive_int("t2t_dim", token_dim)
        block = config.replace(d_model=token_dim, num_heads=1, d_ff=token_dim,
                               attention=config.t2t_attention or config.attention)
        if not splits:
            raise ValueError("t2t_splits must list at least one (kernel, stride, padding)")
        h, w, c = image_shape
        self.splits = tuple(tuple(int(v) for v in s) for s in splits)
        projections, blocks, grids = [], [], []
        channels = c
        for i, (k, s, p) in enumerate(self.splits):
            if k <= 0 or s <= 0 or p < 0:
                raise ValueError(f"t2t split {i} (kernel, stride, padding)={(k, s, p)} is invalid")
            h, w = split_size(h, k, s, p), split_size(w, k, s, p)
            if h < 1 or w < 1:
                raise ValueError(f"t2t split {i} {(k, s, p)} leaves no tokens for image "
                                 f"{tuple(image_shape)}; use smaller kernels/strides")
            grids.append((h, w))
            last = i == len(self.splits) - 1
            projections.append(nnx.Linear(channels * k * k, d_model if last else token_dim,
                                          rngs=rngs))
            if not last:
                blocks.append(EncoderBlock(block, max_len=h * w, rngs=rngs))
                channels = token_dim
        self.grids = tuple(grids)
        self.projections = nnx.List(projections)
        self.blocks = nnx.List(blocks)

    @property
    def num_tokens(self) -> int:
        return self.grids[-1][0] * self.grids[-1][1]

    def __call__(self, image: jax.Array, *, deterministic: bool = True) -> jax.Array:
        x = image
        b = image.shape[0]
        for i, (k, s, p) in enumerate(self.splits):
            tokens = soft_split(x, k, s, p)
            tokens = self.projections[i](tokens.reshape(b, -1, tokens.shape[-1]))
            if i == len(self.splits) - 1:
                return tokens
            tokens = self.blocks[i](tokens, None, deterministic=deterministic)
            x = tokens.reshape((b,) + self.grids[i] + (tokens.shape[-1],))
        raise AssertionError("unreachable")


class ViT(nnx.Module):
    """image [B, H, W, C] float -> logits [B, num_classes]. ``patch_size`` is the patch stem's;
    with ``t2t=True`` the stem is set by ``t2t_splits`` instead."""

    def __init__(self, config: ModelConfig, *, image_shape: Sequence[int], num_classes: int,
                 rngs: nnx.Rngs):
        image_shape = tuple(image_shape)
        if len(image_shape) != 3 or not all(isinstance(v, int) and v > 0 for v in image_shape):
            raise ValueError(f"image_shape must be (H, W, C) positive ints, got {image_shape}")
        check_positive_int("num_classes", num_classes)
        d_model = config.d_model
        self.image_shape, self.pooling = image_shape, config.pooling or "cls"
        if config.t2t:
            self.stem = T2TEmbedding(config, image_shape=image_shape, rngs=rngs)
        else:
            check_positive_int("patch_size", config.patch_size)
            self.stem = PatchEmbedding(image_shape=image_shape, patch_size=config.patch_size,
                                       d_model=d_model, rngs=rngs)
        n = self.stem.num_tokens + 1
        self.cls = nnx.Param(jnp.zeros((1, 1, d_model)))
        self.position = nnx.Param(EMBED_INIT(rngs.params(), (n, d_model)))
        self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
        self.encoder = Encoder(config, max_len=n, rngs=rngs)
        self.head = nnx.Linear(d_model, num_classes, rngs=rngs)

    def __call__(self, image: jax.Array, *, deterministic: bool = True,
                 attention_rng: jax.Array | None = None) -> jax.Array:
        shape = getattr(image, "shape", None)
        if shape is None or len(shape) != 4 or tuple(shape[1:]) != self.image_shape:
            raise ValueError(f"image must be [batch, *{self.image_shape}], got shape {shape}")
        if not jnp.issubdtype(image.dtype, jnp.floating):
            raise ValueError(f"image must be floating point (normalized), got {image.dtype}")
        x = self.stem(image, deterministic=deterministic)
        cls = jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[-1])).astype(x.dtype)
        x = jnp.concatenate([cls, x], axis=1) + self.position[...]
        x = self.dropout(x, deterministic=deterministic)
        x = self.encoder(x, deterministic=deterministic, attention_rng=attention_rng)
        pooled = x[:, 0] if self.pooling == "cls" else x[:, 1:].mean(axis=1)
        return self.head(pooled)
