"""Token + position (+ segment) embeddings, kept outside the encoder.

Positions are learned (BERT, LRA) or fixed sinusoidal (Vaswani et al.); the sinusoid is computed
on the fly from static shapes, so it holds no state. Segment embeddings serve GLUE-style pairs
packed into one sequence ("concat").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flurka.models.checks import check_choice, check_positive_int, check_tokens

POSITIONS = ("learned", "sinusoidal")
EMBED_INIT = nnx.initializers.normal(stddev=0.02)


def sinusoidal_positions(length: int, d_model: int) -> np.ndarray:
    """[length, d_model] float32 table: sin on even, cos on odd features (Vaswani et al. 2017)."""
    position = np.arange(length, dtype=np.float64)[:, None]
    div = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-math.log(10000.0) / d_model))
    table = np.zeros((length, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(position * div)
    table[:, 1::2] = np.cos(position * div)[:, : d_model // 2]
    return table.astype(np.float32)


class Embedding(nnx.Module):
    """ids [B, N] (+ segments [B, N]) -> [B, N, d_model]."""

    def __init__(self, *, vocab_size: int, d_model: int, max_len: int, num_segments: int = 0,
                 positions: str = "learned", rngs: nnx.Rngs):
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("d_model", d_model)
        check_positive_int("max_len", max_len)
        check_choice("positions", positions, POSITIONS)
        self.vocab_size, self.d_model, self.max_len = vocab_size, d_model, max_len
        self.num_segments = num_segments
        self.positions = positions
        self.token = nnx.Embed(vocab_size, d_model, embedding_init=EMBED_INIT, rngs=rngs)
        if positions == "learned":
            self.position = nnx.Param(EMBED_INIT(rngs.params(), (max_len, d_model)))
        self.segment = (nnx.Embed(num_segments, d_model, embedding_init=EMBED_INIT, rngs=rngs)
                        if num_segments else None)

    def __call__(self, ids: jax.Array, segments: jax.Array | None = None, *,
                 start: int | jax.Array = 0) -> jax.Array:
        """``start``: the position of ids' first column (incremental decoding feeds one at a
        time); positions start + n must fit max_len."""
        check_tokens("inputs", ids, self.max_len)
        n = ids.shape[1]
        x = _lookup(self.token, ids)
        if self.positions == "learned":
            table = self.position[...]
        else:
            table = jnp.asarray(sinusoidal_positions(self.max_len, self.d_model), x.dtype)
        x = x + (table[start:start + n] if isinstance(start, int)
                 else jax.lax.dynamic_slice_in_dim(table, start, n, axis=0))
        if self.segment is not None:
            if segments is None:
                raise ValueError("segments [batch, seq] are required for sequence pairs (pair='concat')")
            if getattr(segments, "shape", None) != ids.shape:
                raise ValueError(f"segments must have the shape of inputs {ids.shape}, "
                                 f"got {getattr(segments, 'shape', None)}")
            x = x + _lookup(self.segment, segments)
        return x

    def attend(self, x: jax.Array) -> jax.Array:
        """Logits against the token table (tied output projection), in the dtype of x and the
        table (nnx.Embed.attend would promote to the float32 it was built with)."""
        table = self.token.embedding[...]
        return jnp.dot(x, table.T.astype(jnp.promote_types(x.dtype, table.dtype)))


def _lookup(embed: nnx.Embed, ids: jax.Array) -> jax.Array:
    """Rows of ``embed``'s table in the table's own dtype — bf16 when the training step computes
    on bf16 copies of the parameters (nnx.Embed's call would cast them back to the float32 it was
    built with, and every product downstream would follow)."""
    return jnp.take(embed.embedding[...], ids, axis=0)
