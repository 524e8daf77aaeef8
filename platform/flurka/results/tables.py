"""The paper's tables, read from the results database with SQL and shaped with pandas.

One rule picks every quality cell: among the ``status = 'ok'`` trials of a mechanism on a
benchmark, group by hyperparameter configuration (alpha, base, d_k, num_features), average each
configuration over its seeds (``agg="mean"``, the default) and report the best configuration;
``agg="best"`` reports the best single trial instead (n = 1, no interval). "Best" is the maximum,
except for perplexity and loss (minimum). The cell carries its statistics (:mod:`flurka.stats`):
the chosen configuration's mean over seeds, its 95 % CI (Student's t below 10 seeds, a bootstrap
from 10) and n. Fraction metrics (accuracy, f1, ...) are shown in percent, as in the paper.

Each quality table comes three ways: a long *stats* frame (one row per cell: mean, low, high, n,
the configuration and seeds behind it; ``metric_stats``, ``uptraining_stats``), the wide display
table of strings ("97.2 ± 1.7 (n=3)", units in the headers; ``metric_table``,
``uptraining_table``...) and, with ``numbers=True``, the wide numeric table for CSV (per cell
``mean``, ``ci_low``, ``ci_high``, ``n`` columns, rounded to the digits that mean something:
0.1 for percent and BLEU, 3 significant digits for perplexity and loss). Columns with no results
at all are left out; a missing cell is NaN.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from flurka.results.models import CurvePoint, Environment, Metric, SpeedMeasurement, Sweep, Trial
from flurka.mechanisms import KERNEL_OF, LOW_RANK
from flurka.results.records import FRACTION_METRICS, MECHANISMS
from flurka.stats import Estimate, mean_ci, paired, significant_decimals

LOWER_IS_BETTER = ("perplexity", "loss")
CONFIG = ["alpha", "base", "d_k", "num_features"]
AGGS = ("mean", "best")
CHAR_BLEU = ("nmt-small",)        # benchmarks whose BLEU is over characters (bleu_tokenize="char")
PAPER_BEST_ALPHA = (0.25, 0.375)  # Table 5's observation: the best α lies in [25 %, 37.5 %]

# (column label, benchmark, metric): Table 2 (GLUE), Table 3 (LRA), Table 4 (collective tasks).
GLUE_COLUMNS = [
    ("CoLA (mcc, %)", "glue-cola", "matthews"), ("SST-2 (acc, %)", "glue-sst2", "accuracy"),
    ("MRPC (F1, %)", "glue-mrpc", "f1"), ("MRPC (acc, %)", "glue-mrpc", "accuracy"),
    ("STS-B (Pearson, %)", "glue-stsb", "pearson"), ("STS-B (Spearman, %)", "glue-stsb", "spearman"),
    ("QQP (F1, %)", "glue-qqp", "f1"), ("QQP (acc, %)", "glue-qqp", "accuracy"),
    ("MNLI-m (acc, %)", "glue-mnli", "accuracy"), ("MNLI-mm (acc, %)", "glue-mnli", "accuracy_mismatched"),
    ("QNLI (acc, %)", "glue-qnli", "accuracy"), ("RTE (acc, %)", "glue-rte", "accuracy"),
]
LRA_COLUMNS = [("ListOps (acc, %)", "lra-listops", "accuracy"), ("Text (acc, %)", "lra-text", "accuracy"),
               ("Retrieval (acc, %)", "lra-retrieval", "accuracy"), ("Image (acc, %)", "lra-image", "accuracy"),
               ("Pathfinder (acc, %)", "lra-pathfinder", "accuracy")]
LRA_SMALL_COLUMNS = [("ListOps (acc, %)", "lra-listops-small", "accuracy"),
                     ("Image (acc, %)", "lra-image-small", "accuracy")]
COLLECTIVE_COLUMNS = [("En-De (BLEU, 0–100)", "nmt-wmt14-ende", "bleu"),
                      ("En-Fr (BLEU, 0–100)", "nmt-wmt14-enfr", "bleu"),
                      ("ImageNet top-1 (%)", "imagenet", "accuracy"), ("ImageNet top-5 (%)", "imagenet", "top5"),
                      ("WikiText-103 (perplexity)", "mlm-wikitext103", "perplexity")]
CELL_STATS = ("mean", "ci_low", "ci_high", "n")   # a cell's columns in the numeric (CSV) table


class NoResults(ValueError):
    """The database holds nothing the requested table can be built from."""


def _check_agg(agg: str) -> None:
    if agg not in AGGS:
        raise ValueError(f"agg {agg!r} is not one of {', '.join(AGGS)}")


def metric_unit(metric: str, benchmark: str | None = None) -> str:
    """The unit a table shows ``metric`` in: "%" for fractions, "char, 0–100" or "0–100" for BLEU,
    "" for perplexity and loss (their own units)."""
    if metric in FRACTION_METRICS:
        return "%"
    if metric == "bleu":
        return "char, 0–100" if benchmark in CHAR_BLEU else "0–100"
    return ""


def metric_label(metric: str, benchmark: str | None = None) -> str:
    """A header for ``metric``: "accuracy (%)", "BLEU (char, 0–100)", "perplexity", "eval loss"."""
    name = {"bleu": "BLEU", "loss": "eval loss"}.get(metric, metric)
    unit = metric_unit(metric, benchmark)
    return f"{name} ({unit})" if unit else name


def metric_decimals(metric: str, value: float) -> int:
    """Decimals worth showing: 1 for percent and BLEU (0–100), else 3 significant digits of ``value``."""
    if metric in FRACTION_METRICS or metric == "bleu":
        return 1
    return significant_decimals(value)


def _trial_filter(stmt: sa.Select, benchmarks: Sequence[str], sweep: str | None) -> sa.Select:
    stmt = stmt.where(Trial.status == "ok", Trial.benchmark.in_(list(benchmarks)))
    if sweep is not None:
        stmt = stmt.join(Sweep, Sweep.id == Trial.sweep_id).where(sa.or_(Sweep.external_id == sweep, Sweep.name == sweep))
    return stmt


def final_metrics(engine: Engine, benchmarks: Sequence[str], metrics: Sequence[str], *,
                  sweep: str | None = None) -> pd.DataFrame:
    """One row per (ok trial, metric): attention, benchmark, seed, config columns, metric, value."""
    stmt = _trial_filter(
        sa.select(Trial.id.label("trial_id"), Trial.attention, Trial.benchmark, Trial.seed, Trial.alpha, Trial.base,
                  Trial.d_k, Trial.num_features, Metric.name.label("metric"), Metric.value)
        .join(Metric, Metric.trial_id == Trial.id).where(Metric.name.in_(list(metrics))),
        benchmarks, sweep)
    with engine.connect() as conn:
        return pd.read_sql(stmt, conn)


def _select(df: pd.DataFrame, by: list[str], value: str, lower_better: bool, agg: str) -> pd.Series:
    """The cell rule on a numeric column, means only: per ``by`` group, best configuration's seed
    mean (or best single trial)."""
    if agg == "mean":
        df = df.groupby(by + CONFIG, dropna=False)[value].mean().reset_index()
    grouped = df.groupby(by)[value]
    return grouped.min() if lower_better else grouped.max()


@dataclasses.dataclass(frozen=True)
class Cell:
    """A quality cell: the configuration the cell rule chose, its value per seed, its estimate."""

    config: dict
    values: dict
    estimate: Estimate

    @property
    def seeds(self) -> str:
        return ",".join(str(s) for s in sorted(self.values))

    def config_text(self) -> str:
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.config.items())


def _config(values) -> dict:
    out = {}
    for name, v in zip(CONFIG, values):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        out[name] = int(v) if name in ("d_k", "num_features") else float(v) if name == "alpha" else v
    return out


def _cells(df: pd.DataFrame, by: list[str], lower: bool, agg: str) -> dict[tuple, Cell]:
    """The cell rule per ``by`` group of trials (columns ``by``, CONFIG, seed, value): the
    configuration with the best seed mean (``agg="mean"``; a seed run twice counts once, its
    runs averaged) or the best single trial (``agg="best"``: n = 1, no interval)."""
    out = {}
    for key, part in df.groupby(by, dropna=False, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        if agg == "mean":
            candidates = []
            for cfg, trials in part.groupby(CONFIG, dropna=False, sort=True):
                values = trials.groupby("seed", dropna=False)["value"].mean().to_dict()
                candidates.append(Cell(_config(cfg), values, mean_ci(list(values.values()))))
        else:
            candidates = [Cell(_config([t[c] for c in CONFIG]), {t["seed"]: float(t["value"])},
                               Estimate(float(t["value"]), math.nan, math.nan, 1))
                          for _, t in part.sort_values(CONFIG + ["seed"]).iterrows()]
        pick = min if lower else max
        out[key] = pick(candidates, key=lambda c: c.estimate.mean)
    return out


def _scaled(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    frac = df["metric"].isin(FRACTION_METRICS)
    df.loc[frac, "value"] = df.loc[frac, "value"] * 100.0
    return df


def _order(mechanisms) -> list[str]:
    return [m for m in MECHANISMS if m in set(mechanisms)]


def _stat_row(cell: Cell | None, decimals: int, **keys) -> dict:
    est = cell.estimate if cell is not None else Estimate(math.nan, math.nan, math.nan, 0)
    return {**keys, "config": "" if cell is None else cell.config_text(), "seeds": "" if cell is None else cell.seeds,
            "mean": est.mean, "low": est.low, "high": est.high, "n": est.n, "decimals": decimals}


def _estimate(row) -> Estimate:
    return Estimate(row["mean"], row["low"], row["high"], int(row["n"]))


def _average(cells: list[Cell | None]) -> Estimate:
    """The mean over a row's columns (the paper's Average: NaN when a column is missing). Its CI is
    over the seeds' per-seed averages where every cell has the same seeds; else a mean, no CI
    (n: the most seeds a cell has)."""
    if not cells or any(c is None for c in cells):
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = sum(c.estimate.mean for c in cells) / len(cells)
    seeds = [set(c.values) for c in cells]
    if all(s == seeds[0] for s in seeds):
        est = mean_ci([sum(c.values[s] for c in cells) / len(cells) for s in sorted(seeds[0])])
        return dataclasses.replace(est, mean=mean)   # the same number, summed in another order
    return Estimate(mean, math.nan, math.nan, max(c.estimate.n for c in cells))   # "(no CI)" from 2 seeds


def metric_stats(engine: Engine, columns: Sequence[tuple[str, str, str]], *, agg: str = "mean",
                 sweep: str | None = None, average: bool = False) -> pd.DataFrame:
    """The cells of a metric table, long: one row per (mechanism, column) with a result (and per
    mechanism an "Average …" row with ``average``): mechanism, column, benchmark, metric, config
    (the chosen configuration, "d_k=64, num_features=128"), seeds ("0,1,2"), mean, low, high (the
    95 % CI; NaN below 2 seeds), n, decimals (how many the tables show). Percent for fractions."""
    _check_agg(agg)
    benchmarks = sorted({b for _, b, _ in columns})
    df = final_metrics(engine, benchmarks, sorted({m for _, _, m in columns}), sweep=sweep)
    if df.empty:
        raise NoResults(f"no ok trials with metrics for {', '.join(benchmarks)}")
    df = _scaled(df)
    cells: dict[str, dict[str, Cell]] = {}
    shown = []
    for label, bench, metric in columns:
        part = df[(df["benchmark"] == bench) & (df["metric"] == metric)]
        if not part.empty:
            shown.append((label, bench, metric))
            cells[label] = {k[0]: c for k, c in _cells(part, ["attention"], metric in LOWER_IS_BETTER, agg).items()}
    mechanisms = _order(df["attention"])
    rows = [_stat_row(cells[label][m], metric_decimals(metric, cells[label][m].estimate.mean),
                      mechanism=m, column=label, benchmark=bench, metric=metric)
            for m in mechanisms for label, bench, metric in shown if m in cells[label]]
    labels = [label for label, _, _ in shown]
    if average:
        units = {metric_unit(metric, bench) for _, bench, metric in shown}
        name = f"Average ({units.pop()})" if len(units) == 1 and "" not in units else "Average"
        for m in mechanisms:
            est = _average([cells[label].get(m) for label in labels])
            rows.append({"mechanism": m, "column": name, "benchmark": "", "metric": "", "config": "", "seeds": "",
                         "mean": est.mean, "low": est.low, "high": est.high, "n": est.n,
                         "decimals": 1 if units == {"%"} or name.endswith("(%)") else significant_decimals(est.mean)})
        labels.append(name)
    stats = pd.DataFrame(rows, columns=["mechanism", "column", "benchmark", "metric", "config", "seeds",
                                        "mean", "low", "high", "n", "decimals"])
    stats.attrs.update(index=["mechanism"], columns=labels, rows=mechanisms)
    return stats


def _rows_of(stats: pd.DataFrame, index: list[str]) -> dict[tuple, dict[str, pd.Series]]:
    out: dict[tuple, dict[str, pd.Series]] = {}
    for _, r in stats.iterrows():
        out.setdefault(tuple(r[i] for i in index), {})[r["column"]] = r
    return out


NO_VALUE = "—"   # an index value that was not recorded (a d_k of trials without one)


def _keys(stats: pd.DataFrame, rows: Sequence | None, by_row: dict) -> list[tuple]:
    """The table's rows: ``rows``, else the stats frame's (its ``attrs["rows"]``), as tuples."""
    rows = rows if rows is not None else stats.attrs.get("rows", by_row)
    return [k if isinstance(k, tuple) else (k,) for k in rows]


def _index(keys: list[tuple], names: list[str]) -> pd.Index:
    keys = [tuple(NO_VALUE if v is None else v for v in k) for k in keys]
    if len(names) == 1:
        return pd.Index([k[0] for k in keys], name=names[0])
    return pd.MultiIndex.from_tuples(keys, names=names)


def display_table(stats: pd.DataFrame, *, index: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                  rows: Sequence | None = None) -> pd.DataFrame:
    """A stats frame wide, as text: rows ``index`` (default the frame's), one column per
    ``columns`` label, each cell "97.2 ± 1.7 (n=3)" / "97.2 (1 seed)"; NaN where there is none."""
    index = list(index or stats.attrs["index"])
    columns = list(columns or stats.attrs["columns"])
    by_row = _rows_of(stats, index)
    keys = _keys(stats, rows, by_row)
    data = {c: [float("nan") if c not in by_row.get(k, {}) or by_row[k][c]["n"] == 0
                else _estimate(by_row[k][c]).format(int(by_row[k][c]["decimals"])) for k in keys] for c in columns}
    return pd.DataFrame(data, index=_index(keys, index), columns=columns, dtype=object)


def numbers_table(stats: pd.DataFrame, *, index: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                  rows: Sequence | None = None) -> pd.DataFrame:
    """A stats frame wide, as numbers (for CSV): per ``columns`` label the columns "<label> mean",
    "<label> ci_low", "<label> ci_high" (rounded to the cell's decimals; NaN below 2 seeds) and
    "<label> n"."""
    index = list(index or stats.attrs["index"])
    columns = list(columns or stats.attrs["columns"])
    by_row = _rows_of(stats, index)
    keys = _keys(stats, rows, by_row)
    data: dict[str, list] = {}
    for c in columns:
        ests = [None if c not in by_row.get(k, {}) or by_row[k][c]["n"] == 0
                else _estimate(by_row[k][c]).rounded(int(by_row[k][c]["decimals"])) for k in keys]
        nan = float("nan")
        data[f"{c} mean"] = [nan if e is None else e.mean for e in ests]
        data[f"{c} ci_low"] = [nan if e is None else e.low for e in ests]
        data[f"{c} ci_high"] = [nan if e is None else e.high for e in ests]
        data[f"{c} n"] = pd.array([0 if e is None else e.n for e in ests], dtype="Int64")
    return pd.DataFrame(data, index=_index(keys, index))


def metric_table(engine: Engine, columns: Sequence[tuple[str, str, str]], *, agg: str = "mean",
                 sweep: str | None = None, average: bool = False, numbers: bool = False) -> pd.DataFrame:
    """Rows: mechanisms; one column per (label, benchmark, metric) with results, optionally the
    mean over them ("Average (%)"): :func:`metric_stats` as text (``numbers``: as rounded numbers,
    :func:`numbers_table`)."""
    stats = metric_stats(engine, columns, agg=agg, sweep=sweep, average=average)
    return numbers_table(stats) if numbers else display_table(stats)


def glue_table(engine: Engine, *, agg: str = "mean", sweep: str | None = None, numbers: bool = False) -> pd.DataFrame:
    """Table 2: GLUE dev scores per mechanism (percent) and their average over all columns."""
    return metric_table(engine, GLUE_COLUMNS, agg=agg, sweep=sweep, average=True, numbers=numbers)


def lra_table(engine: Engine, *, agg: str = "mean", sweep: str | None = None, small: bool = False,
              numbers: bool = False) -> pd.DataFrame:
    """Table 3: LRA accuracy (percent) per mechanism and the average; ``small``: the CPU-size tasks."""
    return metric_table(engine, LRA_SMALL_COLUMNS if small else LRA_COLUMNS, agg=agg, sweep=sweep, average=True,
                        numbers=numbers)


def collective_table(engine: Engine, *, agg: str = "mean", sweep: str | None = None,
                     numbers: bool = False) -> pd.DataFrame:
    """Table 4: NMT BLEU (en-de, en-fr), ImageNet top-1/top-5 (percent), WikiText-103 perplexity."""
    return metric_table(engine, COLLECTIVE_COLUMNS, agg=agg, sweep=sweep, numbers=numbers)


def alpha_label(alpha: float) -> str:
    return f"{alpha * 100:g}%"


def uptrained_benchmark(engine: Engine, *, sweep: str | None = None) -> str:
    """The one benchmark with up-training trials (0 < α < 1), so ``flurka tables --table uptraining``
    needs no --benchmark after a one-benchmark sweep; several is an error naming them."""
    stmt = sa.select(Trial.benchmark).distinct().where(Trial.status == "ok", Trial.alpha > 0, Trial.alpha < 1)
    if sweep is not None:
        stmt = stmt.join(Sweep, Sweep.id == Trial.sweep_id).where(sa.or_(Sweep.external_id == sweep, Sweep.name == sweep))
    with engine.connect() as conn:
        found = sorted(conn.scalars(stmt))
    if not found:
        raise NoResults("no up-training trials (0 < alpha < 1) in the database")
    if len(found) > 1:
        raise ValueError(f"up-training trials on several benchmarks ({', '.join(found)}): pass --benchmark")
    return found[0]


@dataclasses.dataclass
class _UpRow:
    variant: str
    d_k: int | None
    kernel: Cell | None
    low_rank: Cell | None
    alphas: dict[float, Cell]

    def best_alpha(self, lower: bool) -> float:
        """The α whose cell has the best mean (the smallest such α on a tie)."""
        pick = min if lower else max
        return pick(sorted(self.alphas), key=lambda a: self.alphas[a].estimate.mean)


_NO_DK = -1   # group key of trials without a recorded d_k


def _uptraining(engine: Engine, benchmark: str, metric: str, agg: str, sweep: str | None):
    """Table 5's cells per (variant, d_k): the kernel constituent (no d_k: its best configuration),
    Linformer at that d_k, and the variant up-trained at each α; the α values, lower-is-better."""
    _check_agg(agg)
    df = final_metrics(engine, [benchmark], [metric], sweep=sweep)
    if not set(df["attention"]) & set(KERNEL_OF):
        raise NoResults(f"no ok FLuRKA trials with {metric!r} on {benchmark}")
    df = _scaled(df)
    df["dk"] = df["d_k"].fillna(_NO_DK).astype(int)
    lower = metric in LOWER_IS_BETTER
    up = df[df["attention"].isin(KERNEL_OF) & (df["alpha"] > 0) & (df["alpha"] < 1)].copy()
    if up.empty:
        raise NoResults(f"no ok up-training trials (0 < alpha < 1) of a FLuRKA variant with {metric!r} on {benchmark}")
    up["a"] = up["alpha"].round(6)
    by_alpha = _cells(up, ["attention", "dk", "a"], lower, agg)
    kernels = {k[0]: c for k, c in _cells(df[df["attention"].isin(set(KERNEL_OF.values()))], ["attention"],
                                          lower, agg).items()}
    low = {k[0]: c for k, c in _cells(df[df["attention"] == LOW_RANK], ["dk"], lower, agg).items()}
    rows = []
    for variant in _order(up["attention"]):
        for dk in sorted(up.loc[up["attention"] == variant, "dk"].unique()):
            alphas = {a: c for (v, d, a), c in sorted(by_alpha.items()) if v == variant and d == dk}
            rows.append(_UpRow(variant, None if dk == _NO_DK else int(dk), kernels.get(KERNEL_OF[variant]),
                               low.get(dk), alphas))
    return rows, sorted(up["a"].unique()), lower


def uptraining_stats(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", metric: str = "bleu",
                     agg: str = "mean", sweep: str | None = None) -> pd.DataFrame:
    """Table 5's cells, long: one row per (variant, d_k, column) with a result, the columns being
    "kernel" (the variant's kernel constituent, any d_k), "low-rank" (Linformer at that d_k) and
    each α ("12.5%", ...): variant, d_k (None where unrecorded), column, mechanism, alpha (NaN for
    the constituents), config, seeds, mean, low, high, n, decimals, best (the row's best α)."""
    rows, alphas, lower = _uptraining(engine, benchmark, metric, agg, sweep)
    out = []
    for r in rows:
        best = r.best_alpha(lower)
        parts = [("kernel", KERNEL_OF[r.variant], math.nan, r.kernel), ("low-rank", LOW_RANK, math.nan, r.low_rank),
                 *[(alpha_label(a), r.variant, a, c) for a, c in r.alphas.items()]]
        for column, mech, a, cell in parts:
            if cell is not None:
                out.append({**_stat_row(cell, metric_decimals(metric, cell.estimate.mean), variant=r.variant,
                                        d_k=r.d_k, column=column, mechanism=mech, alpha=a),
                            "best": a == best})
    stats = pd.DataFrame(out, columns=["variant", "d_k", "column", "mechanism", "alpha", "config", "seeds", "mean",
                                       "low", "high", "n", "decimals", "best"])
    stats["d_k"] = pd.Series([r["d_k"] for r in out], dtype=object)   # ints and None, not floats and NaN
    stats.attrs.update(index=["variant", "d_k"], columns=["kernel", "low-rank", *map(alpha_label, alphas)],
                       rows=[(r.variant, r.d_k) for r in rows], metric=metric, benchmark=benchmark,
                       title=_uptraining_title(benchmark, metric))
    return stats


def _uptraining_title(benchmark: str, metric: str) -> str:
    better = "lower" if metric in LOWER_IS_BETTER else "higher"
    return (f"Up-training α, {benchmark}: {metric_label(metric, benchmark)}, {better} is better; "
            f"mean ± 95 % CI over seeds (n); * the row's best α")


def uptraining_table(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", metric: str = "bleu",
                     agg: str = "mean", sweep: str | None = None, numbers: bool = False) -> pd.DataFrame:
    """Table 5: each FLuRKA variant up-trained at each α, beside its kernel and low-rank constituents.

    Rows: (variant, d_k), one per d_k the variant was up-trained at; columns "kernel constituent"
    (its name), "kernel", "low-rank" (Linformer at that d_k), then one per up-training fraction α in
    (0, 1) found in the database ("12.5%", ...), each "mean ± CI (n=…)", the row's best α marked
    "*". ``numbers``: the same as rounded numbers (:func:`numbers_table`) and a "best α" column.
    ``attrs["title"]`` names the metric, its unit and which way is better.
    """
    stats = uptraining_stats(engine, benchmark=benchmark, metric=metric, agg=agg, sweep=sweep)
    rows = stats.attrs["rows"]
    kernel = [KERNEL_OF[v] for v, _ in rows]
    best = {(r["variant"], r["d_k"]): r["column"] for _, r in stats[stats["best"]].iterrows()}
    if numbers:
        table = numbers_table(stats)
        table.insert(0, "kernel constituent", kernel)
        table["best α"] = [best.get(k) for k in rows]
    else:
        table = display_table(stats)
        for i, k in enumerate(rows):
            if k in best:
                j = table.columns.get_loc(best[k])
                table.iat[i, j] = f"{table.iat[i, j]} *"
        table.insert(0, "kernel constituent", kernel)
    table.attrs["title"] = stats.attrs["title"]
    return table


def uptraining_observations(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", metric: str = "bleu",
                            agg: str = "mean", sweep: str | None = None) -> pd.DataFrame:
    """The paper's three Table 5 observations, evaluated per (variant, d_k) row of our data.

    Columns: "kernel constituent"; "between" / "judged": how many of the row's α cells have a mean
    strictly between the kernel's and the low-rank's (judged: cells whose row has both);
    "best α" and "best mean" (the row's best α cell); "best α in [25 %, 37.5 %]" (yes/no);
    "best − kernel" and "best − low-rank": the best α cell paired against each constituent over
    the seeds both have (difference, 95 % CI, ttest_rel's p); "vs kernel" and "vs low-rank": the
    better one beyond noise, "tie" where the CI holds 0, "n<2" below two common seeds, NaN
    without the constituent; "beats both": yes only if the variant is better than both beyond
    noise; "overall best": the row holding the best α cell of the table. Lower-is-better metrics
    (loss, perplexity) are compared that way. :func:`observation_lines` says it in three lines.
    """
    rows, _, lower = _uptraining(engine, benchmark, metric, agg, sweep)
    out = []
    for r in rows:
        a = r.best_alpha(lower)
        cell = r.alphas[a]
        dec = metric_decimals(metric, cell.estimate.mean)
        judged = between = 0
        if r.kernel is not None and r.low_rank is not None:
            lo, hi = sorted((r.kernel.estimate.mean, r.low_rank.estimate.mean))
            judged = len(r.alphas)
            between = sum(lo < c.estimate.mean < hi for c in r.alphas.values())
        row = {"variant": r.variant, "d_k": NO_VALUE if r.d_k is None else r.d_k,
               "kernel constituent": KERNEL_OF[r.variant],
               "between": between, "judged": judged, "cells": len(r.alphas), "best α": alpha_label(a),
               "best mean": round(cell.estimate.mean, dec) + 0.0,
               "best α in [25 %, 37.5 %]": "yes" if PAPER_BEST_ALPHA[0] <= a <= PAPER_BEST_ALPHA[1] else "no"}
        wins = []
        for name, other, mech in (("kernel", r.kernel, KERNEL_OF[r.variant]), ("low-rank", r.low_rank, LOW_RANK)):
            if other is None:
                row[f"best − {name}"], row[f"vs {name}"] = float("nan"), float("nan")
                wins.append(False)
                continue
            p = paired(cell.values, other.values, names=(r.variant, mech))
            row[f"best − {name}"] = p.format(dec)
            row[f"vs {name}"] = p.winner(lower)
            wins.append(row[f"vs {name}"] == r.variant)
        row["beats both"] = "yes" if all(wins) else "no"
        row["_mean"] = cell.estimate.mean
        out.append(row)
    obs = pd.DataFrame(out)
    best = obs["_mean"].idxmin() if lower else obs["_mean"].idxmax()
    obs["overall best"] = obs.index == best
    obs = obs.drop(columns="_mean").set_index(["variant", "d_k"])
    obs.attrs.update(title=f"Table 5's observations, {benchmark}, {metric_label(metric, benchmark)}", floatfmt="g")
    return obs


def _row_name(variant: str, d_k) -> str:
    return variant if d_k in (None, NO_VALUE) or d_k != d_k else f"{variant} d_k={int(d_k)}"


def observation_lines(obs: pd.DataFrame) -> list[str]:
    """The three observations in a line each, from an :func:`uptraining_observations` frame."""
    judged, between = int(obs["judged"].sum()), int(obs["between"].sum())
    unjudged = int(obs["cells"].sum()) - judged
    one = f"(1) {between} of {judged} α cells lie between their constituents (kernel, low-rank)"
    if unjudged:
        one += f"; {unjudged} more in rows without both constituents, not judged"
    (variant, d_k), best = next((k, r) for k, r in obs.iterrows() if r["overall best"])
    verdicts = "; ".join(f"vs {best[f'{c} constituent'] if c == 'kernel' else LOW_RANK}: "
                         + ("no result" if not isinstance(best[f"best − {c}"], str)
                            else f"{best[f'best − {c}']} -> {best[f'vs {c}']}")
                         for c in ("kernel", "low-rank"))
    two = (f"(2) best variant beats both: {best['beats both']} ({_row_name(variant, d_k)} at α={best['best α']}, "
           f"{best['best mean']:g}; paired differences {verdicts})")
    in_range = obs["best α in [25 %, 37.5 %]"] == "yes"
    per_row = ", ".join(f"{_row_name(v, d)} {r['best α']}" for (v, d), r in obs.iterrows())
    three = (f"(3) best α in [25 %, 37.5 %]: {'yes' if in_range.all() else 'no'} "
             f"({int(in_range.sum())} of {len(obs)} rows; {per_row})")
    return [one, two, three]


def format_observations(obs: pd.DataFrame, fmt: str = "markdown") -> str:
    """The observations block: a title, the three lines (LaTeX: as comments) and the per-row table."""
    comment = "% " if fmt == "latex" else ""
    lines = [obs.attrs.get("title", "Table 5's observations") + ":", *observation_lines(obs)]
    return "\n".join(comment + line for line in lines) + "\n\n" + format_table(
        obs.drop(columns=["overall best", "cells"]), fmt)


def curves(engine: Engine, benchmark: str, names: Sequence[str], *, sweep: str | None = None) -> pd.DataFrame:
    """Training curves of ok trials, wide: one row per (trial, step), one column per curve metric."""
    stmt = _trial_filter(
        sa.select(Trial.id.label("trial_id"), Trial.attention, Trial.seed, Trial.alpha, Trial.base, Trial.d_k,
                  Trial.num_features, CurvePoint.step, CurvePoint.name, CurvePoint.value)
        .join(CurvePoint, CurvePoint.trial_id == Trial.id).where(CurvePoint.name.in_(list(names))),
        [benchmark], sweep)
    with engine.connect() as conn:
        long = pd.read_sql(stmt, conn)
    if long.empty or not set(names) <= set(long["name"]):
        return pd.DataFrame(columns=[*long.columns.drop(["name", "value"]), *names])
    keys = ["trial_id", "attention", "seed", *CONFIG, "step"]
    wide = long.pivot_table(index=keys, columns="name", values="value", dropna=False).reset_index()
    return wide.dropna(subset=list(names)).sort_values(["trial_id", "step"])


def isoflops_table(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", loss: str = "loss",
                   reference: str = "full", target_loss: float | None = None,
                   sweep: str | None = None, numbers: bool = False) -> pd.DataFrame:
    """Table 1: training FLOPs each mechanism needs to reach a target loss.

    The target is ``target_loss`` or the reference mechanism's final loss (its best configuration's
    seed mean). Per trial: the first curve point with loss <= target gives ``Loss`` and the
    cumulative ``train_flops`` there (``EFLOPs`` = 1e18 FLOPs); per mechanism the configuration
    with the fewest seed-mean FLOPs is reported; NaN where no trial reached the target.
    ``numbers``: rounded to the 4 significant digits the table shows (for CSV).
    """
    df = curves(engine, benchmark, [loss, "train_flops"], sweep=sweep)
    if df.empty:
        raise NoResults(f"no ok trials with {loss!r} and 'train_flops' curves on {benchmark}")
    if target_loss is None:
        finals = df.sort_values("step").groupby(["trial_id", "attention", "seed", *CONFIG], dropna=False).tail(1)
        ref = finals[finals["attention"] == reference]
        if ref.empty:
            raise NoResults(f"no {reference!r} trials on {benchmark} to take the target loss from")
        target_loss = float(_select(ref, ["attention"], loss, True, "mean").iloc[0])
    rows = []
    for _, trial in df.groupby("trial_id"):
        hit = trial[trial[loss] <= target_loss + 1e-12]
        first = hit.iloc[0] if not hit.empty else None
        rows.append({**trial.iloc[0][["attention", "seed", *CONFIG]].to_dict(),
                     "Loss": float("nan") if first is None else first[loss],
                     "EFLOPs": float("nan") if first is None else first["train_flops"] / 1e18})
    per_trial = pd.DataFrame(rows)
    per_config = per_trial.groupby(["attention", *CONFIG], dropna=False)[["Loss", "EFLOPs"]].mean().reset_index()
    per_config = per_config.sort_values("EFLOPs", na_position="last")
    out = per_config.groupby("attention").head(1).set_index("attention")[["Loss", "EFLOPs"]]
    out = out.reindex(pd.Index(_order(out.index), name="mechanism"))
    if numbers:
        out = out.map(lambda v: v if v != v else float(f"{v:.4g}"))
    out.attrs.update(target_loss=target_loss, floatfmt=".4g")
    return out


SPEED_FILTERS = ("device", "scope", "d_model", "heads", "d_k", "num_features", "batch", "dtype", "align",
                 "fused", "fused_projections", "fused_ffn", "pad_to", "xla")
EXECUTION = ("align", "fused", "fused_projections", "fused_ffn", "pad_to", "xla")  # from its config


def stored_configs(column: pd.Series) -> list[dict]:
    """The ``config`` column as dicts (PostgreSQL returns JSON objects, SQLite may return text)."""
    return [c if isinstance(c, dict) else json.loads(c) if isinstance(c, str) else {} for c in column]


def stored_execution(config: dict) -> dict:
    """How a speed result ran: ``align`` (aligned execution, 1 = none), ``fused`` (the Pallas
    query-side kernel), ``fused_projections`` (W_Q and W_O in it), ``fused_ffn`` (the blocks'
    residual + LayerNorm + FFN kernels), ``pad_to`` (the batch's sequence padded to a multiple of this, 1 =
    unpadded) and ``xla`` (its XLA compile options as ``name=value,...`` sorted, "" = XLA's
    defaults); results older than an option ran without it."""
    xla = [f"{k}={str(v).lower() if isinstance(v, bool) else v}"
           for k, v in (config.get("xla") or {}).items()]
    return {"align": int(config.get("align") or 1), "fused": bool(config.get("fused", False)),
            "fused_projections": bool(config.get("fused_projections", False)),
            "fused_ffn": bool(config.get("fused_ffn", False)), "pad_to": int(config.get("pad_to") or 1), "xla": xla_spelling(xla)}


def xla_spelling(options: Sequence[str]) -> str:
    """XLA options (``name=value`` each) as the tables spell them: sorted, comma-separated."""
    return ",".join(sorted(options))


def add_execution(df: pd.DataFrame, configs: list[dict]) -> None:
    """The :data:`EXECUTION` columns of ``df`` from its rows' stored configs."""
    execution = [stored_execution(c) for c in configs]
    for name in EXECUTION:
        df[name] = [e[name] for e in execution]


def read_speed(engine: Engine, *where) -> tuple[pd.DataFrame, list[dict]]:
    """Every ok or OOM speed measurement (failed ones are no data) meeting the SQL conditions
    ``where``: device, configuration columns (``N`` the sequence length), status, median, spread,
    FLOPs and run, the :data:`EXECUTION` columns, and each row's stored ``config`` (a
    ``flurka.speed`` result's other fields); the plain ``jnp`` forms ``flurka.speed.plain`` times
    beside the layers are left out. The one query behind these tables and the report."""
    stmt = (sa.select(Environment.device, SpeedMeasurement.mechanism, SpeedMeasurement.mode, SpeedMeasurement.scope,
                      SpeedMeasurement.dtype, SpeedMeasurement.batch, SpeedMeasurement.seq_len.label("N"),
                      SpeedMeasurement.d_model, SpeedMeasurement.heads, SpeedMeasurement.d_k,
                      SpeedMeasurement.num_features, SpeedMeasurement.status, SpeedMeasurement.median_s,
                      SpeedMeasurement.spread_s, SpeedMeasurement.flops, SpeedMeasurement.run,
                      SpeedMeasurement.config)
            .join(Environment, Environment.id == SpeedMeasurement.environment_id)
            .where(SpeedMeasurement.status != "error", *where))
    with engine.connect() as conn:
        df = pd.read_sql(stmt, conn)
    configs = stored_configs(df.pop("config"))
    kept = [c.get("form") != "plain" for c in configs]   # not flurka.speed.plain's baselines
    df = df.loc[pd.Series(kept, index=df.index, dtype=bool)].reset_index(drop=True)
    configs = [c for c, k in zip(configs, kept) if k]
    add_execution(df, configs)
    return df, configs


def _speed_rows(engine: Engine, filters: dict, *, modes: Sequence[str], extra: Sequence[str] = ()) -> pd.DataFrame:
    """:func:`read_speed`'s rows of ``modes`` matching ``filters`` (SPEED_FILTERS; device a
    substring), with the stored config's ``extra`` fields; :class:`NoResults` where none match."""
    unknown = set(filters) - set(SPEED_FILTERS)
    if unknown:
        raise ValueError(f"unknown speed filter {', '.join(sorted(unknown))} (valid: {', '.join(SPEED_FILTERS)})")
    where = [SpeedMeasurement.mode.in_(list(modes))]
    for name, value in filters.items():
        if value is None or name in EXECUTION:
            continue
        where.append(Environment.device.contains(value) if name == "device"
                     else getattr(SpeedMeasurement, name) == value)
    df, configs = read_speed(engine, *where)
    for name in extra:
        df[name] = [c.get(name) for c in configs]
    if filters.get("xla"):   # name=value pairs in any order, as stored_execution spells them
        filters = {**filters, "xla": xla_spelling(filters["xla"].split(","))}
    for name in EXECUTION:
        if filters.get(name) is not None:
            df = df[df[name] == filters[name]]
    if df.empty:
        raise NoResults(f"no {'/'.join(map(repr, modes))} speed measurements match {filters or 'the database'}")
    return df


def speed_measurements(engine: Engine, *, mode: str = "train", best: bool = False, runs: bool = False,
                       **filters) -> pd.DataFrame:
    """Speed rows (ok and OOM; failed measurements are no data) of one mode, filtered by any of
    SPEED_FILTERS (device matches a substring); several rows for one mechanism and N is an error.
    ``align``, ``fused``, ``fused_projections``, ``fused_ffn``, ``pad_to`` and ``xla``
    (:func:`stored_execution`) come from the stored config of a
    ``flurka.speed`` result. ``best``: of a mechanism's executions at one N, its fastest
    (:func:`fastest_execution`), the execution columns saying which. Repeated runs of a point
    are combined (:func:`combine_repeats`); ``runs``: those points' rows, one per run, instead."""
    raw = _speed_rows(engine, filters, modes=(mode,))
    point = ["device", "mechanism", "N", *[c for c in SPEED_FILTERS if c != "device"]]
    df = combine_repeats(raw, point)
    if best:
        df = fastest_execution(df)
    dup = df.duplicated(["mechanism", "N"], keep=False)
    if dup.any():
        varying = [c for c in SPEED_FILTERS if df.loc[dup, c].nunique(dropna=False) > 1
                   and not (best and c in EXECUTION)]
        detail = "; ".join(f"{c} in {sorted(map(str, df.loc[dup, c].unique()))}" for c in varying)
        raise ValueError(f"several speed measurements per mechanism and N ({detail}): filter by {', '.join(varying)}")
    return raw.merge(df[point], on=point) if runs else df


def fastest_execution(df: pd.DataFrame, key: Sequence[str] | None = None) -> pd.DataFrame:
    """Per mechanism, N and configuration (or per ``key``), the row of its fastest execution
    (:data:`EXECUTION`: aligned, fused, fused projections, fused FFN, padded, XLA options) —
    each mechanism at its best, as a user would run it (cuDNN flash cannot be aligned or fused;
    FLuRKA's best is fused and padded); OOM only where no execution fitted."""
    key = list(key or ["device", "mechanism", "N", *[c for c in SPEED_FILTERS if c not in ("device", *EXECUTION)]])
    ranked = df.assign(_oom=df["status"] != "ok").sort_values(["_oom", "median_s"], na_position="last")
    return ranked.drop_duplicates(key).drop(columns="_oom").sort_index()


def execution_label(row: pd.Series | dict) -> str:
    """How a row ran, briefly: "plain", or e.g. "align 128, fused, fused FFN, pad_to 128"."""
    parts = [f"align {row['align']}" if row["align"] > 1 else "", "fused" if row["fused"] else "",
             "fused projections" if row.get("fused_projections") else "",
             "fused FFN" if row.get("fused_ffn") else "",
             f"pad_to {row['pad_to']}" if row["pad_to"] > 1 else "", row["xla"]]
    return ", ".join(p for p in parts if p) or "plain"


# A run's own measurements of a point, which :func:`combine_repeats` takes the median of: its
# median step time, p10–p90 spread, and floor (from the ceilings that run measured).
PER_RUN = ("median_s", "spread_s", "floor_s")


def combine_repeats(df: pd.DataFrame, point: Sequence[str]) -> pd.DataFrame:
    """One row per measured point (rows equal on ``point``): repeated runs (another lease, another
    day) become the median of each of their measurements (:data:`PER_RUN`, those the frame has),
    ``runs`` says how many; a point is OOM only if no run of it fitted. The report's speed figures
    use it too. The spread stays a run's own noise, not the drift between runs: mechanisms timed
    in one run share its machine's state, so their ratio's noise is the run's (on the CPU VM of
    benchmarks/results/claims-boundary-cpu-2026-11-26 the ceilings moved 1.5× between runs
    minutes apart, interleaved ratios a median 2.4 %)."""
    if "run" in df and "run" not in point:  # a combined row is no one run's
        df = df.drop(columns="run")
    if df.empty:
        return df
    df = df.assign(_point=point_key(df, point))
    ok = df[df["status"] == "ok"]
    ok = ok.assign(**{c: pd.to_numeric(ok[c], errors="coerce") for c in PER_RUN if c in ok})
    firsts = ok.drop_duplicates("_point").copy()
    per_point = ok.groupby("_point")
    for name in (c for c in PER_RUN if c in ok):
        firsts[name] = firsts["_point"].map(per_point[name].median())
    firsts["runs"] = firsts["_point"].map(per_point.size())
    oom = df[(df["status"] != "ok") & ~df["_point"].isin(ok["_point"])].drop_duplicates("_point")
    return pd.concat([firsts, oom.assign(runs=1)], ignore_index=True).drop(columns="_point")


def point_key(df: pd.DataFrame, point: Sequence[str]) -> pd.Series:
    """Each row's values on ``point`` as one string: rows equal on ``point`` (missing values
    alike) share it."""
    if df.empty:
        return pd.Series("", index=df.index, dtype=object)
    return df[list(point)].map(str).agg("|".join, axis=1)


def paired_runs(rows: pd.DataFrame, variant: str, baseline: str, point: Sequence[str]) -> pd.DataFrame:
    """``variant``'s and ``baseline``'s ok rows side by side (the baseline's columns suffixed
    ``_b``): one row per point (equal on ``point``, key ``_key``) and run that timed both, as
    mechanisms timed in one run share its machine's state and their ratio is taken there; where
    no run timed both, one row of the runs' combined times (``paired`` False). Rows without a
    ``run`` count as one run."""
    ok = rows[(rows["status"] == "ok") & rows["mechanism"].isin([variant, baseline])]
    ok = ok.assign(run=ok["run"].fillna("") if "run" in ok else "", _key=point_key(ok, point))

    def both(df: pd.DataFrame, on: list[str]) -> pd.DataFrame:
        return df[df["mechanism"] == variant].merge(df[df["mechanism"] == baseline].drop(columns="_key"),
                                                    on=on, suffixes=("", "_b"))

    within = both(combine_repeats(ok, ["mechanism", *point, "run"]), [*point, "run"]).assign(paired=True)
    across = both(combine_repeats(ok, ["mechanism", *point]), list(point))
    return pd.concat([within, across[~across["_key"].isin(within["_key"])].assign(paired=False)],
                     ignore_index=True)


def with_ratio(pairs: pd.DataFrame) -> pd.DataFrame:
    """:func:`paired_runs`' rows with ``measured_speedup`` (baseline time / variant time) and its
    ``ratio_spread``: half the sum of the two times' p10–p90 widths over their medians, so the
    two ranges overlap, to first order, where |measured − 1| ≤ it (None where a time has none)."""
    width = (pd.to_numeric(pairs["spread_s"]) / pairs["median_s"]
             + pd.to_numeric(pairs["spread_s_b"]) / pairs["median_s_b"])
    return pairs.assign(measured_speedup=pairs["median_s_b"] / pairs["median_s"], ratio_spread=width / 2)


def measured_side(pairs: pd.DataFrame) -> pd.Series:
    """+1 where the variant was measured faster than the baseline beyond the ratio's spread, −1
    slower, 0 within it (a tie; a pair without a spread ties only at exactly 1)."""
    spread = pd.to_numeric(pairs["ratio_spread"], errors="coerce").fillna(0.0) if "ratio_spread" in pairs else 0.0
    ratio = pairs["measured_speedup"]
    return (ratio > 1 + spread).astype(int) - (ratio < 1 - spread).astype(int)


def run_medians(pairs: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Per point of :func:`paired_runs`' rows: its first row, ``columns`` the median over its
    runs, ``runs`` how many."""
    by_key = pairs.groupby("_key", sort=False)
    first = pairs.drop_duplicates("_key").set_index("_key").drop(columns=list(columns))
    return first.join(by_key[list(columns)].median()).assign(runs=by_key.size()).reset_index(drop=True)


def speed_table(engine: Engine, *, mode: str = "train", best: bool = False,
                **filters) -> pd.DataFrame:
    """Median step time in milliseconds: rows N, columns mechanisms; "OOM" where it ran out of
    memory. ``best``: each mechanism's fastest execution (:func:`fastest_execution`)."""
    df = speed_measurements(engine, mode=mode, best=best, **filters)
    df["ms"] = df["median_s"] * 1000.0
    table = df.pivot(index="N", columns="mechanism", values="ms").astype(object)
    for _, r in df[df["status"] == "oom"].iterrows():
        table.loc[r["N"], r["mechanism"]] = "OOM"
    table = table[_order(table.columns)]
    table.columns.name = None
    table.attrs["floatfmt"] = ".4g"
    return table


# The GPU targets: every layer within 2× of its floor, every FLuRKA layer within 1.5×, at the
# largest N of the sweeps they name (the N-sweep; the flash comparison's model has the 20× instead).
FLOOR_SWEEPS = ("n-sweep", "flash-compare")
LAYER_TARGET, FLURKA_LAYER_TARGET = 2.0, 1.5


def floor_target(mechanism: str, scope: str) -> float | None:
    """The × floor a layer is held to (None for a model: its target is the 20× over flash)."""
    if scope != "layer":
        return None
    return FLURKA_LAYER_TARGET if mechanism.startswith("flurka") else LAYER_TARGET


def floor_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Per mode, mechanism and execution of ``rows`` (ok measurements with ``floor_s`` and
    ``bound``): median step time, floor, the binding ceiling, × floor, the layer target and
    whether it is met."""
    order = {m: i for i, m in enumerate(_order(rows["mechanism"].unique()))}
    t = rows.assign(execution=rows.apply(execution_label, axis=1), _order=rows["mechanism"].map(order))
    t = t.sort_values(["mode", "_order", "execution"])
    ratio = t["median_s"] / t["floor_s"]
    targets = pd.Series([floor_target(m, sc) for m, sc in zip(t["mechanism"], t["scope"])], index=t.index,
                        dtype=float)
    table = pd.DataFrame({
        "mode": t["mode"], "mechanism": t["mechanism"], "execution": t["execution"],
        "ms": t["median_s"] * 1e3, "floor (ms)": t["floor_s"] * 1e3, "bound": t["bound"], "× floor": ratio,
        "target (× floor)": targets,
        "met": [None if g != g else ("yes" if r <= g else "no") for g, r in zip(targets, ratio)],
    }).set_index(["mode", "mechanism", "execution"])
    table.attrs["floatfmt"] = ".3g"
    return table


def floor_groups(rows: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """The configurations the targets are read on: ok rows of :data:`FLOOR_SWEEPS` that carry a
    floor, per (device, sweep, scope, dtype), each at its largest N."""
    have = rows[(rows["status"] == "ok") & rows["floor_s"].notna() & rows["sweep"].isin(FLOOR_SWEEPS)]
    return [(key, part[part["N"] == part["N"].max()])
            for key, part in have.groupby(["device", "sweep", "scope", "dtype"], sort=True)]


# The other GPU targets, where they are set: FLuRKA-Performer and FLuRKA-RNN faster than
# Linformer and than their kernels (the N-sweep's layer), every FLuRKA variant 20× faster than
# cuDNN flash (the flash comparison's model).
BEATS_CONSTITUENTS = ("flurka-performer", "flurka-rnn")
FLASH_TARGET = 20.0
TARGET_COLUMNS = ["target", "mode", "N", "points", "worst", "value", "range", "met"]


def _best_runs(part: pd.DataFrame) -> pd.DataFrame:
    """``part``'s rows (one per run) of each mechanism's fastest execution per mode, the runs'
    medians deciding which."""
    how = ["mechanism", "mode", *EXECUTION]
    best = fastest_execution(combine_repeats(part, how), key=["mechanism", "mode"])
    return part.merge(best[how], on=how)


def _floor_targets(best: pd.DataFrame) -> list[dict]:
    """Each mode's worst × floor of every layer (≤ 2×) and of every FLuRKA layer (≤ 1.5×)."""
    rows = []
    combined = combine_repeats(best, ["mechanism", "mode"])
    combined = combined[combined["floor_s"].notna()]
    for mode, part in combined.groupby("mode", sort=True):
        ratio = (part["median_s"] / part["floor_s"]).set_axis(part["mechanism"])
        for label, limit, of in ((f"every layer ≤ {LAYER_TARGET:g}× its floor", LAYER_TARGET, ratio),
                                 (f"every FLuRKA layer ≤ {FLURKA_LAYER_TARGET:g}× its floor", FLURKA_LAYER_TARGET,
                                  ratio[ratio.index.str.startswith("flurka")])):
            if of.empty:
                continue
            rows.append({"target": label, "mode": mode, "points": len(of), "worst": of.idxmax(),
                         "value": of.max(), "range": f"{of.min():.2f}–{of.max():.2f}",
                         "met": "yes" if of.max() <= limit else "no"})
    return rows


def _ratio_targets(best: pd.DataFrame, label: str, pairs: Sequence[tuple[str, str]],
                   limit: float | None) -> list[dict]:
    """Each mode's worst (smallest) speedup of ``pairs`` (variant, baseline), taken within runs
    (:func:`paired_runs`; "across runs" where no run timed both); met against ``limit``, or,
    where ``limit`` is None, faster beyond the spread ("yes"), slower beyond it at one pair
    ("no"), else "within spread"."""
    got = [with_ratio(paired_runs(best, v, b, ["mode"])).assign(pair=f"{v} vs {b}") for v, b in pairs]
    got = [run_medians(g, ["measured_speedup", "ratio_spread"]) for g in got if not g.empty]
    if not got:
        return []
    rows = []
    for mode, part in pd.concat(got, ignore_index=True).groupby("mode", sort=True):
        speedup, side = part["measured_speedup"], measured_side(part)
        worst = part.loc[speedup.idxmin()]
        met = (("yes" if speedup.min() >= limit else "no") if limit is not None
               else "no" if (side < 0).any() else "yes" if (side > 0).all() else "within spread")
        rows.append({"target": label, "mode": mode, "points": len(part),
                     "worst": worst["pair"] + ("" if worst["paired"] else " (across runs)"),
                     "value": speedup.min(), "range": f"{speedup.min():.2f}–{speedup.max():.2f}", "met": met})
    return rows


def targets_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Every GPU target where it is set, per device: the bf16 rows of the N-sweep's
    layer and of the flash comparison's model at each one's largest N, every mechanism at its
    fastest execution. Per target and mode: how many mechanisms or pairs were measured
    (``points``), the ``worst`` of them, its ``value`` (× floor, or speedup), the ``range`` and
    whether the target is ``met``. ``rows``: ok or OOM measurements, one per run (``run``), with
    their ``sweep`` and ``floor_s``. A target some mechanism was not measured for reads only
    those that were (``points`` says how many)."""
    have = rows[(rows["status"] == "ok") & (rows["dtype"] == "bfloat16")
                & (((rows["sweep"] == "n-sweep") & (rows["scope"] == "layer"))
                   | ((rows["sweep"] == "flash-compare") & (rows["scope"] == "model")))]
    out = []
    for (device, sweep), part in sorted(have.groupby(["device", "sweep"]),
                                        key=lambda g: (g[0][0], FLOOR_SWEEPS.index(g[0][1]))):
        part = part[part["N"] == part["N"].max()]
        best = _best_runs(part)
        if sweep == "n-sweep":
            found = _floor_targets(best) + _ratio_targets(
                best, "FLuRKA-Performer, -RNN faster than Linformer and their kernels",
                [(v, b) for v in BEATS_CONSTITUENTS for b in (LOW_RANK, KERNEL_OF[v])], None)
        else:
            found = _ratio_targets(best, f"every FLuRKA variant ≥ {FLASH_TARGET:g}× cuDNN flash",
                                   [(v, "flash") for v in KERNEL_OF], FLASH_TARGET)
        out += [{"device": device, "N": int(part["N"].iloc[0]), **r} for r in found]
    if not out:
        return pd.DataFrame(columns=["device", *TARGET_COLUMNS])
    table = pd.DataFrame(out)[["device", *TARGET_COLUMNS]]
    table.attrs["floatfmt"] = ".3g"
    return table


def targets_table(engine: Engine, **filters) -> pd.DataFrame:
    """:func:`targets_frame` of the database's measurements (``filters`` as
    :func:`speed_measurements`'; ``device`` a substring), indexed by device, target and mode."""
    df = _speed_rows(engine, filters, modes=("forward", "train"), extra=("floor_s", "sweep"))
    table = targets_frame(df)
    if table.empty:
        raise NoResults(f"no bfloat16 measurements of the N-sweep's layer or the flash comparison's model match "
                        f"{filters or 'the database'} (python -m flurka.speed --sweep n-sweep|flash-compare on a GPU)")
    return table.set_index(["device", "target", "mode"])


def floor_table(engine: Engine, **filters) -> pd.DataFrame:
    """:func:`floor_frame` of one configuration's measurements at its largest N: the N-sweep's or
    the flash comparison's (:data:`FLOOR_SWEEPS`) on one device, scope and dtype, every mode and
    execution. ``filters`` as :func:`speed_measurements`'; several configurations left is an
    error that names them."""
    df = _speed_rows(engine, filters, modes=("forward", "train"), extra=("floor_s", "bound", "sweep"))
    df = combine_repeats(df, ["device", "mechanism", "mode", "N", *[c for c in SPEED_FILTERS if c != "device"]])
    groups = floor_groups(df)
    if not groups:
        raise NoResults(f"no measurements of {' or '.join(FLOOR_SWEEPS)} with a floor match "
                        f"{filters or 'the database'} (python -m flurka.speed measures the card's ceilings "
                        f"unless --no-ceilings)")
    if len(groups) > 1:
        named = "; ".join(f"{d}, {sw}, {sc} scope, {dt}" for (d, sw, sc, dt), _ in groups)
        raise ValueError(f"several configurations have floors ({named}): filter by device, scope or dtype")
    return floor_frame(groups[0][1])


def speedup_table(engine: Engine, *, mode: str = "train", best: bool = False,
                  **filters) -> pd.DataFrame:
    """Speedup (baseline time / variant time) of each FLuRKA variant over its low-rank and kernel
    constituents, flash and full attention; rows (variant, N); NaN where either side is missing/OOM.
    ``best``: every mechanism at its fastest measured execution (:func:`fastest_execution`), each
    cell's executions in the ``executions`` column (the variant's first)."""
    runs = speed_measurements(engine, mode=mode, best=best, runs=True, **filters)
    ok = runs[runs["status"] == "ok"]
    if best:
        how = (ok.assign(e=ok.apply(execution_label, axis=1)).drop_duplicates(["N", "mechanism"])
               .pivot(index="N", columns="mechanism", values="e"))
    ratios = {}
    for variant in set(ok["mechanism"]) & set(KERNEL_OF):
        for baseline in (LOW_RANK, KERNEL_OF[variant], "flash", "full"):
            pairs = paired_runs(ok, variant, baseline, ["N"])
            pairs = run_medians(pairs.assign(ratio=pairs["median_s_b"] / pairs["median_s"]), ["ratio"])
            ratios.update({(variant, baseline, n): r for n, r in zip(pairs["N"], pairs["ratio"])})
    rows = []
    for variant in _order(set(ok["mechanism"]) & set(KERNEL_OF)):
        for n in sorted(ok.loc[ok["mechanism"] == variant, "N"].unique()):
            base = lambda m: ratios.get((variant, m, n), float("nan"))  # noqa: E731
            row = {"variant": variant, "N": n, "vs low-rank": base(LOW_RANK), "vs kernel": base(KERNEL_OF[variant]),
                   "vs flash": base("flash"), "vs full": base("full")}
            if best:
                row["executions"] = "; ".join(
                    f"{m}: {how.at[n, m]}" for m in (variant, LOW_RANK, KERNEL_OF[variant], "flash", "full")
                    if m in how.columns and isinstance(how.at[n, m], str))
            rows.append(row)
    if not rows:
        raise NoResults(f"no {mode!r} speed measurements of a FLuRKA variant")
    return pd.DataFrame(rows).set_index(["variant", "N"])


FORMATS = ("markdown", "latex", "csv")


def format_table(df: pd.DataFrame, fmt: str = "markdown", floatfmt: str | None = None) -> str:
    """Text of a table: markdown (tabulate), LaTeX (booktabs tabular) or CSV (the values as they
    are: a quality table built with ``numbers=True`` is rounded already).

    Numbers are shown with ``floatfmt``, else the table's ``attrs["floatfmt"]``, else two decimals
    as in the paper; a missing cell is "--".
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    floatfmt = floatfmt or df.attrs.get("floatfmt", ".2f")
    n_index = df.index.nlevels
    flat = df.reset_index()
    if fmt == "csv":
        return flat.to_csv(index=False)
    if fmt == "markdown":
        cells = flat.astype(object).where(flat.notna(), None)
        for col in flat.select_dtypes(include="object").columns:  # mixed (ms and "OOM"): tabulate
            cells[col] = cells[col].map(  # would print their floats unformatted
                lambda v: "--" if v is None or v != v else format(v, floatfmt)
                if isinstance(v, float) else v)
        return cells.to_markdown(index=False, floatfmt=floatfmt, missingval="--") + "\n"
    shown = flat.map(lambda v: "--" if v is None or (isinstance(v, float) and v != v)
                     else format(v, floatfmt) if isinstance(v, float) else str(v))
    return shown.to_latex(index=False, escape=True, column_format="l" * n_index + "r" * (flat.shape[1] - n_index))
