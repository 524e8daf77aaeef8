"""Evaluation metrics on host numpy arrays, one function per metric of the paper (appendix A).

Eval batches carry ``example_weight`` (0 for padding examples); every metric honours it, so a
padded final batch never counts. Library implementations where they exist: scikit-learn (Matthews
correlation, F1), SciPy (Pearson, Spearman), sacrebleu (BLEU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import sacrebleu

# scikit-learn (1.3 s to import) and scipy.stats (0.8 s) are imported by the GLUE metrics that use
# them: every training process imports this module, few score GLUE.


def _real(weights: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n, bool) if weights is None else np.asarray(weights) > 0


def accuracy(preds, labels, weights=None) -> float:
    preds, labels = np.asarray(preds), np.asarray(labels)
    keep = _real(weights, len(labels))
    return float(np.mean(preds[keep] == labels[keep]))


def majority_accuracy(labels, weights=None) -> float:
    """Accuracy of always answering these examples' most frequent label: the chance line of a
    classification table (the best constant guess on the eval set, which no model that ignores its
    input passes). A cell that does not clear it beyond its seed spread measured nothing."""
    labels = np.asarray(labels)[_real(weights, len(labels))]
    if labels.size == 0:
        return math.nan
    return float(np.unique(labels, return_counts=True)[1].max() / labels.size)


def top_k_accuracy(logits, labels, k: int = 5, weights=None) -> float:
    """Fraction of examples whose label is among the ``k`` highest logits."""
    logits, labels = np.asarray(logits), np.asarray(labels)
    keep = _real(weights, len(labels))
    topk = np.argsort(-logits[keep], axis=-1, kind="stable")[:, :k]
    return float(np.mean(np.any(topk == labels[keep, None], axis=-1)))


def perplexity(nll_sum: float, tokens: float) -> float:
    """exp(mean token negative log-likelihood); inf when it overflows."""
    if tokens <= 0:
        return float("nan")
    mean = nll_sum / tokens
    return float(math.exp(mean)) if mean < 700 else float("inf")


def matthews(preds, labels, weights=None) -> float:
    from sklearn.metrics import matthews_corrcoef
    keep = _real(weights, len(labels))
    return float(matthews_corrcoef(np.asarray(labels)[keep], np.asarray(preds)[keep]))


def f1(preds, labels, weights=None) -> float:
    """Binary F1 of the positive class (GLUE's MRPC/QQP convention)."""
    from sklearn.metrics import f1_score
    keep = _real(weights, len(labels))
    return float(f1_score(np.asarray(labels)[keep], np.asarray(preds)[keep], zero_division=0.0))


def _constant(x: np.ndarray) -> bool:
    return x.size < 2 or bool(np.all(x == x[0]))


def pearson(preds, labels, weights=None) -> float:
    from scipy.stats import pearsonr
    keep = _real(weights, len(labels))
    p, y = np.asarray(preds, np.float64)[keep], np.asarray(labels, np.float64)[keep]
    return float("nan") if _constant(p) or _constant(y) else float(pearsonr(p, y)[0])


def spearman(preds, labels, weights=None) -> float:
    from scipy.stats import spearmanr
    keep = _real(weights, len(labels))
    p, y = np.asarray(preds, np.float64)[keep], np.asarray(labels, np.float64)[keep]
    return float("nan") if _constant(p) or _constant(y) else float(spearmanr(p, y)[0])


def bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> float:
    """Corpus BLEU, 0-100 (sacrebleu; 13a tokenisation by default). Sentences of one word (a
    number word, a country name) have no word 4-grams, so their word BLEU is 0 even when every
    one is right: ``tokenize="char"`` scores character n-grams instead."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize).score)


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Sequence accuracy: the fraction of hypotheses equal to their reference, character for
    character (BLEU's partial credit for a translation that is almost right, here none)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        return float("nan")
    return float(np.mean([h == r for h, r in zip(hypotheses, references)]))
