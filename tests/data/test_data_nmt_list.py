"""nmt-list-small: a deterministic generator, disjoint splits of one distribution, examples that
say what the task says, and trivial outputs far below what full attention scored (the committed
measurement, scored here again with sacrebleu)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from flurka.data import get_dataset
from flurka.data import nmt_list as L
from flurka.training.metrics import bleu, exact_match

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "2026-12-06-nmt-list"


def test_the_generator_is_deterministic():
    first = L.examples()
    L.examples.cache_clear()
    L.item_pool.cache_clear()
    assert L.examples() == first
    assert len(first[0]) == L.NUM_TRAIN and len(first[1]) == L.NUM_EVAL


def test_splits_are_disjoint_and_of_one_distribution():
    train, eval = L.examples()
    assert not {s for s, _ in train} & {s for s, _ in eval}
    assert len({s for s, _ in train}) == len(train)
    numbers, names = L.item_pool()
    pool = dict(numbers) | dict(names)
    # every eval target is an item of the pool, and nearly all were training targets too (names
    # all: there are 79; numbers: 1000 of them, each a target about 10 times)
    train_targets = {t for _, t in train}
    assert {t for _, t in eval} <= set(pool.values())
    assert {d for _, d in names} <= train_targets
    assert np.mean([t in train_targets for _, t in eval]) > 0.99
    # the marked item is as often a number as a name, and sits anywhere in the list
    kinds = [t in dict(names).values() for _, t in train]
    assert 0.45 < np.mean(kinds) < 0.55
    first = [s.split(L.SEPARATOR)[0].isupper() for s, _ in train]
    assert 0.1 < np.mean(first) < 0.35


def test_every_example_marks_one_item_and_targets_its_german():
    train, eval = L.examples()
    numbers, names = L.item_pool()
    german = {en.upper(): de for en, de in numbers + names}
    for source, target in train[:2000] + eval:
        items = source.split(L.SEPARATOR)
        marked = [i for i in items if i == i.upper() and i != i.lower()]
        assert len(marked) == 1 and len(items) >= 2, source
        assert german[marked[0]] == target
        assert all(i == i.lower() for i in items if i is not marked[0])
        assert L.MIN_CHARS <= len(source) <= L.MAX_CHARS


def test_batches_decode_to_the_examples():
    ds = get_dataset("nmt-list-small", seed=3)
    train, eval = L.examples()
    batch = next(ds.eval_batches(8))
    for i, (src, tgt) in enumerate(zip(batch["inputs"], batch["targets"])):
        assert (ds.decode(src), ds.decode(tgt[1:])) == eval[i]
    assert ds.info.max_len == 128 and ds.info.target_max_len == 32
    # the longest target (29 characters) fits with BOS and EOS: no target is cut
    assert max(len(t) for _, t in train + eval) + 2 <= ds.info.target_max_len
    assert (ds.info.num_train, ds.info.num_eval) == (L.NUM_TRAIN, L.NUM_EVAL)


def test_metrics_against_independent_implementations():
    hyps = ["März", "dreihundertsechs", "Kuba", ""]
    refs = ["März", "dreihundertsieben", "Kuba", "Oman"]
    assert exact_match(hyps, refs) == 0.5
    assert bleu(hyps, refs, tokenize="char") == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs], tokenize="char").score)
    with pytest.raises(ValueError):
        exact_match(hyps, refs[:2])
    assert math.isnan(exact_match([], []))


def _full_attention_means() -> dict[str, float]:
    """Full attention's mean BLEU and exact match (percent) over its seeds, as the committed
    quality table of nmt-list-small recorded them."""
    rows = [json.loads(line) for line in (RESULTS / "quality.jsonl").read_text().splitlines() if line.startswith("{")]
    full = [r for r in rows if r["attention"] == "full" and not r.get("control") and r["status"] == "ok"]
    assert len(full) >= 3
    return {"bleu": float(np.mean([r["metrics"]["bleu"] for r in full])),
            "exact_match": float(np.mean([100 * r["metrics"]["exact_match"] for r in full]))}


def test_trivial_outputs_score_at_most_half_of_full_attention():
    """Empty, the source copied, the most frequent and a random training target, scored on the
    shipped eval split: on BLEU and on exact match each at most half of full attention's mean."""
    train, eval = L.examples()
    refs = [t for _, t in eval]
    full = _full_attention_means()
    for name, hyps in L.trivial_outputs(train, eval).items():
        got = {"bleu": sacrebleu.corpus_bleu(hyps, [refs], tokenize="char").score,
               "exact_match": 100 * float(np.mean([h == r for h, r in zip(hyps, refs)]))}
        for metric, value in got.items():
            assert value <= full[metric] / 2, (name, metric, value, full[metric])
