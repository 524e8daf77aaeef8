"""Encoder–decoder translation model: the chosen mechanism in the encoder only (paper §A),
exact causal softmax attention in the decoder, greedy and beam decoding."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
from flax import nnx

from flurka.models import decode
from flurka.models.checks import check_mask, check_positive_int, check_tokens
from flurka.configs.model import ModelConfig
from flurka.models.decoder import Decoder
from flurka.models.embedding import Embedding
from flurka.models.encoder import Encoder


class Seq2Seq(nnx.Module):
    """(inputs [B, N], mask, decoder_inputs [B, M], decoder_mask) -> logits [B, M, target_vocab].

    ``decoder_inputs`` are the targets shifted right (``targets[:, :-1]``, starting with BOS).
    """

    def __init__(self, config: ModelConfig, *, vocab_size: int, target_vocab_size: int,
                 max_len: int, target_max_len: int, rngs: nnx.Rngs):
        check_positive_int("target_vocab_size", target_vocab_size)
        if target_vocab_size < 2:
            raise ValueError("target_vocab_size must be >= 2 (at least EOS and one token)")
        self.max_len, self.target_max_len = max_len, target_max_len
        self.target_vocab_size = target_vocab_size
        self.embedding = Embedding(vocab_size=vocab_size, d_model=config.d_model, max_len=max_len,
                                   positions=config.positions, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
        self.encoder = Encoder(config, max_len=max_len, rngs=rngs)
        self.decoder = Decoder(config.replace(num_layers=config.num_decoder_layers or config.num_layers),
                               vocab_size=target_vocab_size, max_len=target_max_len, rngs=rngs)

    def encode(self, inputs: jax.Array, mask: jax.Array, *, deterministic: bool = True,
               attention_rng: jax.Array | None = None) -> jax.Array:
        x = self.embedding(inputs)
        check_mask("mask", mask, inputs.shape)
        x = self.dropout(x, deterministic=deterministic)
        return self.encoder(x, mask, deterministic=deterministic, attention_rng=attention_rng)

    def __call__(self, inputs: jax.Array, mask: jax.Array, decoder_inputs: jax.Array,
                 decoder_mask: jax.Array | None = None, *, deterministic: bool = True,
                 attention_rng: jax.Array | None = None) -> jax.Array:
        encoded = self.encode(inputs, mask, deterministic=deterministic,
                              attention_rng=attention_rng)
        return self.decoder(decoder_inputs, decoder_mask, encoded, mask,
                            deterministic=deterministic)

    # -- decoding -------------------------------------------------------------------------------
    def _step_logits(self, inputs, mask, repeats: int, max_len: int):
        """Encode once; return (step_logits, its initial cache) for decode.greedy / beam_search,
        one row per sentence and beam."""
        encoded = self.encode(inputs, mask)
        encoded, enc_mask = (jnp.repeat(a, repeats, axis=0) for a in (encoded, mask))

        cross = self.decoder.cross_keys_values(encoded)

        def step_logits(tokens, t, cache):
            return self.decoder.step(tokens, t, cache, cross, enc_mask)
        return step_logits, self.decoder.init_cache(encoded.shape[0], max_len, encoded.dtype)

    def _check_decode(self, inputs, mask, max_len, ids) -> None:
        check_tokens("inputs", inputs, self.max_len)
        check_mask("mask", mask, inputs.shape)
        check_positive_int("max_len", max_len)
        if max_len > self.target_max_len:
            raise ValueError(f"decode max_len={max_len} > target_max_len={self.target_max_len}")
        for name, value in ids.items():
            if not isinstance(value, numbers.Integral) or not 0 <= value < self.target_vocab_size:
                raise ValueError(f"{name} must be an int in [0, {self.target_vocab_size}), "
                                 f"got {value!r}")

    def greedy_decode(self, inputs: jax.Array, mask: jax.Array, *, max_len: int, bos_id: int,
                      eos_id: int, pad_id: int = 0) -> jax.Array:
        """int32 [B, max_len]: argmax tokens after BOS, EOS included, pad after it."""
        self._check_decode(inputs, mask, max_len,
                           {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id})
        return decode.greedy(*self._step_logits(inputs, mask, 1, int(max_len)), batch_size=inputs.shape[0],
                             max_len=int(max_len), bos_id=int(bos_id), eos_id=int(eos_id),
                             pad_id=int(pad_id))

    def beam_search(self, inputs: jax.Array, mask: jax.Array, *, beam_size: int, max_len: int,
                    bos_id: int, eos_id: int, pad_id: int = 0, length_penalty: float = 0.6,
                    return_scores: bool = False):
        """int32 [B, max_len] best hypothesis (see flurka.models.decode for the rules);
        with ``return_scores`` also its length-normalized log-probability [B]."""
        self._check_decode(inputs, mask, max_len,
                           {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id})
        check_positive_int("beam_size", beam_size)
        if 2 * beam_size > beam_size * self.target_vocab_size:
            raise ValueError("beam search needs target_vocab_size >= 2")
        seqs, scores = decode.beam_search(
            *self._step_logits(inputs, mask, beam_size, int(max_len)), batch_size=inputs.shape[0],
            beam_size=int(beam_size), max_len=int(max_len), bos_id=int(bos_id),
            eos_id=int(eos_id), pad_id=int(pad_id), length_penalty=float(length_penalty))
        return (seqs, scores) if return_scores else seqs
