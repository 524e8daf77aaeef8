"""The paper's tables, read from the results database with SQL and shaped with pandas.

One rule fills every quality cell: among the ``status = 'ok'`` trials of a mechanism on a
benchmark, group by hyperparameter configuration (alpha, base, d_k, num_features), average each
configuration over its seeds (``agg="mean"``, the default) and report the best configuration;
``agg="best"`` reports the best single trial instead. "Best" is the maximum, except for
perplexity and loss (minimum). Fraction metrics (accuracy, f1, ...) are shown in percent, as in
the paper. Columns with no results at all are left out; a missing cell is NaN.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from flurka.results.models import CurvePoint, Environment, Metric, SpeedMeasurement, Sweep, Trial
from flurka.results.records import FRACTION_METRICS, MECHANISMS

LOWER_IS_BETTER = ("perplexity", "loss")
CONFIG = ["alpha", "base", "d_k", "num_features"]
AGGS = ("mean", "best")
KERNEL_OF = {"flurka-performer": "performer", "flurka-rnn": "rnn", "flurka-eva": "eva"}
LOW_RANK = "linformer"

# (column label, benchmark, metric): Table 2 (GLUE), Table 3 (LRA), Table 4 (collective tasks).
GLUE_COLUMNS = [
    ("CoLA (mcc)", "glue-cola", "matthews"), ("SST-2 (acc)", "glue-sst2", "accuracy"),
    ("MRPC (f1)", "glue-mrpc", "f1"), ("MRPC (acc)", "glue-mrpc", "accuracy"),
    ("STS-B (pearson)", "glue-stsb", "pearson"), ("STS-B (spearman)", "glue-stsb", "spearman"),
    ("QQP (f1)", "glue-qqp", "f1"), ("QQP (acc)", "glue-qqp", "accuracy"),
    ("MNLI-m (acc)", "glue-mnli", "accuracy"), ("MNLI-mm (acc)", "glue-mnli", "accuracy_mismatched"),
    ("QNLI (acc)", "glue-qnli", "accuracy"), ("RTE (acc)", "glue-rte", "accuracy"),
]
LRA_COLUMNS = [("ListOps", "lra-listops", "accuracy"), ("Text", "lra-text", "accuracy"),
               ("Retrieval", "lra-retrieval", "accuracy"), ("Image", "lra-image", "accuracy"),
               ("Pathfinder", "lra-pathfinder", "accuracy")]
LRA_SMALL_COLUMNS = [("ListOps", "lra-listops-small", "accuracy"), ("Image", "lra-image-small", "accuracy")]
COLLECTIVE_COLUMNS = [("En-De (BLEU)", "nmt-wmt14-ende", "bleu"), ("En-Fr (BLEU)", "nmt-wmt14-enfr", "bleu"),
                      ("ImageNet top-1", "imagenet", "accuracy"), ("ImageNet top-5", "imagenet", "top5"),
                      ("WikiText-103 (ppl)", "mlm-wikitext103", "perplexity")]


class NoResults(ValueError):
    """The database holds nothing the requested table can be built from."""


def _check_agg(agg: str) -> None:
    if agg not in AGGS:
        raise ValueError(f"agg {agg!r} is not one of {', '.join(AGGS)}")


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
    """The cell rule: per ``by`` group, best configuration's seed mean (or best single trial)."""
    if agg == "mean":
        df = df.groupby(by + CONFIG, dropna=False)[value].mean().reset_index()
    grouped = df.groupby(by)[value]
    return grouped.min() if lower_better else grouped.max()


