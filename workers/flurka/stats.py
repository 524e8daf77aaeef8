"""Seed statistics: how every quality number is reported (JAX-free; scipy does the maths).

A quality cell is the mean over seeds with its 95 % confidence interval and its n: Student's t
with n − 1 degrees of freedom (``scipy.stats.t.interval``) below 10 seeds, a BCa bootstrap
(``scipy.stats.bootstrap``) from 10 on. One seed has no interval and says so ("1 seed").

A comparison of two mechanisms is *paired* over the seeds both have (same data order, same
init where shared): the CI of the paired differences and ``scipy.stats.ttest_rel``'s p. A
difference whose CI holds 0 is a tie, whatever the means say.

A table that tests many pairs at once corrects for it: Holm's step-down adjustment
(``statsmodels``' ``multipletests``, :func:`holm`) gives each test its adjusted p beside the raw one,
and the verdict of a test in such a family is a tie unless its adjusted p is below 0.05
(:meth:`Paired.in_family`). A lone comparison keeps the CI rule, which is the same test.

A classification cell is judged against its chance line too (the eval set's majority class, which
every run records as ``majority_accuracy``): one that does not clear it beyond its CI
(:meth:`Estimate.above`) is "at chance", a number that measured nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as _st
from statsmodels.stats.multitest import multipletests

CONFIDENCE = 0.95
BOOTSTRAP_FROM = 10   # seeds from which the CI is a bootstrap, not Student's t
_BOOTSTRAP_RESAMPLES = 9999
AT_CHANCE = "at chance"
AT_FLOOR = "at floor"
CHANCE_NOTE = (f"chance: the accuracy of always answering the eval set's majority class; {AT_CHANCE}: a cell "
               "whose 95 % CI (one seed: whose mean) does not clear it")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Mean over n seeds and its ``CONFIDENCE`` interval (NaN bounds for n < 2)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0

    def holds(self, value: float) -> bool:
        return self.n >= 2 and self.low <= value <= self.high

    def above(self, value: float) -> bool:
        """Whether the estimate clears ``value``: its whole CI lies above it (one seed, or a mean
        without a CI: the mean does). What a classification cell must do against its chance line."""
        bound = self.low if self.n >= 2 and not math.isnan(self.low) else self.mean
        return bool(bound > value)

    def clears(self, value: float, lower_is_better: bool = False) -> bool:
        """:meth:`above`, or for a lower-is-better metric its mirror: the whole CI lies below."""
        if not lower_is_better:
            return self.above(value)
        bound = self.high if self.n >= 2 and not math.isnan(self.high) else self.mean
        return bool(bound < value)

    def format(self, digits: int = 1, *, sign: bool = False) -> str:
        """``97.3 ± 0.6 (n=3)``; one seed: ``97.3 (1 seed)``; a mean of n ≥ 2 without an interval
        (e.g. an average over cells of different seeds): ``97.3 (no CI)``; nothing: ``—``.
        ``sign``: ``+`` before a positive mean (a difference)."""
        if self.n == 0 or math.isnan(self.mean):
            return "—"
        mean = f"{self.mean:{'+' if sign else ''}.{digits}f}"
        if self.n < 2:
            return f"{mean} (1 seed)"
        if math.isnan(self.low):
            return f"{mean} (no CI)"
        return f"{mean} ± {self.half_width:.{digits}f} (n={self.n})"

    def rounded(self, digits: int) -> "Estimate":
        """The estimate with mean and bounds rounded to ``digits`` decimals (for CSV)."""
        r = lambda v: v if math.isnan(v) else round(v, digits) + 0.0  # noqa: E731 (+0.0: no -0.0)
        return Estimate(r(self.mean), r(self.low), r(self.high), self.n)


def _clean(values: Sequence[float]) -> np.ndarray:
    a = np.asarray(list(values), dtype=np.float64)
    return a[np.isfinite(a)]


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean and CI of ``values`` (NaNs dropped): t below ``BOOTSTRAP_FROM`` values, else a BCa
    bootstrap with a fixed seed (the same table twice gives the same cell)."""
    a = _clean(values)
    n = len(a)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = float(a.mean())
    if n < 2:
        return Estimate(mean, math.nan, math.nan, 1)
    if np.ptp(a) == 0.0:
        return Estimate(mean, mean, mean, n)
    if n >= BOOTSTRAP_FROM:
        res = _st.bootstrap((a,), np.mean, confidence_level=confidence, method="BCa",
                            n_resamples=_BOOTSTRAP_RESAMPLES, random_state=0)
        low, high = res.confidence_interval
    else:
        low, high = _st.t.interval(confidence, n - 1, loc=mean, scale=_st.sem(a))
    return Estimate(mean, float(low), float(high), n)


