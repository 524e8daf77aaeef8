"""The paper's quality tables (Tables 2-5, the iso-FLOP table), read from the results database
with SQL and shaped with pandas.

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

A column whose metric has a chance line (accuracy: the eval set's majority class, which every
classification run records as ``majority_accuracy``) gets it as the table's last row, ``chance``,
and every cell that does not clear it beyond its 95 % CI says "at chance": the LRA paper's "FAIL",
a number that measured nothing. Likewise the no-attention control (Linformer at d_k = 1,
:data:`flurka.catalogue.mechanisms.CONTROL`), where trained: its trials are no Linformer cell but the row
``no attention``, the task's floor (mean ± CI over its seeds), and a cell whose CI does not clear the floor's mean says
"at floor": whatever its attention did, the task did not need it.

The iso-FLOP table (Table 1) says beside each mechanism's FLOPs to the target how many of its seeds
get there ("2/3"), its mean ± CI being over those alone: a mean over the lucky seeds is no mean over all.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from flurka.results.models import CurvePoint, Metric, Sweep, Trial
from flurka.catalogue import metrics as metric_catalogue
from flurka.catalogue.metrics import CHANCE_OF, FRACTION_METRICS, LOWER_IS_BETTER, better, significant_decimals
from flurka.configs import char_bleu, metric_label, table_columns
from flurka.configs.base import as_dict, from_dict, upgraded
from flurka.catalogue.mechanisms import BASES, CONTROL, CONTROL_LABEL, KERNEL_OF, LOW_RANK
from flurka.results.tables import NoResults, format_table, mechanism_order
from flurka.stats import AT_CHANCE, AT_FLOOR, CHANCE_NOTE, Estimate, in_family, mean_ci, paired

CONFIG = ["alpha", "base", "d_k", "num_features"]
AGGS = ("mean", "best")
PAPER_BEST_ALPHA = (0.25, 0.375)  # Table 5's observation: the best α lies in [25 %, 37.5 %]
ONE_ALPHA = "one α"  # a row with a single α cell: which α is best is not asked

# (column label, benchmark, metric), as the benchmarks registered them (flurka.configs.register):
# Table 2 (GLUE), Table 3 (LRA; its CPU-size tasks), Table 4 (collective tasks).
GLUE_COLUMNS = table_columns("glue")
LRA_COLUMNS = table_columns("lra")
LRA_SMALL_COLUMNS = table_columns("lra-small")
COLLECTIVE_COLUMNS = table_columns("collective")
CELL_STATS = ("mean", "ci_low", "ci_high", "n")   # a cell's columns in the numeric (CSV) table
CHANCE = "chance"                                  # the row that shows the chance line of each column
FLOOR = CONTROL_LABEL                              # the row of the no-attention control (mechanisms.CONTROL)
FLOOR_NOTE = (f"{FLOOR}: the task's floor, Linformer at d_k = 1 trained like the rest (every query sees one "
              f"compressed row, the sequence's mean); {AT_FLOOR}: a cell whose 95 % CI (one seed: whose mean) does "
              "not clear the floor's mean")


def _check_agg(agg: str) -> None:
    if agg not in AGGS:
        raise ValueError(f"agg {agg!r} is not one of {', '.join(AGGS)}")


def metric_unit(metric: str, benchmark: str | None = None) -> str:
    """The unit a table shows ``metric`` in on ``benchmark`` (:func:`flurka.catalogue.metrics.unit`)."""
    return metric_catalogue.unit(metric, benchmark is not None and char_bleu(benchmark))


def _trial_filter(stmt: sa.Select, benchmarks: Sequence[str], sweep: str | None) -> sa.Select:
    stmt = stmt.join(Sweep, Sweep.id == Trial.sweep_id).where(Trial.status == "ok", Trial.benchmark.in_(list(benchmarks)))
    if sweep is not None:
        stmt = stmt.where(sa.or_(Sweep.external_id == sweep, Sweep.name == sweep))
    return stmt


class MixedSetups(ValueError):
    """Trials that one cell would average come from runs set up differently (steps, model, data...)."""


# A trial's config fields that are not its setup: a cell's own axes (the seed, α, base; the model's
# mechanism, and d_k and num_features in its attention_options) and bookkeeping (where it wrote, how
# often it logged).
NOT_SETUP = ("seed", "alpha", "base", "base_checkpoint", "workdir", "data_dir", "checkpoint_every",
             "checkpoint_steps", "keep_checkpoints", "log_every", "eval_every", "curve_batches", "prefetch", "notes")
CELL_OPTIONS = ("d_k", "num_features")


def setup_of(config: dict | str | None) -> dict | None:
    """What a trial's numbers depend on besides its cell's axes: its recorded config without
    :data:`NOT_SETUP` (and d_k, num_features). None where the trial recorded no config."""
    if isinstance(config, str):
        config = json.loads(config)
    if not isinstance(config, dict):
        return None
    try:            # either layout (flat before the model was nested), today's defaults filled in
        config = as_dict(from_dict(config))
    except (TypeError, ValueError):            # not a whole config (a hand-written record): its fields
        config = upgraded(config)
    setup = {k: v for k, v in config.items() if k not in NOT_SETUP and k != "model"}
    model = dict(config["model"]) if isinstance(config.get("model"), dict) else {}
    model.pop("attention", None)
    if isinstance(model.get("attention_options"), dict):
        model["attention_options"] = {k: v for k, v in model["attention_options"].items() if k not in CELL_OPTIONS}
    return {**setup, **{f"model.{k}": v for k, v in model.items()}}


def _differences(a: dict | None, b: dict | None) -> str:
    """"steps 8 vs 2000, d_model 64 vs 128": where two setups differ (at most 3 fields named)."""
    if a is None or b is None:
        return "one with no recorded config"
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    shown = ", ".join(f"{k} {json.dumps(a.get(k))} vs {json.dumps(b.get(k))}" for k in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def check_one_setup(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (columns benchmark, sweep, config) without its config column, after checking that on
    each benchmark every trial was set up alike: a cell averages seeds of one experiment, never
    runs of different lengths, sizes or data (sweeps pooled in one database). Raises MixedSetups,
    one line naming the fields and sweeps that differ."""
    for benchmark, part in df.groupby("benchmark", sort=True):
        setups: dict[str, tuple[dict | None, set[str]]] = {}
        for config, sweep in zip(part["config"], part["sweep"]):
            setup = setup_of(config)
            entry = setups.setdefault(json.dumps(setup, sort_keys=True, default=str), (setup, set()))
            entry[1].add(sweep)
        if len(setups) > 1:
            (a, sweeps_a), (b, sweeps_b) = list(setups.values())[:2]
            raise MixedSetups(
                f"{benchmark}: its trials come from {len(setups)} different setups ({_differences(a, b)}; sweeps "
                f"{', '.join(sorted(sweeps_a))} vs {', '.join(sorted(sweeps_b))}): a cell would average them; "
                "choose one sweep (flurka tables --sweep ID)")
    return df.drop(columns=["config"])


