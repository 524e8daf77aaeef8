"""Dataset contract shared by every benchmark: info, example sources, batching.

Batch ``k`` of a training stream is a pure function of ``(seed, k)``: examples
are read through a per-epoch permutation drawn from
``default_rng((seed, 0, epoch))`` and any per-batch randomness (MLM masking,
crop/flip) from ``default_rng((seed, 1, step))``. Resuming at ``start_step=k``
therefore replays exactly what an uninterrupted run saw from step ``k`` on, and
building batches ahead on other threads (``train_batches(prefetch=n)``,
:mod:`flurka.data.prefetch`) changes none of them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from flurka.data.prefetch import Prefetcher

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch, np.random.Generator], Batch]

_PERMUTATION_STREAM = 0
_TRANSFORM_STREAM = 1
_EVAL_SEED = 0xE7A1  # eval masking/crops do not depend on the training seed


class DataNotFoundError(FileNotFoundError):
    """Data that cannot be downloaded here is missing; the message says what to put where."""


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """The data root: the argument, else ``$FLURKA_DATA_DIR``, else ``~/flurka_data``."""
    if data_dir is None:
        data_dir = os.environ.get("FLURKA_DATA_DIR") or "~/flurka_data"
    return Path(data_dir).expanduser()


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model and a training loop need to know about a benchmark."""

    name: str
    task: str  # "classification" | "regression" | "mlm" | "translation" | "image"
    vocab_size: int
    max_len: int
    num_classes: int
    pair: str | None = None  # None | "concat" | "two-tower"
    target_vocab_size: int = 0
    target_max_len: int = 0
    image_shape: tuple = ()
    # image: batches hold uint8 pixels, and the model's input is (pixels / 255 - mean) / std per
    # channel, computed on the device (flurka.training.tasks.ImageTask); empty: float images as given
    pixel_mean: tuple = ()
    pixel_std: tuple = ()
    pad_id: int = 0
    bos_id: int | None = None
    eos_id: int | None = None
    mask_id: int | None = None
    cls_id: int | None = None  # set when every sequence starts with [CLS]; else use mean pooling
    sep_id: int | None = None
    num_train: int = 0
    num_eval: int = 0


class Examples(Protocol):
    """A random-access split: ``get`` returns a batch dict for an index array."""

    def __len__(self) -> int: ...

    def get(self, indices: np.ndarray) -> Batch: ...


@dataclasses.dataclass(frozen=True)
class ArrayExamples:
    """A split held in memory as equally long numpy arrays (the common case)."""

    arrays: dict[str, np.ndarray]

    def __post_init__(self):
        lengths = {len(v) for v in self.arrays.values()}
        if len(lengths) != 1:
            raise ValueError(f"arrays of a split must share their first dimension, got {lengths}")

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def get(self, indices: np.ndarray) -> Batch:
        return {k: v[indices] for k, v in self.arrays.items()}


@dataclasses.dataclass(frozen=True)
class PackedExamples(ArrayExamples):
    """A split held as compact arrays (:mod:`flurka.data.cache`'s), a gathered batch of which
    ``unpack`` turns into the fields its encoder gives, so batches match the encoder's exactly."""

    unpack: Callable[[Batch], Batch]

    def get(self, indices: np.ndarray) -> Batch:
        return self.unpack(super().get(indices))


@dataclasses.dataclass(frozen=True)
class EncodedExamples:
    """A random-access source (e.g. ``tfds.data_source``) encoded example by example."""

    source: Sequence[Any]
    encode: Callable[[Any], dict[str, np.ndarray]]

    def __len__(self) -> int:
        return len(self.source)

    def get(self, indices: np.ndarray) -> Batch:
        return stack_examples([self.encode(self.source[int(i)]) for i in indices])


@functools.lru_cache(maxsize=4)
def _epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng((seed, _PERMUTATION_STREAM, epoch)).permutation(n)


def train_indices(seed: int, step: int, batch_size: int, n: int) -> np.ndarray:
    """Example indices of training batch ``step``: a continuous stream over reshuffled epochs."""
    pos = step * batch_size + np.arange(batch_size, dtype=np.int64)
    epochs, within = np.divmod(pos, n)
    out = np.empty(batch_size, dtype=np.int64)
    for e in np.unique(epochs):
        sel = epochs == e
        out[sel] = _epoch_permutation(seed, int(e), n)[within[sel]]
    return out


def step_rng(seed: int, step: int) -> np.random.Generator:
    """The per-batch generator for masking / augmentation of training batch ``step``."""
    return np.random.default_rng((seed, _TRANSFORM_STREAM, step))


def split_metric(metric: str, split: str) -> str:
    """The recorded name of ``metric`` measured on a data set's extra eval split ``split``: the one
    rule. MNLI's ``mismatched`` dev set: ``accuracy`` -> ``accuracy_mismatched`` (Table 2's MNLI-mm,
    declared in ``flurka.catalogue.metrics``)."""
    return f"{metric}_{split}"