@dataclasses.dataclass(frozen=True)
class Paired:
    """A − B over the seeds both have: the mean difference, its CI, ttest_rel's p, the verdict."""

    a: str
    b: str
    diff: Estimate
    p: float
    seeds: tuple
    p_adjusted: float | None = None   # Holm's, where the test is one of a family (in_family)

    @property
    def verdict(self) -> str:
        """``a``, ``b`` (the better one, for higher-is-better metrics), ``tie`` or ``n<2`` (no
        interval). Alone: a tie where the CI holds 0; in a family: where the Holm-adjusted p is
        not below 1 − CONFIDENCE."""
        if self.diff.n < 2:
            return "n<2"
        if self.p_adjusted is not None:
            if not self.p_adjusted < 1.0 - CONFIDENCE:
                return "tie"
        elif self.diff.holds(0.0):
            return "tie"
        return self.a if self.diff.mean > 0 else self.b

    def in_family(self, p_adjusted: float) -> "Paired":
        """This test with its family's Holm-adjusted p (:func:`holm`), which its verdict then uses."""
        return dataclasses.replace(self, p_adjusted=float(p_adjusted))

    def winner(self, lower_is_better: bool = False) -> str:
        v = self.verdict
        if v in ("tie", "n<2") or not lower_is_better:
            return v
        return self.b if v == self.a else self.a

    def format(self, digits: int = 1) -> str:
        """``+1.3 ± 1.3 (n=3), p=0.045``; in a family also Holm's: ``…, p=0.045, p_holm=0.18``."""
        if self.diff.n == 0:
            return "—"
        p = "" if math.isnan(self.p) else f", p={self.p:.2g}"
        if self.p_adjusted is not None and not math.isnan(self.p_adjusted):
            p += f", p_holm={self.p_adjusted:.2g}"
        return f"{self.diff.format(digits, sign=True)}{p}"


def paired(a: Mapping, b: Mapping, *, names: tuple[str, str] = ("A", "B"),
           confidence: float = CONFIDENCE) -> Paired:
    """Compare ``a`` and ``b`` ({seed: value}) over their common seeds."""
    seeds = tuple(sorted(s for s in set(a) & set(b)
                         if np.isfinite(a[s]) and np.isfinite(b[s])))
    x = np.array([a[s] for s in seeds], dtype=np.float64)
    y = np.array([b[s] for s in seeds], dtype=np.float64)
    d = x - y
    est = mean_ci(d, confidence)
    if len(seeds) < 2 or np.ptp(d) == 0.0:
        p = math.nan if len(seeds) < 2 else (1.0 if d[0] == 0 else 0.0)
    else:
        p = float(_st.ttest_rel(x, y).pvalue)
    return Paired(names[0], names[1], est, p, seeds)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values of a family of tests, in their order (statsmodels'
    ``multipletests(method="holm")``); a NaN p (no test: fewer than two seeds) stays NaN and
    does not count towards the family's size."""
    p = np.asarray(list(pvalues), dtype=np.float64)
    out = np.full(p.shape, np.nan)
    tested = np.isfinite(p)
    if tested.any():
        out[tested] = multipletests(p[tested], alpha=1.0 - CONFIDENCE, method="holm")[1]
    return [float(v) for v in out]


def in_family(tests: Sequence[Paired]) -> list[Paired]:
    """``tests`` as one family: each with its Holm-adjusted p (:func:`holm`), which its verdict
    then uses."""
    return [t.in_family(a) for t, a in zip(tests, holm([t.p for t in tests]))]


__all__ = ["CONFIDENCE", "BOOTSTRAP_FROM", "Estimate", "Paired", "mean_ci", "paired",
           "holm", "in_family"]
