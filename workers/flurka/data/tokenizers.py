"""Every tokenizer the benchmarks use, in one place.

Id 0 is padding everywhere. Text is byte-level (LRA's choice for text and
retrieval; here also MLM, GLUE and WMT so that a model pre-trained with MLM
fine-tunes on GLUE with the same vocabulary), ListOps has its own word vocab,
pixel values are tokens ``value + 1``, and nmt-small uses characters.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes shifted past six special ids."""

    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    mask_id: int = 3
    cls_id: int = 4
    sep_id: int = 5
    offset: int = 6

    @property
    def vocab_size(self) -> int:
        return self.offset + 256

    def encode(self, text: str | bytes, max_bytes: int | None = None) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return self.encode_bytes(np.frombuffer(data[:max_bytes], np.uint8))

    def encode_bytes(self, data: np.ndarray) -> np.ndarray:
        return data.astype(np.int32) + self.offset

    def decode(self, ids: Iterable[int]) -> str:
        ids = _until_eos(ids, self.eos_id)
        data = bytes(int(i) - self.offset for i in ids if i >= self.offset)
        return data.decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class CharTokenizer:
    """Characters of a closed alphabet (nmt-small); shared by source, target and decode."""

    chars: str
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3
    offset: int = 4

    @classmethod
    def build(cls, texts: Iterable[str]) -> CharTokenizer:
        return cls("".join(sorted(set("".join(texts)))))

    @property
    def vocab_size(self) -> int:
        return self.offset + len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        table = self._table
        return np.asarray([table.get(c, self.unk_id) for c in text], np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        ids = _until_eos(ids, self.eos_id)
        return "".join(self.chars[i - self.offset] for i in ids if self.offset <= i < self.vocab_size)

    @functools.cached_property
    def _table(self) -> dict[str, int]:
        return {c: i + self.offset for i, c in enumerate(self.chars)}


@dataclasses.dataclass(frozen=True)
class WordTokenizer:
    """A fixed word vocabulary after a string preprocessing step (ListOps)."""

    words: tuple[str, ...]
    preprocess: Callable[[str], str] = str
    pad_id: int = 0
    cls_id: int = 1
    offset: int = 2

    @property
    def vocab_size(self) -> int:
        return self.offset + len(self.words)

    def encode(self, text: str) -> np.ndarray:
        table = self._table
        tokens = self.preprocess(text).split()
        try:
            return np.asarray([table[t] for t in tokens], np.int32)
        except KeyError:
            unknown = sorted(set(tokens) - set(table))
            raise ValueError(f"tokens {unknown} are not in the vocabulary {list(self.words)}") from None

    @functools.cached_property
    def _table(self) -> dict[str, int]:
        return {w: i + self.offset for i, w in enumerate(self.words)}

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.words[i - self.offset] for i in ids if self.offset <= i < self.vocab_size)


@dataclasses.dataclass(frozen=True)
class PixelTokenizer:
    """Integer intensities ``0..levels-1`` as tokens ``1..levels`` (0 stays padding)."""

    levels: int = 256
    pad_id: int = 0

    @property
    def vocab_size(self) -> int:
        return self.levels + 1

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """[..., H, W] intensities -> [..., H*W] token ids (row-major, LRA's pixel order)."""
        pixels = np.asarray(pixels)
        if pixels.min(initial=0) < 0 or pixels.max(initial=0) >= self.levels:
            raise ValueError(f"pixel values must lie in [0, {self.levels})")
        return pixels.reshape(pixels.shape[:-2] + (-1,)).astype(np.int32) + 1


def _until_eos(ids: Iterable[int], eos_id: int) -> Sequence[int]:
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if i == eos_id:
            break
        out.append(i)
    return out


BYTES = ByteTokenizer()
