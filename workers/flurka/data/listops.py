"""LRA ListOps: a port of ``lra_benchmarks/data/listops.py`` (google-research/long-range-arena).

The generator is the original one (operators MIN/MAX/MED/SM, an operator node
with probability 0.25 above ``max_depth``, 2..``max_args`` arguments, keep trees
with ``min_length < length < max_length``, de-duplicate, then slice train / val /
test in generation order), with Python's ``random`` replaced by a seeded NumPy
generator and the de-duplicating ``set`` by an insertion-ordered dict so the
splits are reproducible across processes. Tokens follow the common LRA
preprocessing (S4, Skyformer): parentheses dropped, whitespace split, so a
sequence has exactly ``length`` tokens.
"""

from __future__ import annotations

import csv
import functools
import logging
from pathlib import Path

import numpy as np
from flurka.data.core import ArrayExamples, Dataset, DatasetInfo, pad_batch, resolve_data_dir
from flurka.data.tokenizers import WordTokenizer

MIN, MAX, MED, FIRST, LAST, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[FIRST", "[LAST", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUES = tuple(range(10))
VALUE_P = 0.25

TOKENIZER = WordTokenizer(
    words=tuple(str(v) for v in VALUES) + OPERATORS + (END,),
    preprocess=lambda s: s.replace("(", " ").replace(")", " "),
)

FULL = dict(max_depth=10, max_args=10, min_length=500, max_length=2000, num_train=96_000, num_val=2_000, num_test=2_000)
SMALL = dict(max_depth=3, max_args=5, min_length=8, max_length=40, num_train=20_000, num_val=1_000, num_test=1_000)


def generate_tree(depth: int, max_depth: int, max_args: int, rng: np.random.Generator):
    """A random expression tree and its token length (operator + arguments + END)."""
    r = rng.random() if depth < max_depth else 1
    if r > VALUE_P:
        return VALUES[_below(rng, len(VALUES))], 1
    length = 2
    num_values = 2 + _below(rng, max_args - 1)
    values = []
    for _ in range(num_values):
        sub_t, sub_l = generate_tree(depth + 1, max_depth, max_args, rng)
        values.append(sub_t)
        length += sub_l
    op = OPERATORS[_below(rng, len(OPERATORS))]
    t = (op, values[0])
    for value in values[1:]:
        t = (t, value)
    return (t, END), length


def _below(rng: np.random.Generator, n: int) -> int:
    """Uniform int in [0, n), like ``random.choice`` / ``randint`` (scalar ``rng.integers`` is ~10x slower)."""
    return int(rng.random() * n)


def to_string(t) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, (int, np.integer)):
        return str(int(t))
    return "( " + to_string(t[0]) + " " + to_string(t[1]) + " )"


def to_value(t):
    """Evaluate a tree (the original's left-nested partial application)."""
    if not isinstance(t, tuple):
        return t
    left, right = to_value(t[0]), to_value(t[1])
    if left in OPERATORS:  # an unsaturated function
        return (left, [right])
    if right == END:  # left is an unsaturated function: apply it
        op, args = left
        if op == MIN:
            return min(args)
        if op == MAX:
            return max(args)
        if op == FIRST:
            return args[0]
        if op == LAST:
            return args[-1]
        if op == MED:
            return int(np.median(args))
        if op == SUM_MOD:
            return int(np.sum(args) % 10)
    return (left[0], left[1] + [right])


def generate(
    num_samples: int, *, max_depth: int, max_args: int, min_length: int, max_length: int, seed: int = 0
) -> list[tuple[str, int]]:
    """``num_samples`` distinct (expression, value) pairs in generation order."""
    rng = np.random.default_rng(seed)
    trees: dict = {}
    while len(trees) < num_samples:
        tree, length = generate_tree(1, max_depth, max_args, rng)
        if min_length < length < max_length:
            trees.setdefault(tree, None)
    return [(to_string(t), int(to_value(t))) for t in trees]


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


def build_full(*, seed: int = 0, data_dir=None, eval_split: str = "validation", generator_seed: int = 0) -> Dataset:
    """lra-listops: the LRA release files if present, else the generator (cached as LRA tsv files).

    Looks for ``<data_dir>/lra_release/listops-1000/basic_{train,val,test}.tsv``
    (the LRA release layout); otherwise generates the 96k/2k/2k set with the
    original settings and writes it there, which takes several minutes once.
    """
    root = resolve_data_dir(data_dir) / "lra_release" / "listops-1000"
    names = {"train": "basic_train.tsv", "validation": "basic_val.tsv", "test": "basic_test.tsv"}
    _check_eval_split(eval_split)
    if not all((root / f).is_file() for f in names.values()):
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
    """The small set's trees, once per process (~2.5 s of Python): a Tune actor's later trials and
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
