"""The benchmarks TFDS has: GLUE, WMT'14, IMDB (LRA text), CIFAR-10 (LRA image), ImageNet.

Read through ``tfds.data_source`` (random access, no TensorFlow needed) from
data prepared in the ``array_record`` format; nothing is ever downloaded. A set
prepared as TFRecord is read through ``tfds.load`` when TensorFlow is installed.
Examples are encoded lazily, one batch at a time, so WMT never sits in memory; LRA text and
image and ImageNet, whose per-example decoding costs more than their model's step, are decoded
once into arrays kept under ``<data_dir>/arrays/`` (:mod:`flurka.data.cache`; ImageNet's as a
memory map, read a batch at a time).

Text is bytes unless a loader's ``vocab`` option says otherwise. GLUE and WMT'14 also take
``vocab="sentencepiece"`` (subwords, trained once on the family's training text and cached,
:mod:`flurka.data.subword`) or a ``.model`` file's path, with ``vocab_size`` / ``vocab_model_type``
for the trained one. As in t5x, where a task's gin config declares its vocabulary, the paper-scale
configs (``flurka.configs.nmt``, ``glue``) declare ``vocab="sentencepiece"``; the loaders default to
bytes, which needs no training text (LRA's convention, kept for lra-text). ``max_len`` counts
tokens of the chosen vocabulary: by default 256 bytes or 128 subwords for GLUE, 256 either way per
side for WMT'14.
"""

from __future__ import annotations

import functools
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
import tensorflow_datasets.text.glue  # noqa: F401  (registers GLUE; TFDS skips it without TensorFlow)
import tensorflow_datasets.translate.wmt14  # noqa: F401  (registers WMT'14, likewise)
from PIL import Image

from flurka.data.cache import cached_arrays, cached_memmaps, file_identity
from flurka.data.core import (
    ArrayExamples,
    DataNotFoundError,
    Dataset,
    DatasetInfo,
    EncodedExamples,
    PackedExamples,
    encode_translation,
    pack_sequences,
    pad_to,
    resolve_data_dir,
    unpack_sequences,
)
from flurka.data.subword import MAX_CHARS, sample_texts, text_tokenizer
from flurka.data.tokenizers import BYTES, PixelTokenizer

GLUE_MAX_LEN = 256  # bytes, [CLS] a [SEP] b [SEP]
GLUE_MAX_TOKENS = 128  # subwords, likewise (the config's 128-token pairs)
LRA_TEXT_MAX_LEN = 4000  # bytes incl. [CLS] (LRA / Skyformer)
WMT_MAX_LEN = 256  # bytes or subword tokens per side
IMAGENET_SIZE, IMAGENET_RESIZE = 224, 256
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
GRAYSCALE_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], np.float32)  # tf.image.rgb_to_grayscale

# task -> (text fields, num_classes (1 = regression), eval split)
GLUE = {
    "cola": (("sentence",), 2, "validation"),
    "sst2": (("sentence",), 2, "validation"),
    "mrpc": (("sentence1", "sentence2"), 2, "validation"),
    "stsb": (("sentence1", "sentence2"), 1, "validation"),
    "qqp": (("question1", "question2"), 2, "validation"),
    "mnli": (("premise", "hypothesis"), 3, "validation_matched"),
    "qnli": (("question", "sentence"), 2, "validation"),
    "rte": (("sentence1", "sentence2"), 2, "validation"),
}
# task -> further eval splits evaluated beside the eval split, name -> TFDS split; a run records the
# config's metrics on each under ``core.split_metric`` (MNLI's mismatched dev set: accuracy_mismatched)
GLUE_EXTRA_EVALS = {"mnli": {"mismatched": "validation_mismatched"}}


def how_to_prepare(name: str, root) -> str:
    manual = ""
    if name.startswith("imagenet2012"):
        manual = (
            f"put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar (from image-net.org) in "
            f"{root}/downloads/manual/, then "
        )
    return (
        f"TFDS data set {name!r} is not prepared under {root} (nothing is downloaded here). "
        f"On a machine with tensorflow{'' if manual else ' and internet access'}: {manual}"
        f"`tfds build {name} --data_dir={root} --file_format=array_record`, then copy "
        f"{root}/{name.split('/')[0]}/ here; or pass data_dir= / set FLURKA_DATA_DIR to where it is."
    )


