"""The speed tables, read from the results database: step times per mechanism and N, speedups
of each FLuRKA variant over its constituents, step time against the floor, and where the GPU
targets (``benchmarks/targets.toml``) stand per card.

Every measurement is one run's median step time with its p10–p90 spread; a point measured in
several runs is combined by :func:`combine_repeats`, and a speedup is taken within a run where
one run timed both sides (:func:`paired_runs`).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from flurka.catalogue.mechanisms import KERNEL_OF, LOW_RANK
from flurka.results.models import Environment, SpeedMeasurement
from flurka.results.tables import NoResults, mechanism_order

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
    beside the layers are left out; ``p10_s`` and ``p90_s`` from the config (NaN where a
    document gave none). The one query behind these tables and the report."""
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
    for name in ("p10_s", "p90_s"):  # where the spread (their difference) lies
        df[name] = pd.to_numeric(pd.Series([c.get(name) for c in configs], index=df.index, dtype=object),
                                 errors="coerce")
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
# median step time, its p10 and p90, p10–p90 spread, and floor (from the ceilings that run measured).
PER_RUN = ("median_s", "p10_s", "p90_s", "spread_s", "floor_s")


def combine_repeats(df: pd.DataFrame, point: Sequence[str]) -> pd.DataFrame:
    """One row per measured point (rows equal on ``point``): repeated runs (another lease, another
    day) become the median of each of their measurements (:data:`PER_RUN`, those the frame has),
    ``runs`` says how many; a point is OOM only if no run of it fitted. The report's speed figures
    use it too. The spread stays a run's own noise, not the drift between runs: mechanisms timed
    in one run share its machine's state, so their ratio's noise is the run's (a machine's speed
    can drift between runs far more than interleaved ratios do: benchmarks/results/cpu/NOTES.md)."""
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
    table = table[mechanism_order(table.columns)]
    table.columns.name = None
    table.attrs["floatfmt"] = ".4g"
    return table


# The sweeps the GPU targets are read on, each at its largest N: the N-sweep's layer (floors;
# FLuRKA against its constituents) and the flash comparison's model (FLuRKA against flash).
FLOOR_SWEEPS = ("n-sweep", "flash-compare")
TARGETS_FILE = Path(__file__).resolve().parents[3] / "benchmarks" / "targets.toml"


@dataclasses.dataclass(frozen=True)
class Targets:
    """The GPU targets (``benchmarks/targets.toml``: project status, so data rather than code)."""
    layer: float                          # every layer within this × its floor
    flurka_layer: float                   # every FLuRKA layer within this × its floor
    beats_constituents: tuple[str, ...]   # faster than Linformer and than their kernels
    beats_constituents_label: str         # that target's name in the tables
    flash: float                          # every FLuRKA variant this × faster than cuDNN flash


