"""BERT-style masked-LM encoder (WikiText-103 pre-training).

The data pipeline does the 15% masking (80/10/10); the model returns logits at every position
and the loss weights the chosen ones. Head as BERT: dense -> GELU -> LayerNorm -> vocab
projection, tied to the token table by default (or a separate Linear).
"""

from __future__ import annotations

import jax
from flax import nnx

from flurka.models.checks import check_mask
from flurka.configs.model import ModelConfig
from flurka.models.embedding import Embedding
from flurka.models.encoder import Encoder


class MLMEncoder(nnx.Module):
    """inputs [B, N], mask [B, N] -> logits [B, N, vocab_size]."""

    def __init__(self, config: ModelConfig, *, vocab_size: int, max_len: int, rngs: nnx.Rngs):
        d_model = config.d_model
        self.tie_embeddings = config.tie_embeddings
        self.embedding = Embedding(vocab_size=vocab_size, d_model=d_model, max_len=max_len,
                                   positions=config.positions, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
        self.encoder = Encoder(config, max_len=max_len, rngs=rngs)
        self.transform = nnx.Linear(d_model, d_model, rngs=rngs)
        self.transform_norm = nnx.LayerNorm(d_model, rngs=rngs)
        if self.tie_embeddings:
            self.output_bias = nnx.Param(nnx.initializers.zeros_init()(rngs.params(), (vocab_size,)))
        else:
            self.output = nnx.Linear(d_model, vocab_size, rngs=rngs)

    def __call__(self, inputs: jax.Array, mask: jax.Array, *, deterministic: bool = True,
                 attention_rng: jax.Array | None = None) -> jax.Array:
        x = self.embedding(inputs)
        check_mask("mask", mask, inputs.shape)
        x = self.dropout(x, deterministic=deterministic)
        x = self.encoder(x, mask, deterministic=deterministic, attention_rng=attention_rng)
        x = self.transform_norm(jax.nn.gelu(self.transform(x)))
        if self.tie_embeddings:
            return self.embedding.attend(x) + self.output_bias[...]
        return self.output(x)
