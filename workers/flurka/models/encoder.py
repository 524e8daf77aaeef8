"""The shared transformer encoder: a stack of pre-LN blocks around a swappable attention.

Every model in the package uses this stack, and the paper swaps only the attention, so the
attention submodule sits at the same path for every mechanism
(``layers[i].attention.{query,key,value,out,seq_proj}``): up-training copies parameters by path.
Embeddings stay outside (tokens, patches and T2T tokens all feed the same stack).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from flurka.attention import make_attention
from flurka.attention.execution import kernel
from flurka.models.checks import check_mask, check_positive_int
from flurka.configs.model import ModelConfig


class FeedForward(nnx.Module):
    """Position-wise d_model -> d_ff -> d_model with GELU."""

    def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(d_model, d_ff, rngs=rngs)
        self.fc2 = nnx.Linear(d_ff, d_model, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.gelu(self.fc1(x)))


class EncoderBlock(nnx.Module):
    """x + Drop(Attn(LN(x))); x + Drop(FFN(LN(x))).

    ``fused_ffn`` (True or a :class:`~flurka.kernels.ffn.FfnTiling`): the second residual,
    the LayerNorm and the FFN run as Pallas kernels (:mod:`flurka.kernels.ffn`, same maths)
    wherever dropout is off; with dropout active the XLA path runs (the kernels have none)."""

    def __init__(self, config: ModelConfig, *, max_len: int, rngs: nnx.Rngs):
        c = config
        self.attention_norm = nnx.LayerNorm(c.d_model, rngs=rngs)
        self.attention = make_attention(c.attention, d_model=c.d_model, num_heads=c.num_heads,
                                        max_len=max_len, rngs=rngs, **c.attention_options)
        self.ffn_norm = nnx.LayerNorm(c.d_model, rngs=rngs)
        self.ffn = FeedForward(c.d_model, c.d_ff, rngs=rngs)
        self.dropout = nnx.Dropout(c.dropout_rate, rngs=rngs)
        self.ffn_tiling = (kernel("ffn_tiling", "fused_ffn=True")(c.fused_ffn, c.d_model, c.d_ff)
                           if c.fused_ffn else None)

    def __call__(self, x: jax.Array, mask: jax.Array | None, *, deterministic: bool,
                 rng: jax.Array | None = None) -> jax.Array:
        return self.forward(x, mask, deterministic=deterministic, rng=rng)[0]

    def forward(self, x: jax.Array, mask: jax.Array | None, *, deterministic: bool,
                rng: jax.Array | None = None, statistics=None,
                next_eps: float | None = None) -> tuple[jax.Array, Any]:
        """(the block's output, its rows' statistics for a next LayerNorm with ``next_eps``
        where the one-kernel fused FFN computed them as it wrote them, else None).
        ``statistics``: x's, for this block's attention LayerNorm (the previous block's)."""
        fused_ffn = self.ffn_tiling is not None and (deterministic or self.dropout.rate == 0.0)
        residual = fused_ffn and self.attention.fuses_norm
        if self.attention.fuses_norm:
            # The LayerNorm handed over: the layer normalises x in its kernels as it loads it.
            # Where the FFN block is a kernel too (no dropout between them), the layer's kernel
            # writes x + a, and the FFN block reads that one operand.
            a = self.attention.fused_block(x, mask, norm=self.attention_norm, rng=rng,
                                           statistics=statistics, residual=residual)
        else:
            a = self.attention(self.attention_norm(x), mask, rng=rng)
        a = self.dropout(a, deterministic=deterministic)
        if fused_ffn:
            norm, ffn = self.ffn_norm, self.ffn
            x, a = (a, None) if residual else (x, a)
            block = kernel("fused_ffn_block", "fused_ffn=True")
            out = block(x, a, norm.scale[...], norm.bias[...], ffn.fc1.kernel[...], ffn.fc1.bias[...],
                        ffn.fc2.kernel[...], ffn.fc2.bias[...], eps=norm.epsilon, tiling=self.ffn_tiling,
                        next_eps=next_eps)
            return out if next_eps is not None else (out, None)
        x = x + a
        return x + self.dropout(self.ffn(self.ffn_norm(x)), deterministic=deterministic), None


class Encoder(nnx.Module):
    """[B, N, d_model] (+ mask [B, N]) -> [B, N, d_model]; ends with a LayerNorm (pre-LN).
    ``config.fused_ffn``: every block's (:class:`EncoderBlock`)."""

    def __init__(self, config: ModelConfig, *, max_len: int, rngs: nnx.Rngs):
        check_positive_int("max_len", max_len)
        self.d_model, self.max_len, self.mechanism = config.d_model, max_len, config.attention
        self.remat = config.remat
        self.layers = nnx.List([EncoderBlock(config, max_len=max_len, rngs=rngs)
                                for _ in range(config.num_layers)])
        self.final_norm = nnx.LayerNorm(config.d_model, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array | None = None, *, deterministic: bool = True,
                 attention_rng: jax.Array | None = None) -> jax.Array:
        """``attention_rng`` (optional) reaches mechanisms that redraw random features."""
        if getattr(x, "ndim", None) != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"encoder input must be [batch, seq, {self.d_model}], "
                             f"got shape {getattr(x, 'shape', None)}")
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} > max_len={self.max_len}")
        if mask is not None:
            check_mask("mask", mask, x.shape[:2])
        rngs = (jax.random.split(attention_rng, len(self.layers)) if attention_rng is not None
                else [None] * len(self.layers))
        statistics = None
        for i, (layer, rng) in enumerate(zip(self.layers, rngs)):
            def block(layer, x, mask, rng, statistics, eps=self._next_eps(i)):
                return layer.forward(x, mask, deterministic=deterministic, rng=rng, statistics=statistics,
                                     next_eps=eps)
            if self.remat:    # keep the block's input, recompute the rest in the backward pass
                block = nnx.remat(block)
            x, statistics = block(layer, x, mask, rng, statistics)
        return self.final_norm(x)

    def _next_eps(self, i: int) -> float | None:
        """Block i + 1's attention LayerNorm eps where that layer normalises in its kernels
        (``fuses_norm``): block i's fused FFN then hands it x's statistics."""
        if i + 1 < len(self.layers) and self.layers[i + 1].attention.fuses_norm:
            return self.layers[i + 1].attention_norm.epsilon
        return None


def masked_mean(x: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Mean over real tokens: [B, N, D], [B, N] -> [B, D] (padding contributes exactly 0)."""
    if mask is None:
        return x.mean(axis=1)
    weights = mask.astype(x.dtype)[..., None]
    total = jnp.where(mask[..., None], x, 0).sum(axis=1)
    return total / jnp.maximum(weights.sum(axis=1), 1.0)