def gpu_targets(path: str | Path = TARGETS_FILE) -> Targets:
    """The targets of ``path`` (the repository's ``benchmarks/targets.toml`` by default)."""
    try:
        raw = tomllib.loads(Path(path).read_text())
        targets = Targets(float(raw["floor"]["layer"]), float(raw["floor"]["flurka_layer"]),
                          tuple(raw["constituents"]["faster"]), str(raw["constituents"]["label"]),
                          float(raw["flash"]["speedup"]))
    except FileNotFoundError:
        raise NoResults(f"no GPU targets file at {path} (the repository's benchmarks/ holds it)") from None
    except (KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{path}: not a GPU targets file ({type(err).__name__}: {err})") from None
    unknown = set(targets.beats_constituents) - set(KERNEL_OF)
    if unknown:
        raise ValueError(f"{path}: constituents.faster names {', '.join(sorted(unknown))}, not FLuRKA variants")
    return targets


def floor_target(mechanism: str, scope: str, targets: Targets) -> float | None:
    """The × floor a layer is held to (None for a model: its target is the one over flash)."""
    if scope != "layer":
        return None
    return targets.flurka_layer if mechanism.startswith("flurka") else targets.layer


def floor_frame(rows: pd.DataFrame, targets: Targets | None = None) -> pd.DataFrame:
    """Per mode, mechanism and execution of ``rows`` (ok measurements with ``floor_s`` and
    ``bound``): median step time, floor, the binding ceiling, × floor with its p10 and p90, the
    layer target and whether it is met. ``targets``: :func:`gpu_targets` by default."""
    targets = targets or gpu_targets()
    order = {m: i for i, m in enumerate(mechanism_order(rows["mechanism"].unique()))}
    t = rows.assign(execution=rows.apply(execution_label, axis=1), _order=rows["mechanism"].map(order))
    t = t.sort_values(["mode", "_order", "execution"])
    ratio = t["median_s"] / t["floor_s"]
    held = pd.Series([floor_target(m, sc, targets) for m, sc in zip(t["mechanism"], t["scope"])],
                     index=t.index, dtype=float)
    table = pd.DataFrame({
        "mode": t["mode"], "mechanism": t["mechanism"], "execution": t["execution"],
        "ms": t["median_s"] * 1e3, "floor (ms)": t["floor_s"] * 1e3, "bound": t["bound"], "× floor": ratio,
        **{f"{q} (× floor)": t[f"{q}_s"] / t["floor_s"] if f"{q}_s" in t else float("nan") for q in ("p10", "p90")},
        "target (× floor)": held,
        "met": [None if g != g else ("yes" if r <= g else "no") for g, r in zip(held, ratio)],
    }).set_index(["mode", "mechanism", "execution"])
    table.attrs["floatfmt"] = ".3g"
    return table


def floor_groups(rows: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """The configurations the targets are read on: ok rows of :data:`FLOOR_SWEEPS` that carry a
    floor, per (device, sweep, scope, dtype), each at its largest N."""
    have = rows[(rows["status"] == "ok") & rows["floor_s"].notna() & rows["sweep"].isin(FLOOR_SWEEPS)]
    return [(key, part[part["N"] == part["N"].max()])
            for key, part in have.groupby(["device", "sweep", "scope", "dtype"], sort=True)]


TARGET_COLUMNS = ["target", "mode", "N", "points", "worst", "value", "range", "met"]


def _best_runs(part: pd.DataFrame) -> pd.DataFrame:
    """``part``'s rows (one per run) of each mechanism's fastest execution per mode, the runs'
    medians deciding which."""
    how = ["mechanism", "mode", *EXECUTION]
    best = fastest_execution(combine_repeats(part, how), key=["mechanism", "mode"])
    return part.merge(best[how], on=how)


def _floor_targets(best: pd.DataFrame, targets: Targets) -> list[dict]:
    """Each mode's worst × floor of every layer and of every FLuRKA layer, against their targets."""
    rows = []
    combined = combine_repeats(best, ["mechanism", "mode"])
    combined = combined[combined["floor_s"].notna()]
    for mode, part in combined.groupby("mode", sort=True):
        ratio = (part["median_s"] / part["floor_s"]).set_axis(part["mechanism"])
        for label, limit, of in ((f"every layer ≤ {targets.layer:g}× its floor", targets.layer, ratio),
                                 (f"every FLuRKA layer ≤ {targets.flurka_layer:g}× its floor", targets.flurka_layer,
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


def targets_frame(rows: pd.DataFrame, targets: Targets | None = None) -> pd.DataFrame:
    """Every GPU target where it is set, per device: the bf16 rows of the N-sweep's
    layer and of the flash comparison's model at each one's largest N, every mechanism at its
    fastest execution. Per target and mode: how many mechanisms or pairs were measured
    (``points``), the ``worst`` of them, its ``value`` (× floor, or speedup), the ``range`` and
    whether the target is ``met``. ``rows``: ok or OOM measurements, one per run (``run``), with
    their ``sweep`` and ``floor_s``. A target some mechanism was not measured for reads only
    those that were (``points`` says how many). ``targets``: :func:`gpu_targets` by default."""
    targets = targets or gpu_targets()
    have = rows[(rows["status"] == "ok") & (rows["dtype"] == "bfloat16")
                & (((rows["sweep"] == "n-sweep") & (rows["scope"] == "layer"))
                   | ((rows["sweep"] == "flash-compare") & (rows["scope"] == "model")))]
    out = []
    for (device, sweep), part in sorted(have.groupby(["device", "sweep"]),
                                        key=lambda g: (g[0][0], FLOOR_SWEEPS.index(g[0][1]))):
        part = part[part["N"] == part["N"].max()]
        best = _best_runs(part)
        if sweep == "n-sweep":
            found = _floor_targets(best, targets) + _ratio_targets(
                best, targets.beats_constituents_label,
                [(v, b) for v in targets.beats_constituents for b in (LOW_RANK, KERNEL_OF[v])], None)
        else:
            found = _ratio_targets(best, f"every FLuRKA variant ≥ {targets.flash:g}× cuDNN flash",
                                   [(v, "flash") for v in KERNEL_OF], targets.flash)
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
    cell's executions in the ``executions`` column (the variant's first). ``attrs["spread"]``:
    each ratio's :func:`with_ratio` spread w, same rows and "vs" columns (the figures' bands,
    r·(1 ± w); NaN where a time has no p10–p90)."""
    runs = speed_measurements(engine, mode=mode, best=best, runs=True, **filters)
    ok = runs[runs["status"] == "ok"]
    if best:
        how = (ok.assign(e=ok.apply(execution_label, axis=1)).drop_duplicates(["N", "mechanism"])
               .pivot(index="N", columns="mechanism", values="e"))
    ratios, spreads = {}, {}
    for variant in set(ok["mechanism"]) & set(KERNEL_OF):
        for baseline in (LOW_RANK, KERNEL_OF[variant], "flash", "full"):
            pairs = with_ratio(paired_runs(ok, variant, baseline, ["N"]))
            pairs = run_medians(pairs, ["measured_speedup", "ratio_spread"])
            for n, r, w in zip(pairs["N"], pairs["measured_speedup"], pairs["ratio_spread"]):
                ratios[variant, baseline, n], spreads[variant, baseline, n] = r, w
    rows, spread_rows = [], []
    for variant in mechanism_order(set(ok["mechanism"]) & set(KERNEL_OF)):
        for n in sorted(ok.loc[ok["mechanism"] == variant, "N"].unique()):
            against = {"vs low-rank": LOW_RANK, "vs kernel": KERNEL_OF[variant], "vs flash": "flash", "vs full": "full"}
            row = {"variant": variant, "N": n, **{c: ratios.get((variant, m, n), float("nan")) for c, m in against.items()}}
            spread_rows.append({"variant": variant, "N": n,
                                **{c: spreads.get((variant, m, n), float("nan")) for c, m in against.items()}})
            if best:
                row["executions"] = "; ".join(
                    f"{m}: {how.at[n, m]}" for m in (variant, LOW_RANK, KERNEL_OF[variant], "flash", "full")
                    if m in how.columns and isinstance(how.at[n, m], str))
            rows.append(row)
    if not rows:
        raise NoResults(f"no {mode!r} speed measurements of a FLuRKA variant")
    table = pd.DataFrame(rows).set_index(["variant", "N"])
    table.attrs["spread"] = pd.DataFrame(spread_rows).set_index(["variant", "N"]).astype(float)
    return table
