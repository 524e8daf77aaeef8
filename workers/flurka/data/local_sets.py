"""Benchmarks read from files you place under the data dir (no TFDS builder exists).

Layout under ``<data_dir>`` (argument, else ``$FLURKA_DATA_DIR``, else ``~/flurka_data``)::

    wikitext-103-raw/wiki.{train,valid,test}.raw          (or wikitext-103/wiki.*.tokens)
    lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv            (LRA retrieval)
    lra_release/pathfinder32/curv_contour_length_14/{metadata,imgs}/    (LRA pathfinder)

The LRA files are those of the LRA release archive ``lra_release.gz``
(google-research/long-range-arena); WikiText-103 is the Salesforce/Smerity zip.

WikiText-103 MLM is bytes unless ``vocab`` says otherwise: ``vocab="sentencepiece"`` (what its
config declares) is the ``wikitext103`` SentencePiece vocabulary, trained once on the train file
and cached under ``<data_dir>/vocabularies/`` (:mod:`flurka.data.subword`), which GLUE fine-tuning
reuses; the LRA sets stay bytes (LRA's definition). LRA retrieval and pathfinder are decoded once
into arrays kept under ``<data_dir>/arrays/`` (:mod:`flurka.data.cache`): their batches are gathers.
"""

from __future__ import annotations

import csv
import functools
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from flurka.data.cache import cached_arrays, file_identity
from flurka.data.core import (
    ArrayExamples,
    DataNotFoundError,
    Dataset,
    DatasetInfo,
    EncodedExamples,
    PackedExamples,
    pack_sequences,
    pad_to,
    resolve_data_dir,
    unpack_sequences,
)
from flurka.data.mlm import byte_mlm_dataset, mask_tokens, mlm_info
from flurka.data.subword import encoded_stream, sample_texts, text_tokenizer
from flurka.data.tokenizers import BYTES, PixelTokenizer, SentencePieceTokenizer

WIKITEXT_MAX_LEN = 512  # bytes or subword tokens
RETRIEVAL_MAX_LEN = 4000  # bytes per document incl. [CLS] (LRA / Skyformer)
PATHFINDER_DIRS = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")


def wikitext103_files(root: Path) -> dict[str, Path]:
    """split -> file, preferring the raw variant; a clear error naming both layouts when absent."""
    for folder, suffix in (("wikitext-103-raw", "raw"), ("wikitext-103", "tokens")):
        files = {s: root / folder / f"wiki.{s}.{suffix}" for s in ("train", "valid", "test")}
        if all(f.is_file() for f in files.values()):
            return files
    raise DataNotFoundError(
        f"WikiText-103 not found: expected {root}/wikitext-103-raw/wiki.{{train,valid,test}}.raw "
        f"or {root}/wikitext-103/wiki.{{train,valid,test}}.tokens. Unzip wikitext-103-raw-v1.zip (or "
        f"wikitext-103-v1.zip) into {root}, or pass data_dir= / set FLURKA_DATA_DIR."
    )


def wikitext103_tokenizer(vocab: str = "sentencepiece", *, data_dir=None, vocab_size: int | None = None,
                          model_type: str = "unigram", train: bytes | None = None, user: str = "mlm-wikitext103"):
    """The ``wikitext103`` vocabulary family: MLM pre-training's and GLUE fine-tuning's. ``vocab``
    as :func:`flurka.data.subword.text_tokenizer` takes it; a trained one learns from the train
    file's lines (``train``: its bytes, when already read). ``user`` names who asked, in the
    error when WikiText-103 is missing."""

    def corpus(max_chars: int) -> list[str]:
        data = train
        if data is None:
            try:
                data = wikitext103_files(resolve_data_dir(data_dir))["train"].read_bytes()
            except DataNotFoundError as err:
                raise DataNotFoundError(
                    f"{user} with vocab='sentencepiece' uses WikiText-103's vocabulary (MLM pre-training's, so "
                    f"a pre-trained model fine-tunes with its own ids), trained on its train file: {err} "
                    f"Or pass vocab=<that vocabulary's .model file> (under <data_dir>/vocabularies/), or "
                    f"vocab='bytes'.") from None
        lines = data.split(b"\n")
        return sample_texts(len(lines), lambda idx: [lines[i].decode("utf-8", errors="replace") for i in idx],
                            max_chars)

    return text_tokenizer(vocab, family="wikitext103", corpus=corpus, data_dir=data_dir, vocab_size=vocab_size,
                          model_type=model_type)


