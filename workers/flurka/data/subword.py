"""Subword vocabularies: SentencePiece models trained once per benchmark family, cached on disk.

What t5x / SeqIO and Flax's ``examples/wmt`` do, offline. A family's vocabulary is trained on
a sample of its training split — Flax's recipe: at most ``max_chars`` = 10^7 characters, here
drawn in a fixed shuffled order (seed 0) so the sample spreads over the whole split — with
``vocab_size`` pieces (32,000, t5x's default: Table 6's 220M (NMT, T5-base) and 60.5M (quality
ablations) parameters are those of a shared 32k vocabulary; its 108M for the MLM/NLU encoder is
within 2 % of it) and ``model_type`` "unigram" (SentencePiece's and T5's). Families:
``wmt14-ende`` (nmt-wmt14-ende and nmt-ablation-ende), ``wmt14-enfr``, and ``wikitext103``
(mlm-wikitext103 and every glue-* task: one vocabulary, so fine-tuning starts from the
pre-trained embedding; see :mod:`flurka.data.tokenizers`).

The model is cached as ``<data_dir>/vocabularies/<family>-<model_type>-<vocab_size>-<key>.model``
(and a ``.json`` beside it saying what it was trained on), where ``key`` is a sha256 over the
exact training text, every trainer option and the sentencepiece version: changing the data, the
sample, the size, the type or the library trains a new one; nothing else does. Files are written
to a temporary name and renamed (``os.replace``), one process trains while others wait (a lock
file), and a cached file that does not load as the model asked for is trained again, never used.
A data dir that cannot be written trains in memory (a warning says so).

Trainer options: pad 0 / bos 1 / eos 2 / unk 3 and the control pieces [MASK] [CLS] [SEP];
``normalization_rule_name="identity"`` and ``character_coverage=1.0`` (every character of the
sample is a piece: a decoded reference is the raw one, whitespace runs aside, so BLEU is scored
on the original text); ``byte_fallback`` (characters the sample never saw become byte pieces,
not <unk>) when the vocabulary has room for its 256 byte pieces (``vocab_size >= 1024``).

``vocab_size=None`` asks for the default, 32,000, or as many pieces as the training text supports
when it is too small for that (a tiny test corpus; a warning says so). An explicit ``vocab_size``
is exact or a one-line ``ValueError`` saying how many pieces the text supports.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from flurka.data.cache import file_lock as _lock
from flurka.data.cache import write_atomic
from flurka.data.core import resolve_data_dir
from flurka.data.tokenizers import BYTES, ByteTokenizer, SentencePieceTokenizer, _spm_message

DEFAULT_VOCAB_SIZE = 32_000
MODEL_TYPES = ("unigram", "bpe")
MAX_CHARS = 10**7                 # Flax examples/wmt's max_corpus_chars
CACHE_DIR = "vocabularies"
VOCABS = ("bytes", "sentencepiece")   # a loader's ``vocab``: one of these, or a .model file's path
SPECIALS = dict(pad_id=0, bos_id=1, eos_id=2, unk_id=3, control_symbols=["[MASK]", "[CLS]", "[SEP]"])
BYTE_FALLBACK_MIN = 1024


def trainer_options(vocab_size: int, model_type: str) -> dict:
    """The sentencepiece trainer options that decide the model (all of them go into its key)."""
    return dict(vocab_size=int(vocab_size), model_type=model_type, **SPECIALS,
                normalization_rule_name="identity", character_coverage=1.0,
                byte_fallback=vocab_size >= BYTE_FALLBACK_MIN, max_sentence_length=1 << 16,
                input_sentence_size=0)


def check_options(vocab_size: int | None, model_type: str) -> None:
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1):
        raise ValueError(f"vocab_size must be a positive int (or None for {DEFAULT_VOCAB_SIZE}), got {vocab_size!r}")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown vocab_model_type {model_type!r}; valid: {', '.join(MODEL_TYPES)}")


def sample_texts(n: int, read: Callable[[np.ndarray], Iterable[str]], max_chars: int = MAX_CHARS,
                 chunk: int = 1024) -> list[str]:
    """Texts of a random-access split of ``n`` examples, read in a fixed shuffled order (seed 0)
    ``chunk`` indices at a time by ``read`` (each index may give several texts: both sides of a
    pair), stripped, empty ones dropped, until ``max_chars`` characters are collected."""
    order = np.random.default_rng(0).permutation(n)
    texts, total = [], 0
    for start in range(0, n, chunk):
        for text in read(order[start : start + chunk]):
            text = text.strip()
            if text:
                texts.append(text)
                total += len(text)
                if total >= max_chars:
                    return texts
    return texts


def corpus_key(texts: Sequence[str], options: dict) -> str:
    """sha256 over the sentencepiece version, the trainer options and the exact training text."""
    import sentencepiece as spm

    h = hashlib.sha256(json.dumps({"sentencepiece": spm.__version__, **options}, sort_keys=True).encode())
    for text in texts:
        data = text.encode("utf-8", errors="surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:16]


def vocab_path(family: str, texts: Sequence[str], *, data_dir=None, vocab_size: int | None = None,
               model_type: str = "unigram") -> Path:
    """Where ``family``'s vocabulary of these texts and options is cached."""
    size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    key = corpus_key(texts, trainer_options(size, model_type))
    return resolve_data_dir(data_dir) / CACHE_DIR / f"{family}-{model_type}-{size}-{key}.model"