def tfds_source(name: str, split: str, data_dir=None):
    """A random-access split of a prepared TFDS set; a clear error when it is missing."""
    root = resolve_data_dir(data_dir)
    try:
        return tfds.data_source(name, split=split, data_dir=str(root), download=False)
    except Exception as err:  # TFDS raises several types for "not there"
        builder = tfds.builder(name, data_dir=str(root))
        if not builder.is_prepared():
            raise DataNotFoundError(how_to_prepare(name, root)) from None
        try:
            import tensorflow  # noqa: F401  (optional, the tfds-data extra: asked only to say what to install)
        except ImportError:
            raise DataNotFoundError(
                f"{name!r} under {root} is prepared as {builder.info.file_format}, which needs tensorflow to read; "
                f"install tensorflow-cpu, or convert it once with `tfds convert_format "
                f"--dataset_version_dir={builder.data_dir} --out_file_format=array_record`"
            ) from err
        return list(tfds.as_numpy(builder.as_dataset(split=split)))


def _text(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _str(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def source_texts(source, fields: tuple[str, ...], max_chars: int = MAX_CHARS) -> list[str]:
    """A vocabulary's training text from a TFDS split: ``fields`` of its examples in a fixed
    shuffled order until ``max_chars`` characters (:func:`flurka.data.subword.sample_texts`; about
    40k WMT pairs, read one by one in seconds)."""
    return sample_texts(len(source), lambda idx: [_str(source[int(i)][f]) for i in idx for f in fields], max_chars)


def truncate_pair(a: np.ndarray, b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut the longer of two sequences first until both fit in ``budget`` tokens together."""
    n_a = min(len(a), max(budget - len(b), budget // 2))
    return a[:n_a], b[: budget - n_a]


def encode_glue(example, fields: tuple[str, ...], *, max_len: int, regression: bool,
                tokenizer=BYTES) -> dict[str, np.ndarray]:
    """[CLS] a [SEP] (b [SEP]) as bytes (or ``tokenizer``'s ids); segments 0 for the first part, 1
    for the second."""
    tok = tokenizer
    parts = [tok.encode(_text(example[f])) for f in fields]
    if len(parts) == 1:
        seq = np.concatenate([[tok.cls_id], parts[0][: max_len - 2], [tok.sep_id]])
        segments = np.zeros(len(seq), np.int32)
    else:
        a, b = truncate_pair(parts[0], parts[1], max_len - 3)
        first = np.concatenate([[tok.cls_id], a, [tok.sep_id]])
        seq = np.concatenate([first, b, [tok.sep_id]])
        segments = np.concatenate([np.zeros(len(first), np.int32), np.ones(len(b) + 1, np.int32)])
    inputs, mask = pad_to(seq, max_len, tok.pad_id)
    out = {
        "inputs": inputs,
        "mask": mask,
        "label": np.asarray(example["label"], np.float32 if regression else np.int32),
    }
    if len(parts) == 2:
        out["segments"] = pad_to(segments, max_len)[0]
    return out


def build_glue(
    *, task: str, seed: int = 0, data_dir=None, eval_split: str | None = None, max_len: int | None = None,
    vocab: str = "bytes", vocab_size: int | None = None, vocab_model_type: str = "unigram",
) -> Dataset:
    """glue-<task>: [CLS] a [SEP] b [SEP]; eval on the task's dev split, plus its
    ``GLUE_EXTRA_EVALS`` (MNLI: matched, and mismatched beside it). An ``eval_split`` other than the
    default evaluates that split alone.

    ``vocab="sentencepiece"`` is WikiText-103's vocabulary, the one MLM pre-training uses
    (:func:`flurka.data.local_sets.wikitext103_tokenizer`): fine-tuning a pre-trained run
    (``--init-from``) needs the ids it was pre-trained with, so GLUE's own text never trains one.
    It needs WikiText-103 under the data dir, or pass that vocabulary's ``.model`` path as ``vocab``."""
    from flurka.data.local_sets import wikitext103_tokenizer

    fields, num_classes, default_eval = GLUE[task]
    name = f"glue/{task}"
    train = tfds_source(name, "train", data_dir)
    eval = tfds_source(name, eval_split or default_eval, data_dir)
    extra = GLUE_EXTRA_EVALS.get(task, {}) if eval_split in (None, default_eval) else {}
    extra_sources = {split: tfds_source(name, tfds_split, data_dir) for split, tfds_split in extra.items()}
    tok = wikitext103_tokenizer(vocab, data_dir=data_dir, vocab_size=vocab_size, model_type=vocab_model_type,
                                user=f"glue-{task}")
    if max_len is None:
        max_len = GLUE_MAX_LEN if tok is BYTES else GLUE_MAX_TOKENS
    regression = num_classes == 1
    info = DatasetInfo(
        name=f"glue-{task}",
        task="regression" if regression else "classification",
        vocab_size=tok.vocab_size,
        max_len=max_len,
        num_classes=num_classes,
        pair="concat" if len(fields) == 2 else None,
        pad_id=tok.pad_id,
        mask_id=tok.mask_id,
        cls_id=tok.cls_id,
        sep_id=tok.sep_id,
    )

    def encode(ex):
        return encode_glue(ex, fields, max_len=max_len, regression=regression, tokenizer=tok)

    return Dataset(info, EncodedExamples(train, encode), EncodedExamples(eval, encode), seed=seed, decode=tok.decode,
                   extra_evals={split: EncodedExamples(source, encode) for split, source in extra_sources.items()})


def lra_text_ids(example, *, max_len: int) -> np.ndarray:
    """LRA text's sequence before padding: [CLS] + the review's bytes."""
    return np.concatenate([[BYTES.cls_id], BYTES.encode(_text(example["text"]), max_bytes=max_len - 1)])


def encode_lra_text(example, *, max_len: int) -> dict[str, np.ndarray]:
    """LRA text: [CLS] + the review's bytes."""
    inputs, mask = pad_to(lra_text_ids(example, max_len=max_len), max_len, BYTES.pad_id)
    return {"inputs": inputs, "mask": mask, "label": np.asarray(example["label"], np.int32)}


def source_fingerprint(source) -> dict | None:
    """What identifies a TFDS split's examples without reading them (the key of its cached arrays):
    the data set's name and version, the split, its size, and its files' names, sizes and mtimes
    (``files`` None where TFDS names none: ``tfds.testing.mock_data``). None for a source with no
    ``dataset_info`` (examples already in memory: ``tfds.load``'s), which is not cached on disk."""
    info = getattr(source, "dataset_info", None)
    if info is None:
        return None
    try:
        files = []
        for instruction in info.splits[str(source.split)].file_instructions:
            path = Path(instruction.filename)
            if not path.is_absolute():
                path = Path(info.data_dir) / path
            stat = file_identity(path)[0][1:] if path.is_file() else None
            files.append([path.name, instruction.skip, instruction.take, stat])
    except Exception:  # noqa: BLE001  (TFDS raises several types for a split it cannot resolve)
        files = None
    return {"dataset": info.full_name, "split": str(source.split), "examples": len(source), "files": files}


def _cached_split(name: str, source, spec: dict, build, *, data_dir) -> dict[str, np.ndarray]:
    """A TFDS split's arrays, cached under its fingerprint (in memory for a source without one)."""
    fingerprint = source_fingerprint(source)
    return cached_arrays(f"{name}-{fingerprint['split'] if fingerprint else 'memory'}",
                         None if fingerprint is None else {**spec, "source": fingerprint}, build, data_dir=data_dir)


LRA_TEXT_CACHE = 1   # the cached arrays' encoding: bump when lra_text_ids changes


def _lra_text_arrays(source, max_len: int) -> dict[str, np.ndarray]:
    n = len(source)
    labels = np.zeros(n, np.int32)

    def seqs():
        for i in range(n):
            example = source[i]
            labels[i] = np.asarray(example["label"], np.int32)
            yield lra_text_ids(example, max_len=max_len)

    ids, lengths = pack_sequences(seqs(), n, max_len, BYTES.pad_id)
    return {"ids": ids, "length": lengths, "label": labels}


def _unpack_lra_text(batch, *, max_len: int):
    inputs, mask = unpack_sequences(batch["ids"], batch["length"], max_len, BYTES.pad_id)
    return {"inputs": inputs, "mask": mask, "label": batch["label"]}


def build_lra_text(*, seed: int = 0, data_dir=None, max_len: int = LRA_TEXT_MAX_LEN, cache: bool = True) -> Dataset:
    """lra-text: IMDB reviews, byte level; eval is the IMDB test split (LRA's).

    Each split is encoded once into byte-id rows kept under the data dir (:mod:`flurka.data.cache`),
    so a batch is a gather: encoded per batch, a core fed the small model's step about half of
    what it takes. The batches are those of :func:`encode_lra_text` per example, which
    ``cache=False`` uses on access (nothing written)."""
    train = tfds_source("imdb_reviews/plain_text", "train", data_dir)
    eval = tfds_source("imdb_reviews/plain_text", "test", data_dir)
    info = DatasetInfo(
        name="lra-text",
        task="classification",
        vocab_size=BYTES.vocab_size,
        max_len=max_len,
        num_classes=2,
        pad_id=BYTES.pad_id,
        cls_id=BYTES.cls_id,
    )
    if not cache:
        def encode(ex):
            return encode_lra_text(ex, max_len=max_len)

        return Dataset(info, EncodedExamples(train, encode), EncodedExamples(eval, encode), seed=seed,
                       decode=BYTES.decode)
    spec = {"loader": "lra-text", "version": LRA_TEXT_CACHE, "max_len": max_len}
    unpack = functools.partial(_unpack_lra_text, max_len=max_len)
    train, eval = (PackedExamples(_cached_split("imdb", s, spec, lambda s=s: _lra_text_arrays(s, max_len),
                                                data_dir=data_dir), unpack) for s in (train, eval))
    return Dataset(info, train, eval, seed=seed, decode=BYTES.decode)


def rgb_to_grayscale(image: np.ndarray) -> np.ndarray:
    """uint8 [..., 3] -> uint8 [...], as ``tf.image.rgb_to_grayscale`` (float32, then x*255.5 truncated)."""
    gray = (image.astype(np.float32) / 255.0) @ GRAYSCALE_WEIGHTS
    return np.clip(gray * np.float32(255.5), 0, 255).astype(np.uint8)


PIXELS = PixelTokenizer(levels=256)


def encode_lra_image(example) -> dict[str, np.ndarray]:
    tokens = PIXELS.encode(rgb_to_grayscale(np.asarray(example["image"])))
    return {"inputs": tokens, "mask": np.ones(tokens.shape, bool), "label": np.asarray(example["label"], np.int32)}


LRA_IMAGE_CACHE = 1   # the cached arrays' encoding: bump when rgb_to_grayscale changes


def _lra_image_arrays(source) -> dict[str, np.ndarray]:
    n = len(source)
    gray, labels = np.zeros((0, 32, 32), np.uint8), np.zeros(n, np.int32)
    for i in range(n):
        example = source[i]
        pixels = rgb_to_grayscale(np.asarray(example["image"]))
        if i == 0:
            gray = np.zeros((n, *pixels.shape), np.uint8)
        gray[i] = pixels
        labels[i] = np.asarray(example["label"], np.int32)
    return {"gray": gray, "label": labels}


def _unpack_lra_image(batch):
    tokens = PIXELS.encode(batch["gray"])
    return {"inputs": tokens, "mask": np.ones(tokens.shape, bool), "label": batch["label"]}


def build_lra_image(*, seed: int = 0, data_dir=None, eval_split: str = "test", cache: bool = True) -> Dataset:
    """lra-image: CIFAR-10 as 1024 grayscale pixel tokens; train = train[:90%] (LRA), eval test or train[90%:].

    Each split's PNGs are decoded once into grayscale uint8 arrays kept under the data dir
    (:mod:`flurka.data.cache`), so a batch is a gather: decoded per batch, a core fed the small
    model's step a fiftieth of what it takes. The batches are those of :func:`encode_lra_image`
    per example, which ``cache=False`` uses on access (nothing written)."""
    splits = {"test": "test", "validation": "train[90%:]"}
    if eval_split not in splits:
        raise ValueError(f"eval_split must be one of {sorted(splits)}, got {eval_split!r}")
    train = tfds_source("cifar10", "train[:90%]", data_dir)
    eval = tfds_source("cifar10", splits[eval_split], data_dir)
    info = DatasetInfo(
        name="lra-image", task="classification", vocab_size=PIXELS.vocab_size, max_len=32 * 32, num_classes=10
    )
    if not cache:
        return Dataset(info, EncodedExamples(train, encode_lra_image), EncodedExamples(eval, encode_lra_image),
                       seed=seed)
    spec = {"loader": "lra-image", "version": LRA_IMAGE_CACHE}
    train, eval = (PackedExamples(_cached_split("cifar10-gray", s, spec, lambda s=s: _lra_image_arrays(s),
                                                data_dir=data_dir), _unpack_lra_image) for s in (train, eval))
    return Dataset(info, train, eval, seed=seed)


def build_wmt14(
    *, target: str, seed: int = 0, data_dir=None, eval_split: str = "validation", max_len: int = WMT_MAX_LEN,
    vocab: str = "bytes", vocab_size: int | None = None, vocab_model_type: str = "unigram",
) -> Dataset:
    """nmt-wmt14-en{de,fr}: English -> target; validation = newstest2013, test = newstest2014.

    Bytes by default; ``vocab="sentencepiece"``: one vocabulary shared by source and target (T5's,
    Flax examples/wmt's), trained on both sides of the pair's training split (family
    ``wmt14-en{target}``), or a ``.model`` file's path. ``decode`` gives detokenized text, on which
    BLEU is scored with sacrebleu's own tokenization (``bleu_tokenize="13a"``)."""
    if eval_split not in ("validation", "test"):
        raise ValueError(f"eval_split must be 'validation' or 'test', got {eval_split!r}")
    name = f"wmt14_translate/{target}-en"
    train = tfds_source(name, "train", data_dir)
    eval = tfds_source(name, eval_split, data_dir)
    tok = text_tokenizer(vocab, family=f"wmt14-en{target}", corpus=lambda chars: source_texts(train, ("en", target), chars),
                         data_dir=data_dir, vocab_size=vocab_size, model_type=vocab_model_type)
    info = DatasetInfo(
        name=f"nmt-wmt14-en{target}",
        task="translation",
        vocab_size=tok.vocab_size,
        max_len=max_len,
        num_classes=0,
        target_vocab_size=tok.vocab_size,
        target_max_len=max_len,
        pad_id=tok.pad_id,
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
    )

    def encode(ex):
        return encode_translation(
            tok.encode(_text(ex["en"])),
            tok.encode(_text(ex[target])),
            max_len=max_len,
            target_max_len=max_len,
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
        )

    return Dataset(info, EncodedExamples(train, encode), EncodedExamples(eval, encode), seed=seed, decode=tok.decode)


def resize_and_center(image: np.ndarray, size: int) -> np.ndarray:
    """Resize the shorter side to ``size`` (bilinear), then crop the central ``size`` x ``size``."""
    image = np.asarray(image, np.uint8)
    h, w = image.shape[:2]
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    resized = np.asarray(Image.fromarray(image).resize((nw, nh), Image.BILINEAR))
    top, left = (nh - size) // 2, (nw - size) // 2
    return resized[top : top + size, left : left + size]


def _encode_imagenet(example) -> dict[str, np.ndarray]:
    return {
        "image": resize_and_center(example["image"], IMAGENET_RESIZE),
        "label": np.asarray(example["label"], np.int32),
    }


def _imagenet_train(batch, rng: np.random.Generator):
    """Random 224 crop of the 256 resize and a random horizontal flip, per example; uint8."""
    images = batch["image"]
    n, limit = len(images), IMAGENET_RESIZE - IMAGENET_SIZE + 1
    tops, lefts, flips = rng.integers(0, limit, n), rng.integers(0, limit, n), rng.random(n) < 0.5
    crops = np.empty((n, IMAGENET_SIZE, IMAGENET_SIZE, images.shape[-1]), images.dtype)
    for crop, img, t, x, flip in zip(crops, images, tops, lefts, flips):   # one copy each
        window = img[t : t + IMAGENET_SIZE, x : x + IMAGENET_SIZE]
        crop[...] = window[:, ::-1] if flip else window
    return {"image": crops, "label": batch["label"]}


def _imagenet_eval(batch, rng):
    del rng
    o = (IMAGENET_RESIZE - IMAGENET_SIZE) // 2
    return {"image": np.ascontiguousarray(batch["image"][:, o : o + IMAGENET_SIZE, o : o + IMAGENET_SIZE]),
            "label": batch["label"]}


IMAGENET_CACHE = 1   # the cached pixels' encoding: bump when resize_and_center changes
_FILL_BLOCK = 512    # examples decoded per round of the fill's threads


def _imagenet_pixels(name: str, source, data_dir, threads: int | None):
    """``source``'s 256x256 resizes decoded once into a uint8 memory map under the data dir
    (:func:`flurka.data.cache.cached_memmaps`; 197 kB an image, ~252 GB for ImageNet's train
    split), or None where they cannot be kept (no identity to key on, a read-only or too full
    data dir). The decoding runs on ``threads`` threads (default: every core): PIL's JPEG decoder
    and resize release the GIL."""
    fingerprint = source_fingerprint(source)
    if fingerprint is None:
        return None
    n = len(source)
    size = (IMAGENET_RESIZE, IMAGENET_RESIZE, 3)

    def fill(arrays):
        logging.getLogger(__name__).warning("decoding %s (%d images) once into uint8 arrays under %s",
                                            name, n, resolve_data_dir(data_dir) / "arrays")
        images, labels = arrays["image"], arrays["label"]
        with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
            for lo in range(0, n, _FILL_BLOCK):
                idx = range(lo, min(n, lo + _FILL_BLOCK))
                for i, example in zip(idx, pool.map(lambda i: _encode_imagenet(source[i]), idx)):
                    images[i], labels[i] = example["image"], example["label"]

    spec = {"loader": "imagenet", "version": IMAGENET_CACHE, "size": IMAGENET_RESIZE, "source": fingerprint}
    return cached_memmaps(f"{name}-{fingerprint['split']}", spec,
                          {"image": ((n, *size), "uint8"), "label": ((n,), "int32")}, fill, data_dir=data_dir)


def build_imagenet(*, seed: int = 0, data_dir=None, cache: bool = True, threads: int | None = None) -> Dataset:
    """imagenet: ImageNet-2012 from TFDS's manual dir; 224x224 uint8 crops (random crop and flip for
    training, the centre for eval) of each image's 256 resize; the model's input is their
    ImageNet mean/std normalisation, computed on the device (``DatasetInfo.pixel_mean``: a quarter
    of float32's bytes to build and move).

    Each split's resizes are decoded once into a uint8 memory map under the data dir (``cache``;
    ``threads`` decode it), so a training batch is a gather and a crop; ``cache=False``, or a data
    dir that cannot hold them, decodes the JPEGs of each batch (the same batches)."""
    train = tfds_source("imagenet2012", "train", data_dir)
    eval = tfds_source("imagenet2012", "validation", data_dir)
    info = DatasetInfo(
        name="imagenet",
        task="image",
        vocab_size=0,
        max_len=0,
        num_classes=1000,
        image_shape=(IMAGENET_SIZE, IMAGENET_SIZE, 3),
        pixel_mean=tuple(IMAGENET_MEAN.tolist()),
        pixel_std=tuple(IMAGENET_STD.tolist()),
    )

    def split(source, name):
        arrays = _imagenet_pixels(name, source, data_dir, threads) if cache else None
        return EncodedExamples(source, _encode_imagenet) if arrays is None else ArrayExamples(arrays)

    return Dataset(
        info,
        split(train, "imagenet"),
        split(eval, "imagenet"),
        seed=seed,
        transform=_imagenet_train,
        eval_transform=_imagenet_eval,
    )
