"""Metrics against independent float64 references written from their definitions."""

import math
from collections import Counter

import numpy as np
import pytest

from flurka.training import metrics as M

rng = np.random.default_rng(0)


def test_accuracy_and_topk_ignore_padding():
    logits = rng.normal(size=(50, 7))
    labels = rng.integers(0, 7, 50)
    weights = (rng.random(50) > 0.2).astype(np.float32)
    keep = weights > 0
    ref_acc = np.mean(np.argmax(logits, -1)[keep] == labels[keep])
    assert M.accuracy(np.argmax(logits, -1), labels, weights) == pytest.approx(ref_acc)
    # top-k by counting how many logits beat the label's logit
    rank = (logits > logits[np.arange(50), labels][:, None]).sum(-1)
    for k in (1, 3, 5):
        assert M.top_k_accuracy(logits, labels, k, weights) == pytest.approx(np.mean(rank[keep] < k))


def test_majority_accuracy_is_the_best_constant_guess_on_the_real_examples():
    """scikit-learn's most-frequent dummy classifier, fit and scored on the real examples."""
    from sklearn.dummy import DummyClassifier

    labels = np.array([2, 2, 0, 1, 2, 0, 0, 0, 1, 2])
    weights = np.array([1, 1, 1, 1, 1, 1, 0, 0, 1, 1], np.float32)   # two 0s are padding: 2 is the majority
    keep = weights > 0
    dummy = DummyClassifier(strategy="most_frequent").fit(np.zeros((keep.sum(), 1)), labels[keep])
    want = dummy.score(np.zeros((keep.sum(), 1)), labels[keep])
    assert want == pytest.approx(4 / 8)
    assert M.majority_accuracy(labels, weights) == pytest.approx(want)
    assert M.majority_accuracy(labels) == pytest.approx(4 / 10)          # unweighted: 0 and 2 tie at 4
    assert math.isnan(M.majority_accuracy(labels, np.zeros(10)))


def test_perplexity():
    nll = rng.random(100) * 3
    assert M.perplexity(nll.sum(), 100) == pytest.approx(math.exp(nll.mean()))
    assert M.perplexity(1e6, 1) == float("inf")


def _confusion(p, y):
    tp = np.sum((p == 1) & (y == 1)); tn = np.sum((p == 0) & (y == 0))
    fp = np.sum((p == 1) & (y == 0)); fn = np.sum((p == 0) & (y == 1))
    return float(tp), float(tn), float(fp), float(fn)


def test_matthews_and_f1_match_confusion_formulas():
    y = rng.integers(0, 2, 200)
    p = np.where(rng.random(200) < 0.75, y, 1 - y)
    w = np.ones(200); w[-13:] = 0
    tp, tn, fp, fn = _confusion(p[:-13], y[:-13])
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    f1 = 2 * tp / (2 * tp + fp + fn)
    assert M.matthews(p, y, w) == pytest.approx(mcc, rel=1e-9)
    assert M.f1(p, y, w) == pytest.approx(f1, rel=1e-9)


def _ranks(x):
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x)); r[order] = np.arange(len(x))
    for v in np.unique(x):                      # average ranks of ties
        r[x == v] = r[x == v].mean()
    return r


def test_pearson_and_spearman():
    y = rng.normal(size=80)
    p = y + 0.5 * rng.normal(size=80)
    p[:5] = p[5]                                # ties
    w = np.ones(80); w[-7:] = 0
    a, b = p[:-7], y[:-7]
    ref_p = np.sum((a - a.mean()) * (b - b.mean())) / math.sqrt(np.sum((a - a.mean()) ** 2) * np.sum((b - b.mean()) ** 2))
    ra, rb = _ranks(a), _ranks(b)
    ref_s = np.corrcoef(ra, rb)[0, 1]
    assert M.pearson(p, y, w) == pytest.approx(ref_p, rel=1e-9)
    assert M.spearman(p, y, w) == pytest.approx(ref_s, rel=1e-9)
    assert math.isnan(M.pearson(np.ones(5), np.arange(5.0)))


def _ref_bleu(hyps, refs, n=4):
    """Corpus BLEU (Papineni et al.) on whitespace tokens, no smoothing."""
    matches, totals, hl, rl = [0] * n, [0] * n, 0, 0
    for h, r in zip(hyps, refs):
        h, r = h.split(), r.split()
        hl, rl = hl + len(h), rl + len(r)
        for k in range(1, n + 1):
            hc = Counter(tuple(h[i:i + k]) for i in range(len(h) - k + 1))
            rc = Counter(tuple(r[i:i + k]) for i in range(len(r) - k + 1))
            matches[k - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            totals[k - 1] += max(len(h) - k + 1, 0)
    logp = sum(math.log(m / t) for m, t in zip(matches, totals)) / n
    bp = 1.0 if hl > rl else math.exp(1 - rl / hl)
    return 100 * bp * math.exp(logp)


def test_bleu_matches_reference_formula():
    refs = ["the cat sat on the mat today", "a dog ran in the big green park", "one two three four five six"]
    hyps = ["the cat sat on a mat today", "a dog ran in the green park", "one two three four five six"]
    assert M.bleu(hyps, refs) == pytest.approx(_ref_bleu(hyps, refs), rel=1e-6)
    assert M.bleu(refs, refs) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="hypotheses"):
        M.bleu(hyps[:2], refs)


def test_character_bleu_scores_one_word_sentences():
    """nmt-small's targets are mostly one word: word BLEU is 0 even for a perfect output, character
    BLEU is the same formula over characters."""
    refs = ["einundzwanzig", "siebentausendsiebenhundertsiebenundsiebzig", "Vereinigte Staaten"]
    hyps = ["einundzwanzig", "siebentausendsiebenhundertsiebzig", "Vereinigte Staat"]
    assert M.bleu(refs, refs) == 0.0                     # no word 4-grams at all
    assert M.bleu(refs, refs, tokenize="char") == pytest.approx(100.0)
    chars = lambda s: " ".join(s.replace(" ", ""))  # noqa: E731  (sacrebleu's char: no spaces)
    assert M.bleu(hyps, refs, tokenize="char") == pytest.approx(
        _ref_bleu([chars(h) for h in hyps], [chars(r) for r in refs]), rel=1e-6)
