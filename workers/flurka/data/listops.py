"""LRA ListOps: a port of ``lra_benchmarks/data/listops.py`` (google-research/long-range-arena).

The generator is the original one (operators MIN/MAX/MED/SM, an operator node
with probability 0.25 above ``max_depth``, 2..``max_args`` arguments, keep trees
with ``min_length < length < max_length``, de-duplicate, then slice train / val /
test in generation order), with Python's ``random`` replaced by a seeded NumPy
generator and the de-duplicating ``set`` by an insertion-ordered dict so the
splits are reproducible across processes. Each tree is rendered and evaluated as
it is drawn: the original's text and value (tests/data checks it against the
original's tuple trees). Tokens follow the common LRA preprocessing (S4,
Skyformer): parentheses dropped, whitespace split, so a sequence has exactly
``length`` tokens.
"""

from __future__ import annotations

import csv
import functools
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from flurka.data.core import ArrayExamples, Dataset, DatasetInfo, pad_batch, resolve_data_dir
from flurka.data.tokenizers import WordTokenizer

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUES = tuple(range(10))
VALUE_P = 0.25

TOKENIZER = WordTokenizer(
    words=tuple(str(v) for v in VALUES) + OPERATORS + (END,),
    preprocess=lambda s: s.replace("(", " ").replace(")", " "),
)

FULL = dict(max_depth=10, max_args=10, min_length=500, max_length=2000, num_train=96_000, num_val=2_000, num_test=2_000)
SMALL = dict(max_depth=3, max_args=5, min_length=8, max_length=40, num_train=20_000, num_val=1_000, num_test=1_000)


def _uniforms(rng: np.random.Generator, chunk: int = 1 << 16) -> Iterator[float]:
    """``rng.random()``'s stream drawn a chunk at a time: the same numbers, without a NumPy call per
    draw (the generator makes ~10 draws per kept tree)."""
    while True:
        yield from rng.random(chunk).tolist()


