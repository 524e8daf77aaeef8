"""Masked language modelling over a byte stream (WikiText-103, the CPython sources)."""

from __future__ import annotations

import numpy as np
from flurka.data.core import ArrayExamples, Batch, Dataset, DatasetInfo
from flurka.data.tokenizers import BYTES

MASK_RATE = 0.15  # BERT: 15% of positions are predicted ...
MASK_TOKEN, RANDOM_TOKEN = 0.8, 0.1  # ... of which 80% -> [MASK], 10% -> random, 10% kept


def chunk_bytes(data: bytes, length: int) -> np.ndarray:
    """Consecutive ``length``-byte rows of a stream, uint8 [n, length]; the ragged tail is dropped."""
    n = len(data) // length
    return np.frombuffer(data, np.uint8, count=n * length).reshape(n, length)


def mask_tokens(
    ids: np.ndarray, mask: np.ndarray, rng: np.random.Generator, *, mask_id: int, low: int, high: int
) -> Batch:
    """BERT masking: pick 15% of real positions; 80/10/10 [MASK] / random id in [low, high) / kept."""
    chosen = (rng.random(ids.shape) < MASK_RATE) & mask
    action = rng.random(ids.shape)
    random_ids = rng.integers(low, high, ids.shape, dtype=np.int32)
    inputs = np.where(chosen & (action < MASK_TOKEN), mask_id, ids)
    inputs = np.where(chosen & (action >= MASK_TOKEN) & (action < MASK_TOKEN + RANDOM_TOKEN), random_ids, inputs)
    return {
        "inputs": inputs.astype(np.int32),
        "mask": mask,
        "targets": ids.astype(np.int32),
        "weights": chosen.astype(np.float32),
    }


def _mask_byte_rows(batch: Batch, rng: np.random.Generator) -> Batch:
    ids = BYTES.encode_bytes(batch["bytes"])
    return mask_tokens(
        ids, np.ones(ids.shape, bool), rng, mask_id=BYTES.mask_id, low=BYTES.offset, high=BYTES.vocab_size
    )


def mlm_info(name: str, tok, max_len: int) -> DatasetInfo:
    """What an MLM model needs of ``name``, whose ids come from the tokenizer ``tok`` (bytes or
    subword pieces): the vocabulary is also the set of classes; no [CLS] (no pooling)."""
    return DatasetInfo(
        name=name,
        task="mlm",
        vocab_size=tok.vocab_size,
        max_len=max_len,
        num_classes=tok.vocab_size,
        pad_id=tok.pad_id,
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
        mask_id=tok.mask_id,
        cls_id=None,
        sep_id=tok.sep_id,
    )


def byte_mlm_dataset(name: str, train: bytes, eval: bytes, *, max_len: int, seed: int) -> Dataset:
    """An MLM dataset whose examples are fixed-length byte windows of two text streams."""
    info = mlm_info(name, BYTES, max_len)
    return Dataset(
        info,
        ArrayExamples({"bytes": chunk_bytes(train, max_len)}),
        ArrayExamples({"bytes": chunk_bytes(eval, max_len)}),
        seed=seed,
        transform=_mask_byte_rows,
        decode=BYTES.decode,
    )
