"""lra-image-small: scikit-learn's 8x8 handwritten digits as pixel-token sequences.

The LRA image task in miniature: each image is read row by row as 64 tokens
(intensity 0..16 -> token 1..17), no 2-D structure given to the model. The
1,797 images ship with scikit-learn; 20% are held out by a fixed permutation.
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from flurka.data.core import ArrayExamples, Dataset, DatasetInfo, split_indices
from flurka.data.tokenizers import PixelTokenizer

TOKENIZER = PixelTokenizer(levels=17)
EVAL_FRACTION = 0.2


def load_digits_tokens() -> tuple[np.ndarray, np.ndarray]:
    """(int32 tokens [n, 64], int32 labels [n])."""
    digits = load_digits()
    return TOKENIZER.encode(digits.images.astype(np.int64)), digits.target.astype(np.int32)


def build(*, seed: int = 0, data_dir=None) -> Dataset:
    del data_dir  # ships with scikit-learn
    tokens, labels = load_digits_tokens()
    train, eval = split_indices(len(labels), EVAL_FRACTION, seed=0)
    info = DatasetInfo(
        name="lra-image-small",
        task="classification",
        vocab_size=TOKENIZER.vocab_size,
        max_len=tokens.shape[1],
        num_classes=10,
        pad_id=TOKENIZER.pad_id,
    )

    def split(idx):
        return ArrayExamples({"inputs": tokens[idx], "mask": np.ones(tokens[idx].shape, bool), "label": labels[idx]})

    return Dataset(info, split(train), split(eval), seed=seed)
