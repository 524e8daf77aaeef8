"""Encoder classifier for LRA and GLUE: one sequence, a segment-tagged pair, or two towers.

Pooling: ``"cls"`` reads the first position (the data puts [CLS] there), ``"mean"`` averages the
real tokens only. ``pair="two-tower"`` is LRA retrieval: both documents go through the SAME
encoder and the head sees [u, v, u*v, u-v] (LRA ``classifier_head_dual``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from flurka.models.checks import check_choice, check_mask, check_positive_int
from flurka.configs.model import ModelConfig
from flurka.models.embedding import Embedding
from flurka.models.encoder import Encoder, masked_mean

PAIRS = (None, "concat", "two-tower")


class ClassifierHead(nnx.Module):
    """in -> hidden (GELU) -> num_classes."""

    def __init__(self, in_features: int, hidden: int, num_classes: int, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(in_features, hidden, rngs=rngs)
        self.logits = nnx.Linear(hidden, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.logits(jax.nn.gelu(self.hidden(x)))


class EncoderClassifier(nnx.Module):
    """inputs [B, N], mask [B, N] -> logits [B, num_classes] (num_classes=1 for regression)."""

    def __init__(self, config: ModelConfig, *, vocab_size: int, num_classes: int, max_len: int,
                 pair: str | None = None, rngs: nnx.Rngs):
        check_choice("pair", pair, PAIRS)
        check_positive_int("num_classes", num_classes)
        self.pooling, self.pair, self.max_len = config.pooling or "cls", pair, max_len
        self.embedding = Embedding(vocab_size=vocab_size, d_model=config.d_model, max_len=max_len,
                                   num_segments=2 if pair == "concat" else 0,
                                   positions=config.positions, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
        self.encoder = Encoder(config, max_len=max_len, rngs=rngs)
        width = 4 * config.d_model if pair == "two-tower" else config.d_model
        self.head = ClassifierHead(width, config.d_model, num_classes, rngs=rngs)

    def encode(self, inputs: jax.Array, mask: jax.Array, *, segments: jax.Array | None = None,
               deterministic: bool = True, attention_rng: jax.Array | None = None) -> jax.Array:
        """One sequence -> pooled [B, d_model]."""
        x = self.embedding(inputs, segments)
        check_mask("mask", mask, inputs.shape)
        x = self.dropout(x, deterministic=deterministic)
        x = self.encoder(x, mask, deterministic=deterministic, attention_rng=attention_rng)
        return x[:, 0] if self.pooling == "cls" else masked_mean(x, mask)

    def __call__(self, inputs: jax.Array, mask: jax.Array, *, segments: jax.Array | None = None,
                 inputs2: jax.Array | None = None, mask2: jax.Array | None = None,
                 deterministic: bool = True, attention_rng: jax.Array | None = None) -> jax.Array:
        if self.pair == "two-tower":
            if inputs2 is None or mask2 is None:
                raise ValueError("pair='two-tower' needs inputs2 and mask2 (the second document)")
            if inputs2.shape[0] != inputs.shape[0]:
                raise ValueError(f"inputs2 batch {inputs2.shape[0]} != inputs batch {inputs.shape[0]}")
            r1, r2 = ((None, None) if attention_rng is None else jax.random.split(attention_rng))
            u = self.encode(inputs, mask, deterministic=deterministic, attention_rng=r1)
            v = self.encode(inputs2, mask2, deterministic=deterministic, attention_rng=r2)
            pooled = jnp.concatenate([u, v, u * v, u - v], axis=-1)
        else:
            if inputs2 is not None or mask2 is not None:
                raise ValueError(f"inputs2/mask2 given but pair={self.pair!r}; build with "
                                 f"pair='two-tower' for two-document tasks")
            if self.pair is None and segments is not None:
                raise ValueError("segments given but pair=None; build with pair='concat'")
            pooled = self.encode(inputs, mask, segments=segments, deterministic=deterministic,
                                 attention_rng=attention_rng)
        return self.head(pooled)
