"""Greedy and beam-search decoding, one position at a time (flax examples/wmt style).

Both decoders keep ``seqs [.., max_len + 1]`` with BOS at position 0 and the token chosen at step
t at position t + 1. Step t feeds the token at position t to ``step_logits`` with a cache of what
positions < t left (the decoder's keys and values), so a sentence costs one decoder pass in all
rather than one per position; shapes stay static and the loop is a ``lax.while_loop`` that jit
compiles once. Beam search reorders the cache with its beams.

Beam search scores a finished hypothesis by log p / ((5 + length) / 6) ** alpha (GNMT length
penalty, as wmt decode.py). Like fairseq/Hugging Face, a hypothesis ending in EOS is finalized only
if it ranks within the top ``beam_size`` candidates of its step, and a sentence stops once it holds
``beam_size`` finished hypotheses; with ``beam_size=1`` this is exactly greedy decoding. If a
sentence finishes nothing within ``max_len`` its best live hypothesis is returned.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

NEG_INF = -1.0e7  # finite: NEG_INF + log p never overflows, and is far below any real score

StepLogits = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]
"""(tokens [rows] int32 at position t, step t, cache) -> (logits [rows, vocab] at t, cache with
position t added); every leaf of the cache that changes has ``rows`` leading."""


def length_penalty_factor(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT brevity normalizer ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def initial_buffer(shape: tuple[int, ...], max_len: int, bos_id: int, pad_id: int) -> jax.Array:
    seqs = jnp.full(shape + (max_len + 1,), pad_id, dtype=jnp.int32)
    return seqs.at[..., 0].set(bos_id)


def greedy(step_logits: StepLogits, cache: Any, *, batch_size: int, max_len: int, bos_id: int,
           eos_id: int, pad_id: int = 0) -> jax.Array:
    """Argmax at each step until EOS (then pad). Returns int32 [batch, max_len]."""

    def cond(state):
        t, _, done, _ = state
        return (t < max_len) & ~jnp.all(done)

    def body(state):
        t, seqs, done, cache = state
        logits, cache = step_logits(seqs[:, t], t, cache)
        token = jnp.where(done, pad_id, jnp.argmax(logits, axis=-1).astype(jnp.int32))
        seqs = jax.lax.dynamic_update_slice_in_dim(seqs, token[:, None], t + 1, axis=1)
        return t + 1, seqs, done | (token == eos_id), cache

    state = (jnp.int32(0), initial_buffer((batch_size,), max_len, bos_id, pad_id),
             jnp.zeros((batch_size,), bool), cache)
    _, seqs, _, _ = jax.lax.while_loop(cond, body, state)
    return seqs[:, 1:]


class BeamState(NamedTuple):
    step: jax.Array              # int32 scalar
    live_logprobs: jax.Array     # [B, K], sorted descending
    live_seqs: jax.Array         # [B, K, L + 1]
    finished_scores: jax.Array   # [B, K] (NEG_INF where empty)
    finished_seqs: jax.Array     # [B, K, L + 1]
    finished_flags: jax.Array    # [B, K] bool
    done: jax.Array              # [B] bool: holds K finished hypotheses; frozen from then on
    cache: Any                   # step_logits' cache, rows b * K + k


def gather_beams(x: jax.Array, index: jax.Array) -> jax.Array:
    """x [B, M, ...], index [B, K] -> [B, K, ...]."""
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def beam_search(step_logits: StepLogits, cache: Any, *, batch_size: int, beam_size: int, max_len: int,
                bos_id: int, eos_id: int, pad_id: int = 0,
                length_penalty: float = 0.6) -> tuple[jax.Array, jax.Array]:
    """Returns (best sequences int32 [B, max_len], their scores [B]).

    ``step_logits`` sees rows ordered batch-major: row b * beam_size + k is beam k of sentence b;
    ``cache`` holds those rows already (the sentence's encoding repeated per beam).
    """
    b, k, length = batch_size, beam_size, max_len

    def cond(s: BeamState):
        return (s.step < length) & ~jnp.all(s.done)

    def body(s: BeamState) -> BeamState:
        t = s.step
        logits, cache = step_logits(s.live_seqs[:, :, t].reshape(b * k), t, s.cache)
        logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(b, k, -1)
        vocab = logprobs.shape[-1]
        candidates = (s.live_logprobs[..., None] + logprobs).reshape(b, k * vocab)
        top_logprobs, top_index = jax.lax.top_k(candidates, 2 * k)
        top_seqs = gather_beams(s.live_seqs, top_index // vocab)
        tokens = (top_index % vocab).astype(jnp.int32)
        top_seqs = jax.lax.dynamic_update_slice_in_dim(top_seqs, tokens[..., None], t + 1, axis=2)
        is_eos = tokens == eos_id

        # Live: the best K candidates that did not just end.
        live_logprobs, live_index = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logprobs), k)
        live_seqs = gather_beams(top_seqs, live_index)
        parents = gather_beams(top_index // vocab, live_index)    # [B, K]: the beam each came from
        cache = jax.tree.map(lambda c: gather_beams(c.reshape((b, k) + c.shape[1:]), parents)
                             .reshape(c.shape), cache)

        # Finished: EOS candidates within the step's top K (not from dead filler beams).
        new_flags = is_eos & (jnp.arange(2 * k) < k)[None] & (top_logprobs > NEG_INF / 2)
        new_scores = jnp.where(
            new_flags, top_logprobs / length_penalty_factor(t + 1.0, length_penalty), NEG_INF)
        scores = jnp.concatenate([s.finished_scores, new_scores], axis=1)
        fin_scores, fin_index = jax.lax.top_k(scores, k)
        fin_seqs = gather_beams(jnp.concatenate([s.finished_seqs, top_seqs], axis=1), fin_index)
        fin_flags = gather_beams(jnp.concatenate([s.finished_flags, new_flags], axis=1), fin_index)

        keep = s.done
        def freeze(old, new):
            return jnp.where(keep.reshape((b,) + (1,) * (old.ndim - 1)), old, new)
        return BeamState(
            step=t + 1,
            live_logprobs=freeze(s.live_logprobs, live_logprobs),
            live_seqs=freeze(s.live_seqs, live_seqs),
            finished_scores=freeze(s.finished_scores, fin_scores),
            finished_seqs=freeze(s.finished_seqs, fin_seqs),
            finished_flags=freeze(s.finished_flags, fin_flags),
            done=s.done | (fin_flags.sum(axis=1) >= k),
            cache=cache)

    state = BeamState(
        step=jnp.int32(0),
        live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (b, 1)),
        live_seqs=initial_buffer((b, k), length, bos_id, pad_id),
        finished_scores=jnp.full((b, k), NEG_INF, jnp.float32),
        finished_seqs=initial_buffer((b, k), length, bos_id, pad_id),
        finished_flags=jnp.zeros((b, k), bool),
        done=jnp.zeros((b,), bool),
        cache=cache)
    s = jax.lax.while_loop(cond, body, state)

    any_finished = s.finished_flags.any(axis=1)
    best_finished = jnp.argmax(s.finished_scores, axis=1)
    seqs = jnp.where(any_finished[:, None],
                     jnp.take_along_axis(s.finished_seqs, best_finished[:, None, None], 1)[:, 0],
                     s.live_seqs[:, 0])
    live_score = s.live_logprobs[:, 0] / length_penalty_factor(float(length), length_penalty)
    scores = jnp.where(any_finished, s.finished_scores.max(axis=1), live_score)
    return seqs[:, 1:], scores
