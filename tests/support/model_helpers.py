"""Tiny model settings shared by the models tests (small dims keep CPU time low)."""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from flurka.models import ModelConfig

TINY = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout_rate=0.1)


def tiny_options(mechanism: str) -> dict:
    """Small d_k / feature counts / windows; d_k and num_features are ignored where unused."""
    options = {"d_k": 4, "num_features": 8}
    if "eva" in mechanism:
        options.update(window_size=4, chunk_size=4)
    return options


def tiny_kwargs(mechanism: str, **overrides) -> dict:
    """A model's ``config`` (:data:`TINY`, the mechanism and its tiny options; overrides that
    are ModelConfig fields) and ``rngs`` (or the overrides' other keys)."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    config = ModelConfig(**{**TINY, "attention": mechanism, "attention_options": tiny_options(mechanism),
                            **{k: v for k, v in overrides.items() if k in fields}})
    return {"config": config, "rngs": nnx.Rngs(params=0, dropout=1),
            **{k: v for k, v in overrides.items() if k not in fields}}


def padded_batch(rng: np.random.Generator, lengths, seq_len: int, vocab: int):
    """Right-padded int32 tokens (ids >= 1, pad 0) and the bool mask."""
    lengths = np.asarray(lengths)
    mask = np.arange(seq_len)[None, :] < lengths[:, None]
    tokens = rng.integers(1, vocab, size=(len(lengths), seq_len)).astype(np.int32)
    return np.where(mask, tokens, 0).astype(np.int32), mask


def repad(rng: np.random.Generator, tokens: np.ndarray, mask: np.ndarray, vocab: int) -> np.ndarray:
    """Same real tokens, different (non-zero, random) tokens in the padded positions."""
    other = rng.integers(1, vocab, size=tokens.shape).astype(np.int32)
    out = np.where(mask, tokens, other)
    assert (out[~mask] != tokens[~mask]).any()
    return out
