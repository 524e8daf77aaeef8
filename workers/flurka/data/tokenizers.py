"""Every tokenizer the benchmarks use, in one place.

Id 0 is padding everywhere. Text is byte-level by default (LRA's choice for text and
retrieval, and every loader's default), ListOps has its own word vocab, pixel values are
tokens ``value + 1``, and nmt-small uses characters. The paper-scale text sets (WMT'14, GLUE,
WikiText-103 MLM) run on SentencePiece subwords when their config says so
(``vocab="sentencepiece"``, :mod:`flurka.data.subword`): WMT'14 on a vocabulary of its own
training split, MLM pre-training and GLUE fine-tuning on one shared WikiText-103 vocabulary, so
that a model pre-trained with MLM fine-tunes on GLUE with the same ids (``--init-from``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from flurka.data.core import DataNotFoundError


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
        tokens = pixels.reshape(pixels.shape[:-2] + (-1,)).astype(np.int32)
        tokens += 1   # in place: a second, temporary array made a batch several times slower
        return tokens


class SentencePieceTokenizer:
    """A SentencePiece model (a ``.model`` file: one of :mod:`flurka.data.subword`'s, or a given
    one such as T5's) with this platform's ids, the interface of :class:`ByteTokenizer`.

    Id 0 must be the model's padding (``--pad_id=0``; T5's vocabularies and ours have it). BOS,
    EOS and the [MASK] / [CLS] / [SEP] control pieces are the model's own where it has them
    (ours: pad 0, bos 1, eos 2, unk 3, [MASK] 4, [CLS] 5, [SEP] 6); those it lacks get extra ids
    after its pieces, as SeqIO's ``extra_ids`` (T5's model: bos, [MASK], [CLS], [SEP] become
    32000..32003). ``vocab_size`` counts both. A missing, empty or corrupt file, or one that
    does not pad with 0, is a one-line error naming it, never sentencepiece's C++ message.
    """

    pad_id = 0

    def __init__(self, proto: bytes, *, source: str = "<in memory>"):
        import sentencepiece as spm

        self.proto, self.source = bytes(proto), str(source)
        if not self.proto:
            raise ValueError(f"{self.source} is not a SentencePiece model (it is empty)")
        try:
            sp = spm.SentencePieceProcessor(model_proto=self.proto)
        except Exception as err:   # RuntimeError from C++ for bytes that are not a model
            raise ValueError(f"{self.source} is not a SentencePiece model ({_spm_message(err) or 'unreadable'})") from None
        if not sp.serialized_model_proto():   # loaded nothing: asking it anything logs from C++
            raise ValueError(f"{self.source} is not a SentencePiece model (it holds no model)")
        n = sp.get_piece_size()
        if sp.pad_id() != 0:
            raise ValueError(f"{self.source} pads with id {sp.pad_id()}; this platform pads with 0: train it "
                             "with --pad_id=0 (as T5's vocabularies are)")
        self._sp, self.piece_size, self.unk_id = sp, n, sp.unk_id()
        extra = iter(range(n, n + 5))
        self.bos_id = sp.bos_id() if sp.bos_id() >= 0 else next(extra)
        self.eos_id = sp.eos_id() if sp.eos_id() >= 0 else next(extra)
        self.mask_id, self.cls_id, self.sep_id = (self._control(p) or next(extra) for p in ("[MASK]", "[CLS]", "[SEP]"))
        self.vocab_size = next(extra)
        # MLM's random replacements: the model's ordinary pieces (after its leading control/unknown ones)
        self.first_piece_id = next((i for i in range(n) if not (sp.is_control(i) or sp.is_unknown(i))), n)
        if self.first_piece_id >= n:
            raise ValueError(f"{self.source} has no ordinary pieces, only control symbols")

    @classmethod
    def load(cls, path: str | Path) -> SentencePieceTokenizer:
        """The model in file ``path``: ``DataNotFoundError`` when it is not there, ``ValueError`` when
        it is not a SentencePiece model."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise DataNotFoundError(f"no SentencePiece model file at {path}")
        return cls(path.read_bytes(), source=str(path))

    def _control(self, piece: str) -> int | None:
        i = self._sp.piece_to_id(piece)
        return i if self._sp.id_to_piece(i) == piece and self._sp.is_control(i) else None

    @functools.cached_property
    def digest(self) -> str:
        """The model's identity: sha256 of its serialized proto, 16 hex digits."""
        return hashlib.sha256(self.proto).hexdigest()[:16]

    def encode(self, text: str | bytes, max_tokens: int | None = None) -> np.ndarray:
        """Text -> int32 piece ids (no BOS/EOS), at most ``max_tokens``."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return np.asarray(self._sp.encode(str(text))[:max_tokens], np.int32)

    def encode_many(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Many texts at once (sentencepiece's own threads)."""
        return self._sp.encode(list(texts), num_threads=num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> detokenized text; stops at EOS, drops padding, control and extra ids."""
        ids = _until_eos(ids, self.eos_id)
        return self._sp.decode([i for i in ids if 0 < i < self.piece_size])

    def __reduce__(self):
        return type(self), (self.proto,), {"source": self.source}

    def __setstate__(self, state):
        self.source = state["source"]

    def __eq__(self, other) -> bool:
        return isinstance(other, SentencePieceTokenizer) and other.proto == self.proto

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({self.source!r}, vocab_size={self.vocab_size})"


def _spm_message(err: BaseException) -> str:
    """sentencepiece's error text without its C++ location prefix (``INTERNAL: src/x.cc(12) [cond] ``)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return re.sub(r"^[A-Z_]+: (\S+\(\d+\) \[.*?\] ?)?", "", text).strip()


def _until_eos(ids: Iterable[int], eos_id: int) -> Sequence[int]:
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if i == eos_id:
            break
        out.append(i)
    return out


BYTES = ByteTokenizer()