def build_wikitext103(
    *, seed: int = 0, data_dir=None, eval_split: str = "validation", max_len: int = WIKITEXT_MAX_LEN,
    vocab: str = "bytes", vocab_size: int | None = None, vocab_model_type: str = "unigram",
) -> Dataset:
    """mlm-wikitext103: MLM over fixed-length windows of the article stream, bytes by default;
    ``vocab="sentencepiece"`` (or a ``.model`` path): windows of ``max_len`` subword tokens of the
    stream of its non-empty lines, encoded once and cached beside the vocabulary."""
    _check_choice("eval_split", eval_split, ("validation", "test"))
    files = wikitext103_files(resolve_data_dir(data_dir))
    train = files["train"].read_bytes()
    split = "valid" if eval_split == "validation" else "test"
    eval = files[split].read_bytes()
    tok = wikitext103_tokenizer(vocab, data_dir=data_dir, vocab_size=vocab_size, model_type=vocab_model_type,
                                train=train)
    if tok is BYTES:
        return byte_mlm_dataset("mlm-wikitext103", train, eval, max_len=max_len, seed=seed)
    return token_mlm_dataset(
        "mlm-wikitext103",
        encoded_stream("wikitext103-train", train, tok, data_dir=data_dir),
        encoded_stream(f"wikitext103-{split}", eval, tok, data_dir=data_dir),
        tok, max_len=max_len, seed=seed,
    )


def token_mlm_dataset(name: str, train: np.ndarray, eval: np.ndarray, tok: SentencePieceTokenizer, *,
                      max_len: int, seed: int) -> Dataset:
    """An MLM dataset whose examples are consecutive ``max_len``-token windows of two id streams
    (the ragged tail dropped); BERT masking draws its random replacements from the model's
    ordinary pieces."""
    info = mlm_info(name, tok, max_len)

    def windows(ids: np.ndarray) -> ArrayExamples:
        n = len(ids) // max_len
        return ArrayExamples({"ids": ids[: n * max_len].reshape(n, max_len)})

    mask = functools.partial(_mask_token_rows, mask_id=tok.mask_id, low=tok.first_piece_id, high=tok.piece_size)
    return Dataset(info, windows(train), windows(eval), seed=seed, transform=mask, decode=tok.decode)


def _mask_token_rows(batch, rng, *, mask_id: int, low: int, high: int):
    ids = batch["ids"].astype(np.int32)
    return mask_tokens(ids, np.ones(ids.shape, bool), rng, mask_id=mask_id, low=low, high=high)


def read_aan_tsv(path: Path) -> list[tuple[int, bytes, bytes]]:
    """LRA AAN rows ``label id1 id2 text1 text2`` (tab separated, unquoted) -> (label, text1, text2)."""
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(int(float(r[0])), r[3].encode(), r[4].encode()) for r in rows if len(r) >= 5]


def retrieval_ids(text: bytes, *, max_len: int) -> np.ndarray:
    """One tower's sequence before padding: [CLS] + the document's bytes (LRA cuts a document at
    10k bytes, then max_len)."""
    return np.concatenate([[BYTES.cls_id], BYTES.encode(text[:10_000], max_bytes=max_len - 1)])


def encode_retrieval(example: tuple[int, bytes, bytes], *, max_len: int) -> dict[str, np.ndarray]:
    """Two towers, each [CLS] + document bytes."""
    label, a, b = example
    out = {"label": np.asarray(label, np.int32)}
    for suffix, text in (("", a), ("2", b)):
        ids = retrieval_ids(text, max_len=max_len)
        out[f"inputs{suffix}"], out[f"mask{suffix}"] = pad_to(ids, max_len, BYTES.pad_id)
    return out


RETRIEVAL_CACHE = 1   # the cached arrays' encoding: bump when retrieval_ids changes


def _retrieval_arrays(path: Path, max_len: int) -> dict[str, np.ndarray]:
    rows = read_aan_tsv(path)
    out = {"label": np.asarray([r[0] for r in rows], np.int32)}
    for suffix, column in (("", 1), ("2", 2)):
        ids = (retrieval_ids(r[column], max_len=max_len) for r in rows)
        out[f"ids{suffix}"], out[f"length{suffix}"] = pack_sequences(ids, len(rows), max_len, BYTES.pad_id)
    return out


def _unpack_retrieval(batch, *, max_len: int):
    out = {"label": batch["label"]}
    for suffix in ("", "2"):
        out[f"inputs{suffix}"], out[f"mask{suffix}"] = unpack_sequences(batch[f"ids{suffix}"], batch[f"length{suffix}"],
                                                                         max_len, BYTES.pad_id)
    return out


