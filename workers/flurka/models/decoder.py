"""Translation decoder: causal self-attention, cross-attention to the encoder, FFN (pre-LN).

The paper applies its mechanisms to the encoder only; the decoder always uses exact softmax
attention. These layers are not part of the mechanism family (they need a causal mask and keys
from another sequence), so they live here, built from the attention package's head helpers and
``jax.nn.dot_product_attention`` (cuDNN where it applies).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from flurka.attention.base import merge_heads, split_heads
from flurka.models.checks import check_mask
from flurka.configs.model import ModelConfig
from flurka.models.embedding import Embedding
from flurka.models.encoder import FeedForward


class DotProductAttention(nnx.Module):
    """Multi-head softmax attention of queries from x over keys/values from ``context``."""

    def __init__(self, d_model: int, num_heads: int, *, rngs: nnx.Rngs):
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.num_heads = num_heads
        self.query = nnx.Linear(d_model, d_model, rngs=rngs)
        self.key = nnx.Linear(d_model, d_model, rngs=rngs)
        self.value = nnx.Linear(d_model, d_model, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, rngs=rngs)

    def __call__(self, x: jax.Array, context: jax.Array, mask: jax.Array) -> jax.Array:
        """x [B, T, D], context [B, S, D], mask bool broadcastable to [B, heads, T, S]."""
        return self.attend(x, *self.keys_values(context), mask)

    def keys_values(self, context: jax.Array) -> tuple[jax.Array, jax.Array]:
        """context [B, S, D] -> keys, values [B, S, heads, d_h]."""
        return (split_heads(self.key(context), self.num_heads),
                split_heads(self.value(context), self.num_heads))

    def attend(self, x: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """Queries from x [B, T, D] over keys/values already projected [B, S, heads, d_h]."""
        q = split_heads(self.query(x), self.num_heads)
        return self.out(merge_heads(jax.nn.dot_product_attention(q, k, v, mask=mask)))


def causal_mask(decoder_mask: jax.Array | None, length: int) -> jax.Array:
    """[B or 1, 1, T, T]: position t sees real positions <= t."""
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]
    if decoder_mask is None:
        return causal
    return causal & decoder_mask[:, None, None, :]


class DecoderBlock(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d_model, num_heads = config.d_model, config.num_heads
        self.self_attention_norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.self_attention = DotProductAttention(d_model, num_heads, rngs=rngs)
        self.cross_attention_norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.cross_attention = DotProductAttention(d_model, num_heads, rngs=rngs)
        self.ffn_norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.ffn = FeedForward(d_model, config.d_ff, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)

    def __call__(self, y, encoded, self_mask, cross_mask, *, deterministic: bool):
        h = self.self_attention_norm(y)
        y = y + self.dropout(self.self_attention(h, h, self_mask), deterministic=deterministic)
        h = self.cross_attention_norm(y)
        y = y + self.dropout(self.cross_attention(h, encoded, cross_mask),
                             deterministic=deterministic)
        return y + self.dropout(self.ffn(self.ffn_norm(y)), deterministic=deterministic)

    def step(self, y, t, cache, cross, cross_mask):
        """One position y [B, 1, D] at index t in evaluation mode: its key and value go into the
        self-attention cache (k, v [B, L, heads, d_h]), its query sees cache positions <= t."""
        h = self.self_attention_norm(y)
        k, v = (jax.lax.dynamic_update_slice_in_dim(c, new, t, axis=1)
                for c, new in zip(cache, self.self_attention.keys_values(h)))
        seen = (jnp.arange(k.shape[1]) <= t)[None, None, None, :]
        y = y + self.self_attention.attend(h, k, v, seen)
        y = y + self.cross_attention.attend(self.cross_attention_norm(y), *cross, cross_mask)
        return y + self.ffn(self.ffn_norm(y)), (k, v)


class Decoder(nnx.Module):
    """decoder_inputs [B, T] (BOS-shifted targets) + encoded [B, S, D] -> logits [B, T, vocab]."""

    def __init__(self, config: ModelConfig, *, vocab_size: int, max_len: int, rngs: nnx.Rngs):
        """``config.num_layers``: the decoder's own depth (Seq2Seq passes num_decoder_layers)."""
        d_model = config.d_model
        self.max_len, self.tie_output = max_len, config.tie_output
        self.embedding = Embedding(vocab_size=vocab_size, d_model=d_model, max_len=max_len,
                                   positions=config.positions, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
        self.layers = nnx.List([DecoderBlock(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = nnx.LayerNorm(d_model, rngs=rngs)
        if not self.tie_output:
            self.logits = nnx.Linear(d_model, vocab_size, rngs=rngs)

    def __call__(self, decoder_inputs: jax.Array, decoder_mask: jax.Array | None,
                 encoded: jax.Array, encoder_mask: jax.Array, *,
                 deterministic: bool = True) -> jax.Array:
        y = self.embedding(decoder_inputs)
        if decoder_mask is not None:
            check_mask("decoder_mask", decoder_mask, decoder_inputs.shape)
        if encoded.shape[0] != decoder_inputs.shape[0]:
            raise ValueError(f"decoder batch {decoder_inputs.shape[0]} != encoder batch "
                             f"{encoded.shape[0]}")
        y = self.dropout(y, deterministic=deterministic)
        self_mask = causal_mask(decoder_mask, decoder_inputs.shape[1])
        cross_mask = encoder_mask[:, None, None, :]
        for layer in self.layers:
            y = layer(y, encoded, self_mask, cross_mask, deterministic=deterministic)
        return self._logits(y)

    def _logits(self, y: jax.Array) -> jax.Array:
        y = self.final_norm(y)
        return self.embedding.attend(y) if self.tie_output else self.logits(y)

    # -- incremental decoding (evaluation mode), as flax's wmt decoder keeps its cache ---------
    def cross_keys_values(self, encoded: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
        """Each layer's cross-attention keys and values of ``encoded`` [B, S, D]: fixed while
        decoding, so computed once."""
        return [layer.cross_attention.keys_values(encoded) for layer in self.layers]

    def init_cache(self, batch: int, length: int, dtype=jnp.float32) -> list:
        """An empty self-attention cache of ``length`` positions: (k, v) [B, L, heads, d_h] per
        layer."""
        heads = self.layers[0].self_attention.num_heads
        d_model = self.final_norm.scale.shape[0]
        empty = jnp.zeros((batch, length, heads, d_model // heads), dtype)
        return [(empty, empty) for _ in self.layers]

    def step(self, tokens: jax.Array, t: jax.Array, cache: list, cross: list,
             encoder_mask: jax.Array) -> tuple[jax.Array, list]:
        """tokens [B] at position t -> (logits [B, vocab], the cache with position t added):
        ``__call__``'s position t under its causal mask, without recomputing positions < t."""
        y = self.embedding(tokens[:, None], start=t)
        cross_mask = encoder_mask[:, None, None, :]
        new = []
        for layer, kv, cross_kv in zip(self.layers, cache, cross):
            y, kv = layer.step(y, t, kv, cross_kv, cross_mask)
            new.append(kv)
        return self._logits(y)[:, 0], new