def final_metrics(engine: Engine, benchmarks: Sequence[str], metrics: Sequence[str], *,
                  sweep: str | None = None) -> pd.DataFrame:
    """One row per (ok trial, metric): attention, benchmark, seed, config columns, sweep (its id),
    metric, value. Raises :class:`MixedSetups` where a benchmark's trials were set up differently."""
    stmt = _trial_filter(
        sa.select(Trial.id.label("trial_id"), Trial.attention, Trial.benchmark, Trial.seed, Trial.alpha, Trial.base,
                  Trial.d_k, Trial.num_features, Sweep.external_id.label("sweep"), Trial.config,
                  Metric.name.label("metric"), Metric.value)
        .join(Metric, Metric.trial_id == Trial.id).where(Metric.name.in_(list(metrics))),
        benchmarks, sweep)
    with engine.connect() as conn:
        return check_one_setup(pd.read_sql(stmt, conn))


def recorded_metrics(engine: Engine, benchmark: str, *, sweep: str | None = None) -> list[str]:
    """The metric names the ok FLuRKA trials of ``benchmark`` record: what ``--metric`` can name."""
    stmt = _trial_filter(sa.select(Metric.name).distinct().join(Trial, Metric.trial_id == Trial.id)
                         .where(Trial.attention.in_(list(KERNEL_OF))), [benchmark], sweep)
    with engine.connect() as conn:
        return sorted(conn.scalars(stmt))


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


def _stat_row(cell: Cell | None, decimals: int, **keys) -> dict:
    est = cell.estimate if cell is not None else Estimate(math.nan, math.nan, math.nan, 0)
    return {**keys, "config": "" if cell is None else cell.config_text(), "seeds": "" if cell is None else cell.seeds,
            "mean": est.mean, "low": est.low, "high": est.high, "n": est.n, "decimals": decimals}


def _chance_row(line: float, decimals: int, **keys) -> dict:
    """A chance line's cell: its value as the mean, no interval, n = 0 (the eval set's, not seeds')."""
    return {**_stat_row(None, decimals, **keys), "mean": line, "at_chance": None, "at_floor": None}


def _is_control(df: pd.DataFrame) -> pd.Series:
    """The trials of the no-attention control (:data:`flurka.catalogue.mechanisms.CONTROL`)."""
    mechanism, d_k = CONTROL
    return (df["attention"] == mechanism) & (df["d_k"] == d_k)


def _marks(est: Estimate, chance: float | None, floor: Cell | None, lower: bool) -> dict:
    """A cell's "at chance" / "at floor" flags (None where the column has no such line)."""
    return {"at_chance": None if chance is None else not est.above(chance),
            "at_floor": None if floor is None else not est.clears(floor.estimate.mean, lower)}


def _note(chance: bool, floor: bool) -> str | None:
    """What a table's floor row and chance line mean, where it has them."""
    return ". ".join(n for n, on in ((FLOOR_NOTE, floor), (CHANCE_NOTE, chance)) if on) or None


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