def build_lra_retrieval(
    *, seed: int = 0, data_dir=None, eval_split: str = "validation", max_len: int = RETRIEVAL_MAX_LEN,
    cache: bool = True,
) -> Dataset:
    """lra-retrieval: ACL Anthology citation matching on byte-level document pairs (two towers).

    Each TSV is read and encoded once into byte-id rows kept under the data dir
    (:mod:`flurka.data.cache`, keyed by the file's size and mtime), so a batch is a gather and a
    later build skips the TSV: encoded per batch, a core fed the small model's step half of what
    it takes. The batches are those of :func:`encode_retrieval` per example, which ``cache=False``
    uses on access."""
    _check_choice("eval_split", eval_split, ("validation", "test"))
    root = resolve_data_dir(data_dir) / "lra_release" / "tsv_data"
    files = {s: root / f"new_aan_pairs.{s}.tsv" for s in ("train", "eval", "test")}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise DataNotFoundError(
            f"LRA retrieval files missing: {', '.join(missing)}. Extract lra_release.gz (LRA release) so that "
            f"{root}/new_aan_pairs.{{train,eval,test}}.tsv exist, or pass data_dir= / set FLURKA_DATA_DIR."
        )
    info = DatasetInfo(
        name="lra-retrieval",
        task="classification",
        vocab_size=BYTES.vocab_size,
        max_len=max_len,
        num_classes=2,
        pair="two-tower",
        pad_id=BYTES.pad_id,
        cls_id=BYTES.cls_id,
    )
    paths = (files["train"], files["eval" if eval_split == "validation" else "test"])
    if cache:
        unpack = functools.partial(_unpack_retrieval, max_len=max_len)
        train, eval = (PackedExamples(cached_arrays(
            f"aan-{path.stem.rsplit('.', 1)[-1]}",
            {"loader": "lra-retrieval", "version": RETRIEVAL_CACHE, "max_len": max_len, "file": file_identity(path)},
            lambda path=path: _retrieval_arrays(path, max_len), data_dir=data_dir), unpack) for path in paths)
        return Dataset(info, train, eval, seed=seed, decode=BYTES.decode)
    train, eval = (read_aan_tsv(path) for path in paths)

    def encode(ex):
        return encode_retrieval(ex, max_len=max_len)

    return Dataset(
        info,
        EncodedExamples(train, encode),
        EncodedExamples(eval, encode),
        seed=seed,
        decode=BYTES.decode,
        labels=lambda split: np.asarray([r[0] for r in (train if split == "train" else eval)], np.int32),
    )


PIXELS = PixelTokenizer(levels=256)


def read_pathfinder(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """All (grayscale pixels uint8 [n, H*W], labels int32 [n]) in metadata order (0.npy, 1.npy, ...).

    Each metadata line is ``<img subdir> <file name> <unused> <label> ...``; empty
    or unreadable images are skipped, as LRA's pipeline filters empty ones.
    """
    meta = sorted((folder / "metadata").glob("*.npy"), key=lambda p: (len(p.stem), p.stem))
    images, labels = [], []
    for m in meta:
        for line in m.read_text().splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            try:
                with Image.open(folder / parts[0] / parts[1]) as img:
                    images.append(np.asarray(img.convert("L"), np.uint8).reshape(-1))
            except OSError:
                continue
            labels.append(int(parts[3]))
    return np.stack(images), np.asarray(labels, np.int32)


PATHFINDER_CACHE = 1   # the cached arrays' encoding: bump when read_pathfinder changes


def build_lra_pathfinder(
    *, seed: int = 0, data_dir=None, resolution: int = 32, difficulty: str = "hard", eval_split: str = "test",
    cache: bool = True,
) -> Dataset:
    """lra-pathfinder: are the two dots connected? Pixel sequences; splits 80/10/10 in file order (LRA).

    Reading ~200k PNGs takes minutes, so the decoded arrays are kept under the data dir
    (:mod:`flurka.data.cache`, keyed by the metadata files, which name every image and label);
    ``cache=False`` decodes them into memory, writing nothing.
    """
    _check_choice("difficulty", difficulty, PATHFINDER_DIRS)
    _check_choice("resolution", resolution, (32, 64, 128, 256))
    _check_choice("eval_split", eval_split, ("validation", "test"))
    folder = resolve_data_dir(data_dir) / "lra_release" / f"pathfinder{resolution}" / PATHFINDER_DIRS[difficulty]
    metadata = sorted((folder / "metadata").glob("*.npy")) if (folder / "metadata").is_dir() else []
    if not metadata:
        raise DataNotFoundError(
            f"LRA pathfinder not found: expected {folder}/metadata/*.npy and the images they name. Extract "
            f"lra_release.gz (LRA release) under {resolve_data_dir(data_dir)}, or pass data_dir= / set FLURKA_DATA_DIR."
        )

    def read():
        pixels, labels = read_pathfinder(folder)
        return {"pixels": pixels, "labels": labels}

    spec = {"loader": "lra-pathfinder", "version": PATHFINDER_CACHE, "resolution": resolution,
            "difficulty": difficulty, "metadata": file_identity(*metadata)}
    arrays = cached_arrays(f"pathfinder{resolution}-{difficulty}", spec, read, data_dir=data_dir, enabled=cache)
    pixels, labels = arrays["pixels"], arrays["labels"]
    n = len(labels)
    a, b = int(0.8 * n), int(0.9 * n)
    eval = slice(b, n) if eval_split == "test" else slice(a, b)
    info = DatasetInfo(
        name="lra-pathfinder",
        task="classification",
        vocab_size=PIXELS.vocab_size,
        max_len=pixels.shape[1],
        num_classes=2,
    )

    def split(s):  # uint8 in memory (200k x 1024), int32 tokens per batch
        return ArrayExamples({"pixels": pixels[s], "label": labels[s]})

    return Dataset(info, split(slice(0, a)), split(eval), seed=seed, transform=_pixel_tokens)


def _pixel_tokens(batch, rng):
    del rng
    tokens = batch["pixels"].astype(np.int32)
    tokens += 1  # PIXELS.encode on flat rows, in place (a temporary array costs several times more)
    return {"inputs": tokens, "mask": np.ones(tokens.shape, bool), "label": batch["label"]}