def sentencepiece_vocab(family: str, texts: Sequence[str], *, data_dir=None, vocab_size: int | None = None,
                        model_type: str = "unigram") -> SentencePieceTokenizer:
    """``family``'s SentencePiece vocabulary trained on ``texts`` (see the module docstring): the
    cached model when one with the same key loads, else trained now and cached."""
    check_options(vocab_size, model_type)
    if not texts:
        raise ValueError(f"the {family} vocabulary has no training text")
    size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    options = trainer_options(size, model_type)
    path = vocab_path(family, texts, data_dir=data_dir, vocab_size=vocab_size, model_type=model_type)
    with _lock(path) as writable:
        if path.is_file():
            try:
                tok = SentencePieceTokenizer.load(path)
            except (OSError, ValueError) as err:   # corrupt: never used, trained again
                warnings.warn(f"cached vocabulary {path} is not usable ({err}); training it again", stacklevel=2)
            else:   # the default's smaller model of a tiny text does not answer an exact request
                if tok.piece_size == size or (vocab_size is None and tok.piece_size < size):
                    return tok
        proto, note = _train(family, texts, options, exact=vocab_size is not None)
        tok = SentencePieceTokenizer(proto, source=str(path) if writable else f"<{family} in memory>")
        if writable:
            try:
                info = {"family": family, "texts": len(texts), "characters": sum(map(len, texts)),
                        "pieces": tok.piece_size, "options": options, "key": path.stem.rsplit("-", 1)[-1],
                        "sentencepiece": _spm_version(), **({"note": note} if note else {})}
                write_atomic(path.with_suffix(".json"), json.dumps(info, indent=1).encode())
                write_atomic(path, proto)
            except OSError as err:
                warnings.warn(f"could not cache the {family} vocabulary at {path} ({err}); it is kept in memory",
                              stacklevel=2)
    return tok


def _spm_version() -> str:
    import sentencepiece as spm

    return spm.__version__