def _chance_line(df: pd.DataFrame, benchmark: str, metric: str) -> float | None:
    """``metric``'s chance line on ``benchmark`` as its trials recorded it (the median of their
    records, which agree where they scored the same eval set); None where none was recorded."""
    values = df.loc[(df["benchmark"] == benchmark) & (df["metric"] == CHANCE_OF.get(metric)), "value"]
    return None if values.empty else float(values.median())


def metric_stats(engine: Engine, columns: Sequence[tuple[str, str, str]], *, agg: str = "mean",
                 sweep: str | None = None, average: bool = False) -> pd.DataFrame:
    """The cells of a metric table, long: one row per (mechanism, column) with a result (and per
    mechanism an "Average …" row with ``average``): mechanism, column, benchmark, metric, config
    (the chosen configuration, "d_k=64, num_features=128"), seeds ("0,1,2"), mean, low, high (the
    95 % CI; NaN below 2 seeds), n, decimals (how many the tables show), at_chance (None where the
    column has no chance line). Percent for fractions. Columns with a chance line add a
    :data:`CHANCE` row (its value as the mean, n = 0: a property of the eval set, not of seeds)."""
    _check_agg(agg)
    benchmarks = sorted({b for _, b, _ in columns})
    wanted = {m for _, _, m in columns}
    df = final_metrics(engine, benchmarks, sorted(wanted | {CHANCE_OF[m] for m in wanted if m in CHANCE_OF}),
                       sweep=sweep)
    if not df["metric"].isin(wanted).any():
        raise NoResults(f"no ok trials with metrics for {', '.join(benchmarks)}")
    df = _scaled(df)
    control, df = df[_is_control(df)], df[~_is_control(df)]
    cells: dict[str, dict[str, Cell]] = {}
    floors: dict[str, Cell] = {}
    shown = []
    for label, bench, metric in columns:
        part = df[(df["benchmark"] == bench) & (df["metric"] == metric)]
        lower = metric in LOWER_IS_BETTER
        floor = control[(control["benchmark"] == bench) & (control["metric"] == metric)]
        if not floor.empty:
            floors[label] = next(iter(_cells(floor, ["attention"], lower, agg).values()))
        if not part.empty or not floor.empty:
            shown.append((label, bench, metric))
            cells[label] = {k[0]: c for k, c in _cells(part, ["attention"], lower, agg).items()} if not part.empty else {}
    chance = {label: line for label, bench, metric in shown
              if (line := _chance_line(df, bench, metric)) is not None}
    mechanisms = mechanism_order(df.loc[df["metric"].isin(wanted), "attention"])
    rows = [{**_stat_row(cells[label][m], metric_catalogue.decimals(metric, cells[label][m].estimate.mean),
                         mechanism=m, column=label, benchmark=bench, metric=metric),
             **_marks(cells[label][m].estimate, chance.get(label), floors.get(label), metric in LOWER_IS_BETTER)}
            for m in mechanisms for label, bench, metric in shown if m in cells[label]]
    rows += [{**_stat_row(floors[label], metric_catalogue.decimals(metric, floors[label].estimate.mean), mechanism=FLOOR,
                          column=label, benchmark=bench, metric=metric),
              **_marks(floors[label].estimate, chance.get(label), None, metric in LOWER_IS_BETTER)}
             for label, bench, metric in shown if label in floors]
    rows += [_chance_row(chance[label], metric_catalogue.decimals(metric, chance[label]), mechanism=CHANCE, column=label,
                         benchmark=bench, metric=metric)
             for label, bench, metric in shown if label in chance]
    labels = [label for label, _, _ in shown]
    if average:
        units = {metric_unit(metric, bench) for _, bench, metric in shown}
        name = f"Average ({units.pop()})" if len(units) == 1 and "" not in units else "Average"
        decimals = lambda est: 1 if units == {"%"} or name.endswith("(%)") else significant_decimals(est.mean)  # noqa: E731
        every_floor = bool(floors) and set(floors) == set(labels)
        for m in mechanisms + ([FLOOR] if every_floor else []):
            est = _average([floors[label] if m == FLOOR else cells[label].get(m) for label in labels])
            rows.append({"mechanism": m, "column": name, "benchmark": "", "metric": "", "config": "", "seeds": "",
                         "mean": est.mean, "low": est.low, "high": est.high, "n": est.n,
                         "decimals": decimals(est), "at_chance": None, "at_floor": None})
        if chance and set(chance) == set(labels):   # every column has one: so has their average
            rows.append(_chance_row(sum(chance.values()) / len(chance), 1, mechanism=CHANCE, column=name,
                                    benchmark="", metric=""))
        labels.append(name)
    stats = pd.DataFrame(rows, columns=["mechanism", "column", "benchmark", "metric", "config", "seeds",
                                        "mean", "low", "high", "n", "decimals", "at_chance", "at_floor"])
    stats.attrs.update(index=["mechanism"], columns=labels,
                       rows=mechanisms + ([FLOOR] if floors else []) + ([CHANCE] if chance else []))
    note = _note(bool(chance), bool(floors))
    if note:
        stats.attrs["note"] = note
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