def _scaled(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    frac = df["metric"].isin(FRACTION_METRICS)
    df.loc[frac, "value"] = df.loc[frac, "value"] * 100.0
    return df


def _order(mechanisms) -> list[str]:
    return [m for m in MECHANISMS if m in set(mechanisms)]


def metric_table(engine: Engine, columns: Sequence[tuple[str, str, str]], *, agg: str = "mean",
                 sweep: str | None = None, average: bool = False) -> pd.DataFrame:
    """Rows: mechanisms; one column per (label, benchmark, metric); optional mean over columns."""
    _check_agg(agg)
    df = final_metrics(engine, sorted({b for _, b, _ in columns}), sorted({m for _, _, m in columns}), sweep=sweep)
    if df.empty:
        raise NoResults(f"no ok trials with metrics for {', '.join(sorted({b for _, b, _ in columns}))}")
    df = _scaled(df)
    out = pd.DataFrame(index=pd.Index(_order(df["attention"]), name="mechanism"))
    for label, bench, metric in columns:
        part = df[(df["benchmark"] == bench) & (df["metric"] == metric)]
        if not part.empty:
            out[label] = _select(part, ["attention"], "value", metric in LOWER_IS_BETTER, agg)
    if average:
        out["Average"] = out.mean(axis=1, skipna=False)  # as the paper: mean of every shown column
    return out


def glue_table(engine: Engine, *, agg: str = "mean", sweep: str | None = None) -> pd.DataFrame:
    """Table 2: GLUE dev scores per mechanism (percent) and their average over all columns."""
    return metric_table(engine, GLUE_COLUMNS, agg=agg, sweep=sweep, average=True)


def lra_table(engine: Engine, *, agg: str = "mean", sweep: str | None = None, small: bool = False) -> pd.DataFrame:
    """Table 3: LRA accuracy (percent) per mechanism and the average; ``small``: the CPU-size tasks."""
    return metric_table(engine, LRA_SMALL_COLUMNS if small else LRA_COLUMNS, agg=agg, sweep=sweep, average=True)


def collective_table(engine: Engine, *, agg: str = "mean", sweep: str | None = None) -> pd.DataFrame:
    """Table 4: NMT BLEU (en-de, en-fr), ImageNet top-1/top-5 (percent), WikiText-103 perplexity."""
    return metric_table(engine, COLLECTIVE_COLUMNS, agg=agg, sweep=sweep)


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


def uptraining_table(engine: Engine, *, benchmark: str = "nmt-wmt14-ende", metric: str = "bleu",
                     agg: str = "mean", sweep: str | None = None) -> pd.DataFrame:
    """Table 5: each FLuRKA variant up-trained at each alpha, beside its kernel and low-rank constituents.

    Rows: variants (index) with their kernel constituent; columns ``kernel``, ``low-rank``, then one
    per up-training fraction alpha in (0, 1) found in the database ("12.5%", ...).
    """
    _check_agg(agg)
    df = final_metrics(engine, [benchmark], [metric], sweep=sweep)
    variants = _order(set(df["attention"]) & set(KERNEL_OF))
    if not variants:
        raise NoResults(f"no ok FLuRKA trials with {metric!r} on {benchmark}")
    df = _scaled(df)
    lower = metric in LOWER_IS_BETTER
    single = _select(df[~df["attention"].isin(KERNEL_OF)], ["attention"], "value", lower, agg)
    up = df[df["attention"].isin(variants) & (df["alpha"] > 0) & (df["alpha"] < 1)].copy()
    up["alpha"] = up["alpha"].round(6)
    by_alpha = _select(up.assign(a=up["alpha"]), ["attention", "a"], "value", lower, agg) if not up.empty else None
    out = pd.DataFrame(index=pd.Index(variants, name="variant"))
    out["kernel constituent"] = [KERNEL_OF[v] for v in variants]
    out["kernel"] = [single.get(KERNEL_OF[v], float("nan")) for v in variants]
    out["low-rank"] = single.get(LOW_RANK, float("nan"))
    for a in sorted(up["alpha"].unique()):
        out[alpha_label(a)] = [by_alpha.get((v, a), float("nan")) for v in variants]
    return out


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
                   sweep: str | None = None) -> pd.DataFrame:
    """Table 1: training FLOPs each mechanism needs to reach a target loss.

    The target is ``target_loss`` or the reference mechanism's final loss (its best configuration's
    seed mean). Per trial: the first curve point with loss <= target gives ``Loss`` and the
    cumulative ``train_flops`` there (``EFLOPs`` = 1e18 FLOPs); per mechanism the configuration
    with the fewest seed-mean FLOPs is reported; NaN where no trial reached the target.
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
    ``flurka.speed`` result's other fields). The one query behind these tables and the report."""
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
    ``align``, ``fused``, ``fused_projections``, ``fused_ffn``, ``pad_to`` and ``xla`` (:func:`stored_execution`) come from the stored config of a
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
    """Text of a table: markdown (tabulate), LaTeX (booktabs tabular) or CSV (full precision).

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
        for col in flat.columns[flat.dtypes == object]:  # mixed (e.g. ms and "OOM"): tabulate
            cells[col] = cells[col].map(  # would print their floats unformatted
                lambda v: "--" if v is None or v != v else format(v, floatfmt)
                if isinstance(v, float) else v)
        return cells.to_markdown(index=False, floatfmt=floatfmt, missingval="--") + "\n"
    shown = flat.map(lambda v: "--" if v is None or (isinstance(v, float) and v != v)
                     else format(v, floatfmt) if isinstance(v, float) else str(v))
    return shown.to_latex(index=False, escape=True, column_format="l" * n_index + "r" * (flat.shape[1] - n_index))