class Dataset:
    """A benchmark: train stream, eval pass and decoding around two example sources.

    ``extra_evals``: further named eval splits a run also evaluates (MNLI: ``{"mismatched":
    validation_mismatched}``), each recording the config's metrics under :func:`split_metric`.
    """

    def __init__(
        self,
        info: DatasetInfo,
        train: Examples,
        eval: Examples,
        *,
        seed: int = 0,
        transform: Transform | None = None,
        eval_transform: Transform | None = None,
        decode: Callable[[np.ndarray], str] | None = None,
        labels: Callable[[str], np.ndarray] | None = None,
        extra_evals: Mapping[str, Examples] | None = None,
    ):
        if len(train) == 0 or len(eval) == 0:
            raise ValueError(f"{info.name}: empty split (train={len(train)}, eval={len(eval)})")
        extra_evals = dict(extra_evals or {})
        for split, examples in extra_evals.items():
            if not split.isidentifier() or len(examples) == 0:
                raise ValueError(f"{info.name}: extra eval split {split!r} needs an identifier name and examples "
                                 f"(has {len(examples)})")
        self.info = dataclasses.replace(info, num_train=len(train), num_eval=len(eval))
        self.seed = int(seed)
        self.train = train
        self.eval = eval
        self.extra_evals = extra_evals
        self._transform = transform
        self._eval_transform = eval_transform or transform
        self._decode = decode
        self._labels = labels

    def __repr__(self) -> str:
        return f"Dataset({self.info.name!r}, train={len(self.train)}, eval={len(self.eval)}, seed={self.seed})"

    def describe(self, examples: int = 16) -> dict[str, Any]:
        """What a run trained on, for a tracker's data-set input: the name, the splits' sizes, and
        a digest of the info and the first ``examples`` of each split (raw, before shuffling or
        masking, so every seed of a benchmark shares it and a change of the data changes it)."""
        h = hashlib.sha256(repr(dataclasses.astuple(self.info)).encode())
        for split in (self.train, self.eval, *self.extra_evals.values()):
            batch = split.get(np.arange(min(examples, len(split))))
            for key in sorted(batch):
                value = np.ascontiguousarray(batch[key])
                h.update(f"{key}:{value.dtype}:{value.shape}".encode())
                h.update(value.tobytes())
        return {"name": self.info.name, "digest": h.hexdigest()[:16], "task": self.info.task,
                "num_train": len(self.train), "num_eval": len(self.eval),
                **{f"num_eval_{split}": len(ex) for split, ex in self.extra_evals.items()}}

    def train_batch(self, step: int, batch_size: int) -> Batch:
        """Training batch number ``step`` (pure in ``(seed, step)``)."""
        idx = train_indices(self.seed, step, batch_size, len(self.train))
        batch = self.train.get(idx)
        if self._transform is not None:
            batch = self._transform(batch, step_rng(self.seed, step))
        return batch

    def train_batches(self, batch_size: int, start_step: int = 0, *, stop_step: int | None = None,
                      prefetch: int = 0, place: Callable[[Batch], Any] | None = None) -> Prefetcher:
        """Training batches ``start_step, start_step+1, ...`` (before ``stop_step`` if given).

        ``prefetch``: how many batches worker threads build ahead (:mod:`flurka.data.prefetch`);
        0 builds each on the caller's thread. The batches are the same either way. ``place`` (e.g.
        a device put) runs on each batch where it is built. Close the iterator (``with``) to join
        its threads before they run out."""
        _check_batch_size(batch_size)
        return Prefetcher(functools.partial(self.train_batch, batch_size=batch_size), start=start_step,
                          stop=stop_step, depth=prefetch, place=place)

    def eval_batches(self, batch_size: int, split: str | None = None) -> Iterator[Batch]:
        """One deterministic pass over the eval split (``split``: one of ``extra_evals``); padding
        examples get weight 0."""
        _check_batch_size(batch_size)
        if split is not None and split not in self.extra_evals:
            raise ValueError(f"{self.info.name} has no extra eval split {split!r}; it has {sorted(self.extra_evals)}")
        examples = self.eval if split is None else self.extra_evals[split]
        n = len(examples)
        for i, start in enumerate(range(0, n, batch_size)):
            real = min(batch_size, n - start)
            # pad with copies of a real example: weight 0, but never an all-masked row
            idx = np.concatenate([np.arange(start, start + real), np.full(batch_size - real, start)])
            batch = examples.get(idx)
            if self._eval_transform is not None:
                batch = self._eval_transform(batch, np.random.default_rng((_EVAL_SEED, i)))
            weight = np.zeros(batch_size, np.float32)
            weight[:real] = 1.0
            batch["example_weight"] = weight
            yield batch

    def decode(self, ids) -> str:
        """Token ids -> text (translation targets, MLM inputs); stops at EOS, drops specials."""
        if self._decode is None:
            raise NotImplementedError(f"{self.info.name} has no text decoding")
        return self._decode(np.asarray(ids))

    def labels(self, split: str = "eval") -> np.ndarray:
        """All labels of a split (classification / regression)."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if self._labels is not None:
            return self._labels(split)
        examples = self.train if split == "train" else self.eval
        if isinstance(examples, ArrayExamples) and "label" in examples.arrays:
            return examples.arrays["label"]
        return np.concatenate(
            [examples.get(np.arange(s, min(s + 1024, len(examples))))["label"] for s in range(0, len(examples), 1024)]
        )

    def class_distribution(self, split: str = "eval") -> np.ndarray:
        """Fraction of each class in a split, shape [num_classes]."""
        if self.info.task not in ("classification", "image"):
            raise ValueError(f"{self.info.name} is a {self.info.task} task; class distribution needs classification")
        counts = np.bincount(self.labels(split).astype(np.int64), minlength=self.info.num_classes)
        return counts / counts.sum()

    @property
    def majority_baseline(self) -> float:
        """Eval accuracy of always predicting the most frequent training class (the chance line)."""
        train_majority = int(np.argmax(self.class_distribution("train")))
        return float(self.class_distribution("eval")[train_majority])


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


def pad_to(ids: Sequence[int] | np.ndarray, length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Truncate or right-pad one sequence; returns (int32 ids [length], bool mask [length])."""
    ids = np.asarray(ids, dtype=np.int32)[:length]
    out = np.full(length, pad_id, np.int32)
    out[: len(ids)] = ids
    mask = np.zeros(length, bool)
    mask[: len(ids)] = True
    return out, mask