def _text(row: pd.Series | None) -> str | float:
    """One cell as text: "97.2 ± 1.7 (n=3)", "97.2 (1 seed)", "14.1 ± 2.0 (n=3), at chance", a
    chance line's bare "13.9"; NaN where there is none."""
    if row is None or (row["n"] == 0 and not math.isfinite(row["mean"])):
        return float("nan")
    digits = int(row["decimals"])
    if row["n"] == 0:
        return f"{row['mean']:.{digits}f}"
    text = _estimate(row).format(digits)
    marks = [word for word, key in ((AT_CHANCE, "at_chance"), (AT_FLOOR, "at_floor"))
             if row.get(key) == True]   # noqa: E712 (None, NaN: no line)
    return ", ".join([text, *marks])


def display_table(stats: pd.DataFrame, *, index: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                  rows: Sequence | None = None) -> pd.DataFrame:
    """A stats frame wide, as text: rows ``index`` (default the frame's), one column per
    ``columns`` label, each cell "97.2 ± 1.7 (n=3)" / "97.2 (1 seed)" (:func:`_text`); NaN where
    there is none. The frame's ``attrs["note"]`` (what the chance row means) goes with it."""
    index = list(index or stats.attrs["index"])
    columns = list(columns or stats.attrs["columns"])
    by_row = _rows_of(stats, index)
    keys = _keys(stats, rows, by_row)
    data = {c: [_text(by_row.get(k, {}).get(c)) for k in keys] for c in columns}
    out = pd.DataFrame(data, index=_index(keys, index), columns=columns, dtype=object)
    if "note" in stats.attrs:
        out.attrs["note"] = stats.attrs["note"]
    return out


