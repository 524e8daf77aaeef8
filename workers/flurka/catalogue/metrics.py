"""The metrics a run records and a table shows, each declared once: its direction, whether it is
a fraction (recorded in [-1, 1], shown in percent, as the paper does), whether translation scores
it on whole decoded sentences, and which recorded metric holds its chance line.

Configs (which metrics a benchmark reports), records (the fraction range check), the quality
tables, the report and the sweep's best-trial pick all read this one table.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    word: str                        # its name in a header: "BLEU", "exact match", "eval loss"
    lower_is_better: bool = False
    fraction: bool = False           # recorded as a fraction in [-1, 1], shown ×100 in percent
    sequence: bool = False           # translation: scored on whole decoded sentences
    chance: str | None = None        # the recorded metric holding this one's chance line
    task: bool = True                # a config may list it; else it is recorded beside them


METRICS: dict[str, Metric] = {m.name: m for m in (
    # accuracy's chance line: the eval set's majority class, which every classification run records
    Metric("accuracy", "accuracy", fraction=True, chance="majority_accuracy"),
    Metric("top5", "top5", fraction=True),
    Metric("perplexity", "perplexity", lower_is_better=True),
    Metric("bleu", "BLEU", sequence=True),              # sacreBLEU's 0-100
    Metric("exact_match", "exact match", fraction=True, sequence=True),
    Metric("matthews", "matthews", fraction=True),
    Metric("f1", "f1", fraction=True),
    Metric("pearson", "pearson", fraction=True),
    Metric("spearman", "spearman", fraction=True),
    Metric("loss", "eval loss", lower_is_better=True, task=False),
    Metric("accuracy_mismatched", "accuracy mismatched", fraction=True, task=False),   # MNLI-mm
    Metric("majority_accuracy", "chance accuracy", fraction=True, task=False),
)}
TASK_METRICS: tuple[str, ...] = tuple(n for n, m in METRICS.items() if m.task)   # what a config may list
FRACTION_METRICS: tuple[str, ...] = tuple(n for n, m in METRICS.items() if m.fraction)
LOWER_IS_BETTER: tuple[str, ...] = tuple(n for n, m in METRICS.items() if m.lower_is_better)
SEQUENCE_METRICS: tuple[str, ...] = tuple(n for n, m in METRICS.items() if m.sequence)
CHANCE_OF: dict[str, str] = {n: m.chance for n, m in METRICS.items() if m.chance}


def lower_is_better(metric: str) -> bool:
    """Whether smaller is better for ``metric`` (an unknown name: higher is better)."""
    return metric in LOWER_IS_BETTER


def better(metric: str) -> str:
    """"lower" or "higher": which way ``metric`` is better (a table's title says it)."""
    return "lower" if lower_is_better(metric) else "higher"


def unit(metric: str, char_bleu: bool = False) -> str:
    """The unit a table shows ``metric`` in: "%" for fractions, "char, 0–100" or "0–100" for BLEU
    (``char_bleu``: over characters, the benchmark's ``bleu_tokenize="char"``), "" for perplexity
    and loss (their own units)."""
    if metric in FRACTION_METRICS:
        return "%"
    if metric == "bleu":
        return "char, 0–100" if char_bleu else "0–100"
    return ""


def label(metric: str, char_bleu: bool = False) -> str:
    """A header for ``metric``: "accuracy (%)", "BLEU (char, 0–100)", "perplexity", "eval loss"."""
    word = METRICS[metric].word if metric in METRICS else metric.replace("_", " ")
    shown = unit(metric, char_bleu)
    return f"{word} ({shown})" if shown else word


def shown(metric: str, value: float) -> float:
    """``value`` as a table shows it: fractions ×100 (percent), the rest as recorded."""
    return value * 100.0 if metric in FRACTION_METRICS else value


def significant_decimals(value: float, significant: int = 3) -> int:
    """Decimals that show ``value`` to ``significant`` digits: 5.583 -> 2, 0.2512 -> 3, 123.4 -> 0."""
    if not math.isfinite(value) or value == 0.0:
        return significant - 1
    return max(0, significant - 1 - math.floor(math.log10(abs(value))))


def decimals(metric: str, value: float) -> int:
    """Decimals worth showing: 1 for percent and BLEU (0–100), else 3 significant digits of ``value``."""
    if metric in FRACTION_METRICS or metric == "bleu":
        return 1
    return significant_decimals(value)