def pad_batch(seqs: Sequence[Sequence[int]], length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``pad_to`` over many sequences: int32 [n, length], bool [n, length]."""
    ids = np.full((len(seqs), length), pad_id, np.int32)
    mask = np.zeros((len(seqs), length), bool)
    for i, s in enumerate(seqs):
        s = np.asarray(s, dtype=np.int32)[:length]
        ids[i, : len(s)] = s
        mask[i, : len(s)] = True
    return ids, mask


def pack_sequences(seqs: Iterable[Sequence[int] | np.ndarray], n: int, length: int,
                   pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` id sequences cut at ``length``, as rows padded with ``pad_id`` in the smallest unsigned
    dtype that holds them (byte ids of UTF-8 text: uint8) and as wide as the longest, and their
    lengths (int32): what a cache keeps so that :func:`unpack_sequences` of gathered rows is
    :func:`pad_to` of each sequence."""
    rows = np.full((n, length), pad_id, np.min_scalar_type(pad_id))   # widened when an id needs it
    lengths = np.zeros(n, np.int32)
    count = 0
    for i, seq in enumerate(seqs):
        seq = np.asarray(seq)[:length]
        if seq.size:
            if seq.min() < 0:
                raise ValueError(f"sequence {i} has a negative id ({seq.min()})")
            top = int(seq.max())
            if top > np.iinfo(rows.dtype).max:
                rows = rows.astype(np.min_scalar_type(top))
        rows[i, : len(seq)] = seq
        lengths[i] = len(seq)
        count = i + 1
    if count != n:
        raise ValueError(f"expected {n} sequences, got {count}")
    return np.ascontiguousarray(rows[:, : max(1, int(lengths.max(initial=0)))]), lengths


def unpack_sequences(rows: np.ndarray, lengths: np.ndarray, length: int,
                     pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of :func:`pack_sequences` -> (int32 ids [n, length], bool mask [n, length])."""
    width = rows.shape[1]
    ids = np.empty((len(rows), length), np.int32)   # filled once, not padded then overwritten
    ids[:, :width] = rows
    ids[:, width:] = pad_id
    mask = np.arange(length, dtype=np.int32) < np.asarray(lengths, np.int32)[:, None]
    return ids, mask


def split_indices(n: int, eval_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed held-out split of ``range(n)`` (independent of the training seed)."""
    perm = np.random.default_rng(seed).permutation(n)
    n_eval = max(1, int(round(n * eval_fraction)))
    return np.sort(perm[n_eval:]), np.sort(perm[:n_eval])


def encode_translation(
    source: np.ndarray,
    target: np.ndarray,
    *,
    max_len: int,
    target_max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """One translation example: source + EOS; BOS + target + EOS (decoder input = [:-1], labels = [1:])."""
    inputs, mask = pad_to(np.concatenate([source[: max_len - 1], [eos_id]]), max_len, pad_id)
    targets, targets_mask = pad_to(
        np.concatenate([[bos_id], target[: target_max_len - 2], [eos_id]]), target_max_len, pad_id
    )
    return {"inputs": inputs, "mask": mask, "targets": targets, "targets_mask": targets_mask}


def stack_examples(examples: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}