def numbers_table(stats: pd.DataFrame, *, index: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                  rows: Sequence | None = None) -> pd.DataFrame:
    """A stats frame wide, as numbers (for CSV): per ``columns`` label the columns "<label> mean",
    "<label> ci_low", "<label> ci_high" (rounded to the cell's decimals; NaN below 2 seeds) and
    "<label> n" (the chance row: its value as the mean, n 0)."""
    index = list(index or stats.attrs["index"])
    columns = list(columns or stats.attrs["columns"])
    by_row = _rows_of(stats, index)
    keys = _keys(stats, rows, by_row)
    data: dict[str, list] = {}
    for c in columns:
        ests = [None if c not in by_row.get(k, {}) or not math.isfinite(by_row[k][c]["mean"])
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


def uptrained_benchmarks(engine: Engine, *, sweep: str | None = None) -> list[str]:
    """The benchmarks with ok up-training trials (0 < α < 1), sorted."""
    stmt = sa.select(Trial.benchmark).distinct().where(Trial.status == "ok", Trial.alpha > 0, Trial.alpha < 1)
    if sweep is not None:
        stmt = stmt.join(Sweep, Sweep.id == Trial.sweep_id).where(sa.or_(Sweep.external_id == sweep, Sweep.name == sweep))
    with engine.connect() as conn:
        return sorted(conn.scalars(stmt))


def uptrained_benchmark(engine: Engine, *, sweep: str | None = None) -> str:
    """The one benchmark with up-training trials (0 < α < 1), so ``flurka tables --table uptraining``
    needs no --benchmark after a one-benchmark sweep; several is an error naming them."""
    found = uptrained_benchmarks(engine, sweep=sweep)
    if not found:
        raise NoResults("no up-training trials (0 < alpha < 1) in the database")
    if len(found) > 1:
        raise ValueError(f"up-training trials on several benchmarks ({', '.join(found)}): pass --benchmark")
    return found[0]


@dataclasses.dataclass
class _UpRow:
    variant: str
    base: str                      # the up-training base: "low-rank" or "kernel" (records.BASES)
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
    """Table 5's cells per (variant, base, d_k): the kernel constituent (no d_k: its best
    configuration), Linformer at that d_k, and the variant up-trained from that base at each α;
    the α values, lower-is-better."""
    _check_agg(agg)
    df = final_metrics(engine, [benchmark], [metric], sweep=sweep)
    if not set(df["attention"]) & set(KERNEL_OF):
        names = recorded_metrics(engine, benchmark, sweep=sweep)
        raise NoResults(f"no ok FLuRKA trials with {metric!r} on {benchmark}"
                        + (f"; its FLuRKA trials record: {', '.join(names)}" if names else ""))
    df = _scaled(df)
    df["dk"] = df["d_k"].fillna(_NO_DK).astype(int)
    lower = metric in LOWER_IS_BETTER
    up = df[df["attention"].isin(KERNEL_OF) & (df["alpha"] > 0) & (df["alpha"] < 1)].copy()
    if up.empty:
        raise NoResults(f"no ok up-training trials (0 < alpha < 1) of a FLuRKA variant with {metric!r} on {benchmark}")
    up["a"] = up["alpha"].round(6)
    by_alpha = _cells(up, ["attention", "base", "dk", "a"], lower, agg)
    kernels = {k[0]: c for k, c in _cells(df[df["attention"].isin(set(KERNEL_OF.values()))], ["attention"],
                                          lower, agg).items()}
    low = {k[0]: c for k, c in _cells(df[df["attention"] == LOW_RANK], ["dk"], lower, agg).items()}
    rows = []
    for variant in mechanism_order(up["attention"]):
        mine = up[up["attention"] == variant]
        for base, dk in sorted(set(zip(mine["base"], mine["dk"])), key=lambda k: (BASES.index(k[0]), k[1])):
            alphas = {a: c for (v, b, d, a), c in sorted(by_alpha.items()) if (v, b, d) == (variant, base, dk)}
            rows.append(_UpRow(variant, base, None if dk == _NO_DK else int(dk), kernels.get(KERNEL_OF[variant]),
                               low.get(dk), alphas))
    return rows, sorted(up["a"].unique()), lower


def uptraining_stats(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", metric: str = "bleu",
                     agg: str = "mean", sweep: str | None = None) -> pd.DataFrame:
    """Table 5's cells, long: one row per (variant, base, d_k, column) with a result, the columns
    being "kernel" (the variant's kernel constituent, any d_k), "low-rank" (Linformer at that d_k)
    and each α ("12.5%", ...): variant, base (the up-training base, "low-rank" or "kernel"), d_k
    (None where unrecorded), column, mechanism, alpha (NaN for
    the constituents), config, seeds, mean, low, high, n, decimals, best (the row's best α),
    at_chance, at_floor (None without a chance line, a floor). A benchmark whose no-attention
    control was trained adds the column :data:`FLOOR` (its mean ± CI) to every row, a metric with a
    chance line the column :data:`CHANCE` (its value as the mean, n = 0)."""
    rows, alphas, lower = _uptraining(engine, benchmark, metric, agg, sweep)
    line = None
    if metric in CHANCE_OF:
        recorded = _scaled(final_metrics(engine, [benchmark], [CHANCE_OF[metric]], sweep=sweep))
        line = _chance_line(recorded, benchmark, metric)
    trials = _scaled(final_metrics(engine, [benchmark], [metric], sweep=sweep))
    control = trials[_is_control(trials)]
    floor = next(iter(_cells(control, ["attention"], lower, agg).values())) if not control.empty else None
    out = []
    for r in rows:
        best = r.best_alpha(lower)
        parts = [("kernel", KERNEL_OF[r.variant], math.nan, r.kernel), ("low-rank", LOW_RANK, math.nan, r.low_rank),
                 *[(alpha_label(a), r.variant, a, c) for a, c in r.alphas.items()]]
        keys = dict(variant=r.variant, base=r.base, d_k=r.d_k)
        for column, mech, a, cell in parts:
            if cell is not None:
                out.append({**_stat_row(cell, metric_catalogue.decimals(metric, cell.estimate.mean), **keys, column=column,
                                        mechanism=mech, alpha=a),
                            "best": a == best, **_marks(cell.estimate, line, floor, lower)})
        if floor is not None:
            out.append({**_stat_row(floor, metric_catalogue.decimals(metric, floor.estimate.mean), **keys, column=FLOOR,
                                    mechanism=CONTROL[0], alpha=math.nan),
                        "best": False, **_marks(floor.estimate, line, None, lower)})
        if line is not None:
            out.append({**_chance_row(line, metric_catalogue.decimals(metric, line), **keys, column=CHANCE, mechanism="",
                                      alpha=math.nan), "best": False})
    stats = pd.DataFrame(out, columns=["variant", "base", "d_k", "column", "mechanism", "alpha", "config", "seeds",
                                       "mean", "low", "high", "n", "decimals", "best", "at_chance", "at_floor"])
    stats["d_k"] = pd.Series([r["d_k"] for r in out], dtype=object)   # ints and None, not floats and NaN
    columns = ["kernel", "low-rank", *map(alpha_label, alphas), *([FLOOR] if floor is not None else []),
               *([CHANCE] if line is not None else [])]
    stats.attrs.update(index=["variant", "base", "d_k"], columns=columns,
                       rows=[(r.variant, r.base, r.d_k) for r in rows], metric=metric, benchmark=benchmark,
                       title=_uptraining_title(benchmark, metric))
    note = _note(line is not None, floor is not None)
    if note:
        stats.attrs["note"] = note
    return stats


def uptraining_long(engine: Engine, **kwargs) -> pd.DataFrame:
    """Table 5 in long form, for CSV and pandas: :func:`uptraining_stats`' rows with ``alpha`` a
    number column (NaN for the constituents, the floor and chance) and each estimate rounded to the
    digits its cell shows (``mean``, ``ci_low``, ``ci_high``, ``n``), not α baked into column names."""
    stats = uptraining_stats(engine, **kwargs)
    out = stats.rename(columns={"low": "ci_low", "high": "ci_high"})
    for col in ("mean", "ci_low", "ci_high"):
        out[col] = [round(v, int(d)) if v == v else v for v, d in zip(out[col], out["decimals"])]
    out = out[["variant", "base", "d_k", "column", "mechanism", "alpha", "seeds", "mean", "ci_low", "ci_high", "n",
               "best", "at_floor", "at_chance"]]
    out.attrs.update(title=stats.attrs["title"], **({"note": stats.attrs["note"]} if "note" in stats.attrs else {}))
    return out.set_index(["variant", "base", "d_k"])


def _uptraining_title(benchmark: str, metric: str) -> str:
    return (f"Up-training α, {benchmark}: {metric_label(metric, benchmark)}, {better(metric)} is better; "
            f"mean ± 95 % CI over seeds (n); * the row's best α")


def uptraining_table(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", metric: str = "bleu",
                     agg: str = "mean", sweep: str | None = None, numbers: bool = False) -> pd.DataFrame:
    """Table 5: each FLuRKA variant up-trained at each α, beside its kernel and low-rank constituents.

    Rows: (variant, base, d_k), one per base and d_k the variant was up-trained from and at (base:
    "low-rank", Linformer, or "kernel", its kernel constituent); columns "kernel constituent"
    (its name), "kernel", "low-rank" (Linformer at that d_k), then one per up-training fraction α in
    (0, 1) found in the database ("12.5%", ...), each "mean ± CI (n=…)", the row's best α marked
    "*". ``numbers``: the same as rounded numbers (:func:`numbers_table`) and a "best α" column.
    ``attrs["title"]`` names the metric, its unit and which way is better.
    """
    stats = uptraining_stats(engine, benchmark=benchmark, metric=metric, agg=agg, sweep=sweep)
    rows = stats.attrs["rows"]
    kernel = [KERNEL_OF[v] for v, _, _ in rows]
    best = {(r["variant"], r["base"], r["d_k"]): r["column"] for _, r in stats[stats["best"]].iterrows()}
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
    """The paper's three Table 5 observations, evaluated per (variant, base, d_k) row of our data.

    Columns: "kernel constituent"; "between" / "judged": how many of the row's α cells have a mean
    strictly between the kernel's and the low-rank's (judged: cells whose row has both);
    "best α" and "best mean" (the row's best α cell); "best α in [25 %, 37.5 %]" (yes/no; ONE_ALPHA
    in a row of one α cell, where "best" compares nothing);
    "best − kernel" and "best − low-rank": the best α cell paired against each constituent over
    the seeds both have (difference, 95 % CI, ttest_rel's p and its Holm-adjusted p over every test
    of the table: one family); "vs kernel" and "vs low-rank": the better one beyond noise, "tie"
    where the adjusted p is not below 0.05, "n<2" below two common seeds, NaN without the
    constituent; "beats both": yes only if the variant is better than both beyond
    noise; "overall best": the row holding the best α cell of the table. Lower-is-better metrics
    (loss, perplexity) are compared that way. :func:`observation_lines` says it in three lines.
    """
    rows, _, lower = _uptraining(engine, benchmark, metric, agg, sweep)
    out, tests = [], []
    for r in rows:
        a = r.best_alpha(lower)
        cell = r.alphas[a]
        dec = metric_catalogue.decimals(metric, cell.estimate.mean)
        judged = between = 0
        if r.kernel is not None and r.low_rank is not None:
            lo, hi = sorted((r.kernel.estimate.mean, r.low_rank.estimate.mean))
            judged = len(r.alphas)
            between = sum(lo < c.estimate.mean < hi for c in r.alphas.values())
        row = {"variant": r.variant, "base": r.base, "d_k": NO_VALUE if r.d_k is None else r.d_k,
               "kernel constituent": KERNEL_OF[r.variant],
               "between": between, "judged": judged, "cells": len(r.alphas), "best α": alpha_label(a),
               "best mean": round(cell.estimate.mean, dec) + 0.0,
               "best α in [25 %, 37.5 %]": (ONE_ALPHA if len(r.alphas) < 2 else
                                            "yes" if PAPER_BEST_ALPHA[0] <= a <= PAPER_BEST_ALPHA[1] else "no")}
        for name, other, mech in (("kernel", r.kernel, KERNEL_OF[r.variant]), ("low-rank", r.low_rank, LOW_RANK)):
            if other is not None:
                tests.append((len(out), name, dec, paired(cell.values, other.values, names=(r.variant, mech))))
        row["_mean"] = cell.estimate.mean
        out.append(row)
    # the table's paired tests are one family: Holm-adjusted p beside each raw p, verdicts on it
    family = in_family([t for *_, t in tests])
    for row in out:
        for name in ("kernel", "low-rank"):
            row[f"best − {name}"], row[f"vs {name}"] = float("nan"), float("nan")
    for (i, name, dec, _), p in zip(tests, family):
        out[i][f"best − {name}"] = p.format(dec)
        out[i][f"vs {name}"] = p.winner(lower)
    for row in out:
        wins = [row[f"vs {name}"] == row["variant"] for name in ("kernel", "low-rank")]
        row["beats both"] = "yes" if all(wins) else "no"
    obs = pd.DataFrame(out)
    best = obs["_mean"].idxmin() if lower else obs["_mean"].idxmax()
    obs["overall best"] = obs.index == best
    obs = obs.drop(columns="_mean").set_index(["variant", "base", "d_k"])
    obs.attrs.update(title=f"Table 5's observations, {benchmark}, {metric_label(metric, benchmark)}", floatfmt="g")
    return obs


def _row_name(variant: str, base: str, d_k) -> str:
    """"flurka-rnn (kernel base) d_k=8"; the base is named where it is not Linformer."""
    name = variant if base == "low-rank" else f"{variant} ({base} base)"
    return name if d_k in (None, NO_VALUE) or d_k != d_k else f"{name} d_k={int(d_k)}"


def observation_lines(obs: pd.DataFrame) -> list[str]:
    """The three observations in a line each, from an :func:`uptraining_observations` frame."""
    judged, between = int(obs["judged"].sum()), int(obs["between"].sum())
    unjudged = int(obs["cells"].sum()) - judged
    one = (f"(1) most α cells lie between their constituents (kernel, low-rank): "
           f"{'yes' if judged and 2 * between > judged else 'no'} ({between} of {judged})")
    if unjudged:
        one += f"; {unjudged} more in rows without both constituents, not judged"
    (variant, base, d_k), best = next((k, r) for k, r in obs.iterrows() if r["overall best"])
    verdicts = "; ".join(f"vs {best[f'{c} constituent'] if c == 'kernel' else LOW_RANK}: "
                         + ("no result" if not isinstance(best[f"best − {c}"], str)
                            else f"{best[f'best − {c}']} -> {best[f'vs {c}']}")
                         for c in ("kernel", "low-rank"))
    two = (f"(2) best variant beats both: {best['beats both']} ({_row_name(variant, base, d_k)} at α={best['best α']}, "
           f"{best['best mean']:g}; paired differences {verdicts})")
    verdict = obs["best α in [25 %, 37.5 %]"]
    rows = obs[verdict != ONE_ALPHA]
    in_range = verdict[rows.index] == "yes"
    per_row = ", ".join(f"{_row_name(v, b, d)} {r['best α']}" for (v, b, d), r in rows.iterrows())
    if rows.empty:
        three = "(3) best α in [25 %, 37.5 %]: not judged (one α per row: a sweep of two or more α judges it)"
    else:
        three = (f"(3) best α in [25 %, 37.5 %]: {'yes' if in_range.all() else 'no'} "
                 f"({int(in_range.sum())} of {len(rows)} rows; {per_row})")
        if len(rows) < len(obs):
            single = len(obs) - len(rows)
            three += f"; {single} row{'s' if single > 1 else ''} of one α, not judged"
    return [one, two, three]


def format_observations(obs: pd.DataFrame, fmt: str = "markdown", *, table: bool = True) -> str:
    """The observations block: a title, the three lines (LaTeX: as comments) and, with ``table``,
    the per-row table behind them (the lines alone carry the evidence of one best row)."""
    comment = "% " if fmt == "latex" else ""
    lines = [obs.attrs.get("title", "Table 5's observations") + ":", *observation_lines(obs)]
    # Markdown joins adjacent lines into one paragraph: a blank line keeps each observation its own
    text = ("\n" if fmt == "latex" else "\n\n").join(comment + line for line in lines)
    return text + "\n\n" + format_table(obs.drop(columns=["overall best", "cells"]), fmt) if table else text


def curves(engine: Engine, benchmark: str, names: Sequence[str], *, sweep: str | None = None) -> pd.DataFrame:
    """Training curves of ok trials, wide: one row per (trial, step), one column per curve metric."""
    stmt = _trial_filter(
        sa.select(Trial.id.label("trial_id"), Trial.attention, Trial.benchmark, Trial.seed, Trial.alpha, Trial.base,
                  Trial.d_k, Trial.num_features, Sweep.external_id.label("sweep"), Trial.config, CurvePoint.step,
                  CurvePoint.name, CurvePoint.value)
        .join(CurvePoint, CurvePoint.trial_id == Trial.id).where(CurvePoint.name.in_(list(names))),
        [benchmark], sweep)
    with engine.connect() as conn:
        long = check_one_setup(pd.read_sql(stmt, conn)).drop(columns=["benchmark", "sweep"])
    if long.empty or not set(names) <= set(long["name"]):
        return pd.DataFrame(columns=[*long.columns.drop(["name", "value"]), *names])
    keys = ["trial_id", "attention", "seed", *CONFIG, "step"]
    wide = long.pivot_table(index=keys, columns="name", values="value", dropna=False).reset_index()
    return wide.dropna(subset=list(names)).sort_values(["trial_id", "step"])


NOT_REACHED = "not reached"   # an iso-FLOPs cell of a mechanism none of whose seeds gets to the target
ISOFLOPS = ("EFLOPs", 1e18)     # the FLOPs column's label and its unit in FLOPs


def isoflops_stats(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", loss: str = "loss",
                   reference: str = "full", target_loss: float | None = None,
                   sweep: str | None = None) -> pd.DataFrame:
    """Table 1's cells, long: one row per mechanism, the FLOPs to target said with how many seeds got there.

    The target is ``target_loss`` or the reference mechanism's final loss (its best configuration's
    seed mean). A seed reaches it at its first curve point with loss <= target (a seed run twice:
    where a run of it does, those runs averaged). Per mechanism the configuration most of whose seeds reach it (then the
    fewest mean FLOPs) is chosen: a lucky seed of one configuration does not stand for the mechanism.
    Columns: mechanism, config, seeds (the configuration's), of (how many), reached (how many get
    there), loss (the mean loss at those first points), mean, low, high, n (FLOPs to target over
    the seeds that reach it, 95 % CI; n = reached, NaN where none). ``attrs["target_loss"]``.
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
                     "loss": math.nan if first is None else float(first[loss]),
                     "flops": math.nan if first is None else float(first["train_flops"])})
    per_trial = pd.DataFrame(rows)
    out = []
    for mechanism, part in per_trial.groupby("attention", sort=False):
        candidates = []
        for cfg, trials in part.groupby(CONFIG, dropna=False, sort=True):
            by_seed = trials.groupby("seed", dropna=False)[["loss", "flops"]].mean()
            got = by_seed.dropna(subset=["flops"])
            cell = Cell(_config(cfg), got["flops"].to_dict(), mean_ci(got["flops"].tolist()))
            candidates.append((cell, by_seed, got))
        cell, by_seed, got = min(candidates, key=lambda c: (-len(c[2]) / len(c[1]), -len(c[2]),
                                                            c[0].estimate.mean if len(c[2]) else math.inf))
        out.append({"mechanism": mechanism, "config": cell.config_text(),
                    "seeds": ",".join(str(s) for s in sorted(by_seed.index)), "of": len(by_seed),
                    "reached": len(got), "loss": float(got["loss"].mean()) if len(got) else math.nan,
                    "mean": cell.estimate.mean, "low": cell.estimate.low, "high": cell.estimate.high,
                    "n": cell.estimate.n})
    stats = pd.DataFrame(out, columns=["mechanism", "config", "seeds", "of", "reached", "loss",
                                       "mean", "low", "high", "n"])
    stats = stats.set_index("mechanism").reindex(mechanism_order(stats["mechanism"])).reset_index()
    stats.attrs.update(target_loss=target_loss, benchmark=benchmark)
    return stats


def _flops_text(est: Estimate) -> str:
    """FLOPs to target as text: 3 significant digits of the mean, the CI's half-width never shown as 0."""
    if est.n == 0:
        return NOT_REACHED
    return est.format(max(significant_decimals(est.mean), significant_decimals(est.half_width, 1)))


def isoflops_table(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", loss: str = "loss",
                   reference: str = "full", target_loss: float | None = None,
                   sweep: str | None = None, numbers: bool = False,
                   flops: tuple[str, float] = ISOFLOPS) -> pd.DataFrame:
    """Table 1: training FLOPs each mechanism needs to reach a target loss (:func:`isoflops_stats`).

    Rows: mechanisms; columns "reached" ("2/3": of the chosen configuration's seeds, those that
    get there; "0/3" and :data:`NOT_REACHED` where none does), "Loss" (the mean loss where they
    first get there) and the FLOPs, "mean ± CI (n=…)" over the seeds that get there ("1 seed" for
    one), in ``flops`` = (label, unit in FLOPs), default EFLOPs. ``numbers``: for CSV, "reached"
    and "seeds" as counts and the FLOPs as "<label> mean", "ci_low", "ci_high", to 4 significant
    digits. ``attrs``: target_loss, title.
    """
    stats = isoflops_stats(engine, benchmark=benchmark, loss=loss, reference=reference, target_loss=target_loss,
                           sweep=sweep)
    label, scale = flops
    ests = [Estimate(r.mean / scale, r.low / scale, r.high / scale, int(r.n)) for r in stats.itertuples()]
    index = pd.Index(stats["mechanism"], name="mechanism")
    if numbers:
        four = lambda v: v if v != v else float(f"{v:.4g}")  # noqa: E731
        out = pd.DataFrame({"reached": stats["reached"].to_numpy(), "seeds": stats["of"].to_numpy(),
                            "Loss": [four(v) for v in stats["loss"]],
                            f"{label} mean": [four(e.mean) for e in ests],
                            f"{label} ci_low": [four(e.low) for e in ests],
                            f"{label} ci_high": [four(e.high) for e in ests]}, index=index)
    else:
        out = pd.DataFrame({"reached": [f"{r}/{n}" for r, n in zip(stats["reached"], stats["of"])],
                            "Loss": stats["loss"].to_numpy(), label: [_flops_text(e) for e in ests]}, index=index)
    target = stats.attrs["target_loss"]
    source = f"{reference}'s final {loss}" if target_loss is None else "given"
    out.attrs.update(target_loss=target, floatfmt=".4g",
                     title=f"Training FLOPs to reach {loss} <= {target:.4g} ({source}), {benchmark}: per mechanism "
                           f"the configuration most of whose seeds get there; reached: how many of its seeds do; "
                           f"{label}: mean ± 95 % CI over those seeds")
    return out