def _train(family: str, texts: Sequence[str], options: dict, *, exact: bool) -> tuple[bytes, str]:
    """Train a model on ``texts``; (its serialized proto, a note when it came out smaller than asked)."""
    import sentencepiece as spm

    def run(**extra) -> bytes:
        out = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=out, minloglevel=2,
                                       num_threads=max(1, min(16, os.cpu_count() or 1)), **options, **extra)
        return out.getvalue()

    what = f"the {family} vocabulary ({len(texts)} texts, {sum(map(len, texts))} characters)"
    try:
        return run(), ""
    except (RuntimeError, ValueError) as err:
        message = _spm_message(err)
    most = re.search(r"value <= (\d+)", message)
    if most and not exact:
        note = (f"{what} supports at most {most.group(1)} pieces, fewer than the default "
                f"{options['vocab_size']}: trained with as many as it supports")
        warnings.warn(note, stacklevel=3)
        try:
            return run(hard_vocab_limit=False), note
        except (RuntimeError, ValueError) as err:
            message = _spm_message(err)
    if most:
        raise ValueError(f"vocab_size={options['vocab_size']} is too large for {what}: it supports at most "
                         f"{most.group(1)} pieces; pass a smaller vocab_size")
    smaller = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if smaller:
        raise ValueError(f"vocab_size={options['vocab_size']} is too small for {what}: it needs at least "
                         f"{smaller.group(2)} pieces (its characters and the special ids)")
    raise ValueError(f"training {what} failed: {message or 'sentencepiece gave no reason'}")


def encoded_stream(name: str, data: bytes, tokenizer: SentencePieceTokenizer, *, data_dir=None) -> np.ndarray:
    """``data``'s non-empty lines encoded and concatenated into one id stream (uint16 when the
    vocabulary fits, else int32), cached next to the vocabularies under a key of the text's and
    the model's digests (WikiText-103's 540 MB take minutes to encode)."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = resolve_data_dir(data_dir) / CACHE_DIR / f"{name}-{tokenizer.digest}-{digest}.npy"
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    if path.is_file():
        try:
            ids = np.load(path, allow_pickle=False)
            if ids.ndim == 1 and ids.dtype == dtype:
                return ids
        except (OSError, ValueError, EOFError):
            pass
        warnings.warn(f"cached token ids {path} are not usable; encoding again", stacklevel=2)
    lines = [line for line in data.decode("utf-8", errors="replace").split("\n") if line.strip()]
    threads = max(1, min(16, os.cpu_count() or 1))
    chunks = [np.fromiter(itertools.chain.from_iterable(tokenizer.encode_many(lines[i : i + 65536], threads)), dtype)
              for i in range(0, len(lines), 65536)]   # a chunk of lines at a time: Python lists of ids are big
    ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.save(buffer, ids, allow_pickle=False)
        write_atomic(path, buffer.getvalue())
    except OSError as err:
        warnings.warn(f"could not cache token ids at {path} ({err})", stacklevel=2)
    return ids


def text_tokenizer(vocab: str, *, family: str, corpus: Callable[[int], Sequence[str]], data_dir=None,
                   vocab_size: int | None = None, model_type: str = "unigram",
                   max_chars: int = MAX_CHARS) -> ByteTokenizer | SentencePieceTokenizer:
    """The tokenizer a text loader's ``vocab`` option names: ``"bytes"`` (:data:`BYTES`),
    ``"sentencepiece"`` (``family``'s vocabulary, trained on ``corpus(max_chars)`` or cached), or
    the path of a ``.model`` file (used as it is, e.g. the paper's T5 vocabulary)."""
    if not isinstance(vocab, (str, os.PathLike)):
        raise ValueError(f"vocab must be one of {', '.join(VOCABS)} or a .model file's path, got {vocab!r}")
    if vocab == "sentencepiece":
        return sentencepiece_vocab(family, corpus(max_chars), data_dir=data_dir, vocab_size=vocab_size,
                                   model_type=model_type)
    if vocab_size is not None or model_type != "unigram":
        raise ValueError(f"vocab_size and vocab_model_type are for vocab='sentencepiece' (training one); "
                         f"vocab={vocab!r} has its own")
    if vocab == "bytes":
        return BYTES
    return SentencePieceTokenizer.load(vocab)