def _median(values: list[int]) -> int:
    """LRA's ``int(np.median(args))``: the mean of the middle two, truncated."""
    s, n = sorted(values), len(values)
    return s[n // 2] if n % 2 else int((s[n // 2 - 1] + s[n // 2]) / 2)


APPLY = {MIN: min, MAX: max, MED: _median, SUM_MOD: lambda values: sum(values) % 10}


def generate_tree(depth: int, max_depth: int, max_args: int, draw) -> tuple[str, int, int]:
    """A random expression: its text, value and token length (operator + arguments + END).

    The original builds a tuple tree ``((((op, a1), a2), ...), END)`` and renders and evaluates
    it afterwards; this renders and evaluates as it goes, with the same draws in the same order,
    so the text (the tree, fully parenthesised) and the value are the original's.
    """
    r = draw() if depth < max_depth else 1
    if r > VALUE_P:
        value = VALUES[int(draw() * len(VALUES))]
        return str(value), value, 1
    num_values = 2 + int(draw() * (max_args - 1))
    args = [generate_tree(depth + 1, max_depth, max_args, draw) for _ in range(num_values)]
    op = OPERATORS[int(draw() * len(OPERATORS))]
    text = f"( {op} {args[0][0]} )"
    for arg_text, _, _ in args[1:]:
        text = f"( {text} {arg_text} )"
    return f"( {text} {END} )", APPLY[op]([a[1] for a in args]), 2 + sum(a[2] for a in args)


def generate(
    num_samples: int, *, max_depth: int, max_args: int, min_length: int, max_length: int, seed: int = 0
) -> list[tuple[str, int]]:
    """``num_samples`` distinct (expression, value) pairs in generation order."""
    draw = _uniforms(np.random.default_rng(seed)).__next__
    rows: dict[str, int] = {}
    while len(rows) < num_samples:
        text, value, length = generate_tree(1, max_depth, max_args, draw)
        if min_length < length < max_length:
            rows.setdefault(text, value)
    return list(rows.items())


def read_tsv(path: Path) -> list[tuple[str, int]]:
    """An LRA release / generator output file: header ``Source\tTarget``."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    return [(src, int(tgt)) for src, tgt in rows[1:]]


def _encode(rows: list[tuple[str, int]], max_len: int) -> ArrayExamples:
    seqs = [np.concatenate([[TOKENIZER.cls_id], TOKENIZER.encode(src)]) for src, _ in rows]
    ids, mask = pad_batch(seqs, max_len, TOKENIZER.pad_id)
    return ArrayExamples({"inputs": ids, "mask": mask, "label": np.asarray([v for _, v in rows], np.int32)})


def _dataset(name: str, train, eval, max_len: int, seed: int) -> Dataset:
    info = DatasetInfo(
        name=name,
        task="classification",
        vocab_size=TOKENIZER.vocab_size,
        max_len=max_len,
        num_classes=len(VALUES),
        pad_id=TOKENIZER.pad_id,
        cls_id=TOKENIZER.cls_id,
    )
    return Dataset(info, _encode(train, max_len), _encode(eval, max_len), seed=seed, decode=TOKENIZER.decode)


def _check_eval_split(eval_split: str) -> None:
    if eval_split not in ("validation", "test"):
        raise ValueError(f"eval_split must be 'validation' or 'test', got {eval_split!r}")


def build_small(
    *, seed: int = 0, data_dir=None, eval_split: str = "validation", generator_seed: int = 0, **overrides
) -> Dataset:
    """lra-listops-small: the same generator with shallow, short trees (CPU-trainable)."""
    del data_dir
    _check_eval_split(eval_split)
    cfg = {**SMALL, **_check_overrides(overrides)}
    train, val, test = _three_way(_generated(tuple(sorted(cfg.items())), generator_seed), cfg)
    return _dataset("lra-listops-small", train, val if eval_split == "validation" else test, cfg["max_length"], seed)


RELEASE_FILES = {"train": "basic_train.tsv", "validation": "basic_val.tsv", "test": "basic_test.tsv"}


def release_dir(data_dir=None) -> Path:
    """Where lra-listops's files are read from (and written to when generated)."""
    return resolve_data_dir(data_dir) / "lra_release" / "listops-1000"


def release_present(data_dir=None) -> bool:
    """Whether the LRA release files (or a generated set) are under ``data_dir``."""
    root = release_dir(data_dir)
    return all((root / f).is_file() for f in RELEASE_FILES.values())


def generation_plan(data_dir=None) -> str | None:
    """What building lra-listops would generate first, in words (None: its files are there)."""
    if release_present(data_dir):
        return None
    return (f"generate LRA ListOps (100k trees of up to 2000 tokens, about 10 minutes once, ~630 MB) into "
            f"{release_dir(data_dir)}")


def build_full(*, seed: int = 0, data_dir=None, eval_split: str = "validation", generator_seed: int = 0) -> Dataset:
    """lra-listops: the LRA release files if present, else the generator (cached as LRA tsv files).

    Looks for ``<data_dir>/lra_release/listops-1000/basic_{train,val,test}.tsv``
    (the LRA release layout); otherwise generates the 96k/2k/2k set with the
    original settings and writes it there, which takes several minutes once
    (``flurka train`` asks for ``--generate-data`` first: :func:`generation_plan`).
    """
    root = release_dir(data_dir)
    names = RELEASE_FILES
    _check_eval_split(eval_split)
    if not release_present(data_dir):
        logging.getLogger(__name__).warning("generating LRA ListOps (100k trees, ~10 min once) into %s", root)
        cfg = FULL
        rows = generate(
            cfg["num_train"] + cfg["num_val"] + cfg["num_test"],
            **{k: cfg[k] for k in ("max_depth", "max_args", "min_length", "max_length")},
            seed=generator_seed,
        )
        splits = dict(zip(names, _three_way(rows, cfg)))
        _try_write_tsv(root, names, splits)
    else:
        splits = {k: read_tsv(root / f) for k, f in names.items()}
    return _dataset("lra-listops", splits["train"], splits[eval_split], FULL["max_length"], seed)


@functools.lru_cache(maxsize=2)
def _generated(cfg: tuple, generator_seed: int) -> tuple[tuple[str, int], ...]:
    """The small set's trees, once per process (seconds of Python): a Tune actor's later trials and
    a test session's many small runs reuse them."""
    cfg = dict(cfg)
    return tuple(generate(
        cfg["num_train"] + cfg["num_val"] + cfg["num_test"],
        **{k: cfg[k] for k in ("max_depth", "max_args", "min_length", "max_length")},
        seed=generator_seed,
    ))


def _three_way(rows, cfg):
    n_train, n_val = cfg["num_train"], cfg["num_val"]
    return rows[:n_train], rows[n_train : n_train + n_val], rows[n_train + n_val :]


def _try_write_tsv(root: Path, names: dict, splits: dict) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        for key, fname in names.items():
            with open(root / fname, "w", newline="") as f:
                writer = csv.writer(f, delimiter="\t")
                writer.writerow(["Source", "Target"])
                writer.writerows(splits[key])
    except OSError:
        pass  # a read-only data dir only costs regenerating next time


def _check_overrides(overrides: dict) -> dict:
    unknown = sorted(set(overrides) - set(SMALL))
    if unknown:
        raise ValueError(f"unknown lra-listops-small options {unknown}; valid: {sorted(SMALL)}")
    return overrides
