"""The report's content: one :class:`Section` per paper table or figure, built from the results
database (through ``flurka.results.quality_tables`` and ``speed_tables``; theory runs through ``flurka.reports.sources``) and
the theory files.

The main job's result leads: the up-training table (each FLuRKA variant and d_k: kernel,
low-rank and every α as mean ± 95 % CI over seeds), the α figure and the paper's three
observations on it, all as ``flurka tables`` computes them (``uptraining_table``,
``uptraining_stats``, ``uptraining_observations``), the tables the sweep prints at its end
(Table 5 on the eval loss and other reported metrics, the quality table: the same builders),
then loss against training FLOPs. A section
this database cannot fill carries ``missing``, the command that fills it, and is shown as one
line. Every item's caption names the device(s) and the configuration that produced it, read
from the database rows (or the theory file).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pandas as pd
from matplotlib.figure import Figure
from sqlalchemy.engine import Engine

from flurka.configs import BENCHMARKS as CONFIGS
from flurka.configs import primary_metric
from flurka.catalogue.mechanisms import KERNEL_OF, LOW_RANK
from flurka.reports import figures as F
from flurka.reports.sources import (PROFILE_KINDS, SPEED_CONFIG, Theory, combine_runs, describe, profile_rows,
                                    speed_runs, trial_provenance, with_stored)
from flurka.results import quality_tables, speed_tables, tables
from flurka.results.records import BENCHMARKS

INGEST = "flurka ingest --db URL FILE.json"
SWEEP = "python experiments/uptrain_sweep.py --config uptrain-small --results-db URL"
SPEED = "python -m flurka.speed --sweep {} --out FILE.json && " + INGEST


def sweep_on(benchmarks) -> str:
    """The sweep command that trains every mechanism on ``benchmarks`` into the database."""
    return SWEEP.replace("--config uptrain-small", f"--benchmarks {','.join(benchmarks)}")
QUALITY_AGG = "cell = best hyperparameter configuration's mean over seeds (status ok trials only)"
SOFT = ["m", "layers", "ffn", "align"]  # may co-vary with an axis (m = d_model / heads in the d_model
# sweep; align: a sweep aligns only the mechanisms that support it). Not pad_to: a sweep pads every
# mechanism's batch alike, so padded runs are their own groups, never beside unpadded baselines.


@dataclasses.dataclass
class Table:
    key: str
    title: str
    caption: str
    df: pd.DataFrame
    provenance: str = ""   # "Device: D. Config: C": shown before the caption where it changes (render.captions)


@dataclasses.dataclass
class Plot:
    key: str
    title: str
    caption: str
    fig: Figure
    provenance: str = ""


@dataclasses.dataclass
class Section:
    key: str
    title: str
    about: str
    items: list[Table | Plot] = dataclasses.field(default_factory=list)
    missing: str | None = None  # when items is empty: the command that fills the section


# ---------------------------------------------------------------------------------------------
# Quality (Tables 1-5)
# ---------------------------------------------------------------------------------------------
def trial_caption(prov: pd.DataFrame, benchmarks) -> str:
    """"Device: D. Config: sweep 'x' (id, commit c), n ok trials" for the sweeps behind ``benchmarks``."""
    part = prov[prov["benchmark"].isin(list(benchmarks))]
    by = part.groupby(["sweep", "sweep_id", "git_commit", "device"], dropna=False)["trials"].sum()
    sweeps = "; ".join(f"sweep '{s}' ({i}{f', commit {c}' if isinstance(c, str) else ''}), {n} ok trials"
                       for (s, i, c, _), n in by.items())
    return f"Device: {', '.join(sorted(part['device'].unique()))}. Config: {sweeps}"


def _note(table: pd.DataFrame) -> str:
    """A table's note (what its chance line means) as a caption's last sentence, or nothing."""
    note = table.attrs.get("note")
    return f" {note[0].upper()}{note[1:]}." if note else ""


def _quality(key: str, title: str, about: str, build: Callable[[], pd.DataFrame], columns, prov: pd.DataFrame,
             run: str | None = None) -> Section:
    section = Section(key, title, about)
    try:
        df = build()
    except tables.NoResults:
        section.missing = run or sweep_on(dict.fromkeys(b for _, b, _ in columns))
        return section
    except quality_tables.MixedSetups as e:   # sweeps set up differently: no cell averages them
        section.missing = str(e)
        return section
    benches = [b for label, b, _ in columns if label in df.columns]
    section.items.append(Table(key, title, f"Percent for fractions; {QUALITY_AGG}.{_note(df)}", df,
                               trial_caption(prov, benches)))
    return section


NOT_REACHED = quality_tables.NOT_REACHED   # an iso-FLOPs cell of a mechanism none of whose seeds gets to the target


def isoflops_section(engine: Engine, prov: pd.DataFrame) -> Section:
    """Per benchmark with training curves: the loss-vs-FLOPs figure (:func:`flurka.reports.figures.loss_vs_flops`)
    and, where full attention was trained (its final loss is the target), Table 1 as ``flurka tables``
    builds it (:func:`flurka.results.quality_tables.isoflops_table`, in the figure's FLOP unit): how
    many seeds get there, "not reached" where none does. The section's text promises the
    FLOPs-to-target table only where it is shown."""
    section = Section("isoflops", "Loss vs training FLOPs (Table 1)",
                      "Training loss against cumulative training FLOPs: a mean curve per mechanism over its "
                      "seeds with its 95 % CI, the up-training branches in their own panels.")
    refused, shown_for, no_target = [], [], []
    for bench in [b for b in BENCHMARKS if b in set(prov["benchmark"])]:
        try:
            curves = quality_tables.curves(engine, bench, ["loss", "train_flops"])
        except quality_tables.MixedSetups as e:
            refused.append(str(e))
            continue
        if curves.empty:
            continue
        scale, unit = F.flop_unit(float(curves["train_flops"].max()))
        try:
            table = quality_tables.isoflops_table(engine, benchmark=bench,
                                                  flops=(f"training FLOPs ({unit})", scale))
        except tables.NoResults:  # no full attention to take the target from
            table, target = None, None
            no_target.append(bench)
        else:
            target = table.attrs.get("target_loss")
            shown_for.append(bench)
        caption = (f"{bench}. Bands: 95 % CI over seeds (Student t at each point). α branches drawn from their "
                   "fork (•) on, their panels' x axes from shortly before the first fork (a right-hand panel, "
                   "where there is one: from shortly before the last)."
                   + (f" Dashed grey: the target, full attention's final train loss {target:.4g}." if target is not None
                      else " No full attention trained here: no target loss."))
        provenance = trial_caption(prov, [bench])
        section.items.append(Plot(f"loss-vs-flops-{bench}", f"Loss vs training FLOPs, {bench}", caption,
                                  F.loss_vs_flops(curves, "loss", target, kind="train"), provenance))
        if table is not None:
            shown = table.rename(columns={"Loss": "train loss there"})
            shown.attrs.update(table.attrs)
            section.items.append(Table(f"isoflops-{bench}", f"Iso-FLOPs, {bench}",
                                       f"Per mechanism (its configuration most of whose seeds get there): reached, "
                                       f"how many of its seeds' curves get to {target:.4g}, full attention's final "
                                       f"train loss; the training FLOPs at each such seed's first logged point at or "
                                       f"below it, mean ± 95 % CI over those seeds (one: no CI), and the mean loss "
                                       f"at that point; {NOT_REACHED}: no seed gets there.", shown, provenance))
    if shown_for:
        section.about += (" The iso-FLOPs table: the training FLOPs each mechanism needs to reach full attention's "
                          f"final loss ({', '.join(shown_for)}).")
    if no_target:
        section.about += (f" No full attention trained on {', '.join(no_target)}: no target loss, so no "
                          "FLOPs-to-target table there.")
    return _refusals(section, refused)


def _refusals(section: Section, refused: list[str]) -> Section:
    """``section`` with the benchmarks it left out for mixed setups said: its missing line where
    nothing is left, else a sentence of its own text; the sweep command where nothing was there."""
    if not section.items:
        section.missing = "; ".join(refused) or SWEEP
    elif refused:
        section.about += " Left out: " + "; ".join(refused) + "."
    return section


# ---------------------------------------------------------------------------------------------
# Up-training (Table 5): the main job's result
# ---------------------------------------------------------------------------------------------
def observations_table(observed: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """:func:`flurka.results.quality_tables.observation_lines` of each ``uptraining_observations``
    frame in ``observed`` ({metric label: frame}) as one table: a row per (metric, observation),
    its number and what this data says on that metric."""
    rows = [(label, *line.split(" ", 1)) for label, obs in observed.items()
            for line in quality_tables.observation_lines(obs)]
    metric, number, text = zip(*rows)
    index = pd.MultiIndex.from_arrays([list(metric), list(number)], names=["metric", "observation"])
    table = pd.DataFrame({"on this data": list(text)}, index=index)
    table.attrs["html_class"] = "prose"
    return table


def observation_rows(observed: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The evidence behind :func:`observations_table`: each metric's per-row observations frame,
    stacked under a "metric" index level."""
    rows = pd.concat({label: obs.drop(columns=["overall best", "cells"]) for label, obs in observed.items()},
                     names=["metric"])
    rows.attrs.update(floatfmt="g", html_class="cells")
    return rows


def reported_metrics(bench: str) -> tuple[str, ...]:
    """The metrics a sweep's summary reports of ``bench`` (its config's ``reported_metrics``:
    BLEU and exact match for translation, else the first metric)."""
    return CONFIGS[bench].config().reported_metrics if bench in CONFIGS else (primary_metric(bench),)


def summary_columns(benches) -> list[tuple[str, str, str]]:
    """The quality table's columns as the sweep's summary builds them: per benchmark, each
    reported metric ("nmt-small: BLEU (0–100)")."""
    return [(f"{bench}: {quality_tables.metric_label(m, bench)}", bench, m) for bench in benches
            for m in reported_metrics(bench)]


SUMMARY_TITLE = "Quality (mean ± 95 % CI over seeds, n)"   # the sweep summary's title for its quality table


def _one_alpha_only(cells: pd.DataFrame) -> bool:
    """Whether every row of an ``uptraining_stats`` frame has a single α (then no best α is starred)."""
    ups = cells[cells["alpha"].notna()]
    by = [c for c in ("variant", "base", "d_k") if c in ups]
    return ups.empty or int(ups.groupby(by, dropna=False)["alpha"].nunique().max()) <= 1


def uptraining_section(engine: Engine, prov: pd.DataFrame) -> Section:
    """Table 5 (``flurka.results.quality_tables.uptraining_table``), its α figure (drawn from
    ``uptraining_stats``), Table 5 on each other reported metric, and the paper's three observations
    (``uptraining_observations`` and ``observation_lines``) on every reported metric, not the first
    alone (a variant may win on BLEU and tie on exact match), per benchmark with up-trained FLuRKA:
    what ``flurka tables`` says. Then the rest the sweep prints at its end
    (``flurka.sweeps.runner.summary``), from the same builders: Table 5 on the eval loss and the
    quality table (``metric_table`` over those benchmarks' reported metrics)."""
    section = Section("uptraining", "Up-training α (Table 5): the main job's result",
                      "Each FLuRKA variant up-trained from its base model (the row's base: Linformer, or its kernel "
                      "constituent) for a fraction α of the steps, "
                      "beside its kernel and low-rank constituents trained from scratch: every cell the mean "
                      "over seeds ± its 95 % CI (n seeds); in a row of several α, the best starred. Then the "
                      "same table on the eval loss (and on every other metric the sweep reports), and the quality "
                      "table the sweep prints at its end.")
    refused, benches = [], []
    for bench in [b for b in BENCHMARKS if b in set(prov["benchmark"])]:
        metric = primary_metric(bench)
        try:
            cells = quality_tables.uptraining_stats(engine, benchmark=bench, metric=metric)
        except tables.NoResults:
            continue  # FLuRKA trained only from scratch here (or not at all): no α to show
        except quality_tables.MixedSetups as e:
            refused.append(str(e))
            continue
        benches.append(bench)
        table = quality_tables.uptraining_table(engine, benchmark=bench, metric=metric)
        table.attrs["html_class"] = "cells"  # "mean ± CI (n)" cells, not wrapped
        label = quality_tables.metric_label(metric, bench)
        # the paper's observations on every metric the benchmark reports, each its own family of tests
        observed = {label: quality_tables.uptraining_observations(engine, benchmark=bench, metric=metric)}
        provenance = trial_caption(prov, [bench])
        caption = (f"{table.attrs['title']}. Cell: the best hyperparameter "
                   f"configuration's mean over seeds ± its 95 % CI (Student's t below 10 seeds, a bootstrap from "
                   f"10; one seed: no CI), status ok trials only; kernel: the variant's kernel constituent, "
                   f"low-rank: Linformer at the row's d_k, both from scratch.{_note(table)}")
        section.items.append(Table(f"uptraining-{bench}", f"Up-training α, {bench}: {label}", caption, table, provenance))
        # the items below show what the table above does: their captions say only what is new
        star = "" if _one_alpha_only(cells) else "; the star: the row's best α"
        section.items.append(Plot(f"uptraining-{bench}-fig", f"{label} vs α, {bench}", "The table above, drawn: "
                                  f"a line per row; bands: 95 % CI over seeds{star}.",
                                  F.uptraining(cells, label), provenance))
        def more_table(other: str) -> bool:
            """Table 5 on ``other`` appended; False where these trials did not record it (the
            sweep's summary leaves it out too)."""
            try:
                more = quality_tables.uptraining_table(engine, benchmark=bench, metric=other)
            except tables.NoResults:
                return False
            more.attrs["html_class"] = "cells"
            name = quality_tables.metric_label(other, bench)
            section.items.append(Table(f"uptraining-{bench}-{other.replace('_', '-')}",
                                       f"Up-training α, {bench}: {name}",
                                       f"{more.attrs['title']}. Cells as in the first table of this section.",
                                       more, provenance))
            return True

        for other in [m for m in reported_metrics(bench) if m != metric]:
            if more_table(other):
                observed[quality_tables.metric_label(other, bench)] = quality_tables.uptraining_observations(
                    engine, benchmark=bench, metric=other)
        about = (" (1) counts the α cells whose mean lies strictly between their row's kernel and low-rank means "
                 "(judged: rows with both); (2) takes the table's best α cell and pairs it against each "
                 "constituent over the seeds both have (difference ± 95 % CI (n), ttest_rel's p and its Holm "
                 "adjustment over that metric's tests; the better one where the adjusted p is below 0.05, else "
                 "a tie); (3) asks whether every row's best α lies in [25 %, 37.5 %]."
                 + (" Each metric the benchmark reports is judged on its own, its tests one family."
                    if len(observed) > 1 else ""))
        section.items.append(Table(f"uptraining-{bench}-observations", f"The paper's observations on {bench}",
                                   about.strip(), observations_table(observed), provenance))
        section.items.append(Table(f"uptraining-{bench}-observations-rows",
                                   f"The paper's observations on {bench}, per row", "The evidence behind "
                                   "each observation, row by row.", observation_rows(observed), provenance))
        more_table("loss")
    if benches:
        try:
            quality = quality_tables.metric_table(engine, summary_columns(benches))
        except tables.NoResults:
            quality = None
        if quality is not None:
            quality.attrs["html_class"] = "cells"
            section.items.append(Table("uptraining-quality",
                                       f"{quality.attrs.get('title', SUMMARY_TITLE)}: {', '.join(benches)}",
                                       f"Every mechanism trained on {', '.join(benches)} (each at its best "
                                       f"configuration: α, d_k), on "
                                       f"each metric the sweep reports, as the sweep prints it at its end. "
                                       f"Percent for fractions; {QUALITY_AGG}.{_note(quality)}", quality,
                                       trial_caption(prov, benches)))
    return _refusals(section, refused)


def quality_sections(engine: Engine, prov: pd.DataFrame) -> list[Section]:
    return [
        _quality("glue", "GLUE (Table 2)", "GLUE dev scores and their average over all columns.",
                 lambda: quality_tables.glue_table(engine), quality_tables.GLUE_COLUMNS, prov),
        _quality("lra", "Long Range Arena (Table 3)", "LRA accuracy and its average.",
                 lambda: quality_tables.lra_table(engine), quality_tables.LRA_COLUMNS, prov),
        _quality("lra-small", "Long Range Arena, CPU-size tasks", "ListOps and Image at laptop size.",
                 lambda: quality_tables.lra_table(engine, small=True), quality_tables.LRA_SMALL_COLUMNS, prov),
        _quality("collective", "Translation, ImageNet, masked LM (Table 4)",
                 "WMT14 BLEU, ImageNet top-1/top-5 and WikiText-103 perplexity.",
                 lambda: quality_tables.collective_table(engine), quality_tables.COLLECTIVE_COLUMNS, prov),
    ]


# ---------------------------------------------------------------------------------------------
# Speed (Fig. 3, Fig. 5, appendix C)
# ---------------------------------------------------------------------------------------------
def _fixed(df: pd.DataFrame, columns) -> list[str]:
    return [c for c in columns if c in df and df[c].nunique(dropna=False) == 1]


def speed_groups(rows: pd.DataFrame, axis: str) -> list[pd.DataFrame]:
    """Sets of measurements that sweep ``axis`` (≥ 2 values) with everything else fixed, mode and
    scope being panels; m, layers and ffn may co-vary unless that makes a point ambiguous."""
    point = ["mechanism", "mode", "scope", axis]
    key = [c for c in SPEED_CONFIG if c not in (axis, "mode", "scope", *SOFT)]
    out = []
    for _, g in rows.groupby(key, dropna=False, sort=True):
        parts = [g] if not g.duplicated(point).any() else [s for _, s in g.groupby(SOFT, dropna=False)]
        out += [p for p in parts if p[axis].nunique() >= 2 and not p.duplicated(point).any()]
    return out


def speed_caption(g: pd.DataFrame, axis: str) -> str:
    first = g.iloc[0]
    fixed = [c for c in _fixed(g, SPEED_CONFIG) if c not in ("device", axis)]
    varying = [c for c in SPEED_CONFIG if c not in fixed and c not in ("device", axis, "mode", "scope")
               and g[c].notna().any()]
    sweeps = sorted({s for s in g["sweep"].dropna()})
    text = f"Device: {first['device']}. Config: {describe(first, fixed)}"
    text += "".join(f"; {c} ∈ {{{', '.join(str(int(v)) for v in sorted(g[c].dropna().unique()))}}}" for c in varying)
    text += f"; {axis} from {int(g[axis].min())} to {int(g[axis].max())}"
    return text + (f". Speed sweep: {', '.join(sweeps)}." if sweeps else ".") + timing_note(g)


def timing_note(g: pd.DataFrame) -> str:
    """How the points were timed (:mod:`flurka.speed.timing`): samples of back-to-back calls, or,
    in runs before 2026-11-29 (no ``calls_per_sample``), one blocked call a sample, whose ~50 µs
    of dispatch and sync sits in every point — a few percent of one under ~2 ms."""
    calls = pd.to_numeric(g.loc[g["status"] == "ok", "calls_per_sample"], errors="coerce")
    new, old = calls.dropna().astype(int), int(calls.isna().sum())
    parts = []
    if len(new):
        span = f"{new.min()}" if new.min() == new.max() else f"{new.min()}–{new.max()}"
        parts.append(f"samples of {span} back-to-back calls")
    if old:
        parts.append("one blocked call a sample, dispatch included"
                     + (f" ({old} of {len(calls)} points)" if len(new) else ""))
    return f" Timing: {'; '.join(parts)}." if parts else ""


def _pivot_ms(part: pd.DataFrame, axis: str) -> pd.DataFrame:
    """Median step time (ms) per mechanism against ``axis``; "OOM" where it ran out of memory."""
    table = (part.assign(ms=part["median_s"] * 1e3).pivot(index=axis, columns="mechanism", values="ms")
             .sort_index().astype(object))
    for _, r in part[part["status"] == "oom"].iterrows():
        table.loc[r[axis], r["mechanism"]] = "OOM"
    table = table[F._ordered(table.columns)]
    table.columns.name = None
    table.attrs["floatfmt"] = ".4g"
    return table


# A configuration's fixed part: report column -> the speed tables' filter (beside mode).
_CONFIG_FILTERS = {"device": "device", "scope": "scope", "d_model": "d_model", "heads": "heads",
                   "d_k": "d_k", "m": "num_features", "batch": "batch", "dtype": "dtype"}


def _filters(part: pd.DataFrame) -> dict:
    """``flurka.results.speed_tables`` speed filters that pin this panel's configuration."""
    first = part.iloc[0]
    # the panel's own runs, not their aligned/fused/padded twins
    names = {**_CONFIG_FILTERS, **{c: c for c in speed_tables.EXECUTION}}
    plain = lambda v: int(v) if isinstance(v, float) else v.item() if hasattr(v, "item") else v  # noqa: E731
    return {f: plain(first[c]) for c, f in names.items() if c in _fixed(part, [c]) and pd.notna(first[c])}


def _panels(g: pd.DataFrame):
    return list(g.groupby(["mode", "scope"], dropna=False, sort=True))


def _claim_bound(g: pd.DataFrame) -> float | None:
    """Claims 1 and 3's N = d_k(H+2) where the group fixes d_k, heads and d_model and d_model > d_k."""
    from flurka.theory import cost_model  # pure Python; the package brings JAX

    if any(g[c].nunique(dropna=False) != 1 for c in ("d_k", "heads", "d_model")) or pd.isna(g["d_k"].iloc[0]):
        return None
    first = g.iloc[0]
    return cost_model.claim_bounds(float(first["d_model"]), float(first["d_k"]), float(first["heads"]))["kernel"]


def speed_vs_n_section(engine: Engine, rows: pd.DataFrame) -> tuple[Section, Section]:
    speed = Section("speed-n", "Step time vs sequence length (Fig. 3)",
                    "Median step time of every mechanism as N grows, all at equal parameter count.")
    ups = Section("speedups", "Speedups over constituents and flash attention (Fig. 5, appendix C)",
                  "Each FLuRKA variant's time divided into its low-rank and kernel constituents', flash "
                  "attention's and full attention's at the same configuration; above 1 FLuRKA is faster.")
    for i, g in enumerate(speed_groups(rows, "N")):
        caption = speed_caption(g, "N")
        speed.items.append(Plot(f"speed-n-{i}", f"Step time vs N ({g.iloc[0]['device']})", caption,
                                F.speed_vs_axis(g, "N")))
        panels = {}
        for (mode, scope), part in _panels(g):
            try:
                table = speed_tables.speed_table(engine, mode=mode, **_filters(part))
            except tables.NoResults:
                raise  # the panel's own rows are in the database: a filter is wrong
            except ValueError:  # the library's filters cannot pin this panel (e.g. two model depths)
                table = _pivot_ms(part, "N")
            speed.items.append(Table(f"speed-n-{i}-{mode}-{scope}", f"Step time (ms), {mode}, {scope} scope",
                                     caption, table))
            try:
                panels[f"{mode}, {scope} scope"] = speed_tables.speedup_table(engine, mode=mode, **_filters(part))
            except tables.NoResults:  # no FLuRKA variant in this panel
                continue
            except ValueError:  # the library's filters cannot pin this panel
                continue
        for title, table in panels.items():
            mode, scope = title.split(", ")[0], title.split(", ")[1].split()[0]
            ups.items.append(Table(f"speedups-{i}-{mode}-{scope}", f"Speedups, {title}", caption, table))
        if panels:
            ups.items.append(Plot(f"speedups-{i}", f"Speedups vs N ({g.iloc[0]['device']})", caption,
                                  F.speedups(panels, claim_bound=_claim_bound(g))))
    ups.items += best_execution_tables(engine, rows)
    if not speed.items:
        speed.missing = SPEED.format("n-sweep")
    if not ups.items:
        ups.missing = ("python -m flurka.speed --sweep n-sweep --out n.json && python -m flurka.speed --sweep "
                       "flash-compare --out flash.json && flurka ingest --db URL n.json flash.json")
    return speed, ups


def best_execution_tables(engine: Engine, rows: pd.DataFrame) -> list[Table]:
    """Where a configuration ran in more than one execution (aligned, fused, padded, XLA
    options), its speedups with every mechanism at its fastest one (``speedup_table(best=True)``):
    FLuRKA fused and padded against flash as cuDNN runs it — the comparison the other tables,
    one execution each, cannot show."""
    out = []
    for (mode, *_), part in rows.groupby(["mode", *_CONFIG_FILTERS], dropna=False, sort=True):
        if (part.apply(speed_tables.execution_label, axis=1) == "plain").all() \
                or not part["mechanism"].isin(list(KERNEL_OF)).any():
            continue
        filters = {f: v for f, v in _filters(part).items() if f not in speed_tables.EXECUTION}
        try:
            table = speed_tables.speedup_table(engine, mode=mode, best=True, **filters)
        except ValueError:  # NoResults (no FLuRKA variant ran ok) or filters that cannot pin it
            continue
        first, config = part.iloc[0], [c for c in _CONFIG_FILTERS if c != "device"]
        caption = (f"Device: {first['device']}. Config: {describe(first, config)}; "
                   "each mechanism at its fastest measured execution (the executions column says which).")
        out.append(Table(f"speedups-best-{len(out)}", f"Speedups, {mode}, {first['scope']} scope, "
                         "each mechanism at its fastest execution", caption, table))
    return out


def speed_vs_section(rows: pd.DataFrame, axis: str) -> Section:
    """Fig. 5: speedup over full attention (step time where full is absent) against d_k or d_model."""
    name = {"d_k": "downsampling factor d_k", "d_model": "hidden dimension d_model"}[axis]
    section = Section(f"speed-{axis.replace('_', '')}", f"Speed vs {name} (Fig. 5)",
                      f"Runtime as {axis} grows, normalized to speedups over full attention where it was measured.")
    for i, g in enumerate(speed_groups(rows, axis)):
        caption = speed_caption(g, axis)
        full = all(((p["mechanism"] == "full") & (p["status"] == "ok")).any() for _, p in _panels(g))
        over = "full" if full and g["mechanism"].nunique() > 1 else None
        what = "Speedup over full attention" if over else "Step time"
        section.items.append(Plot(f"{section.key}-{i}", f"{what} vs {axis} ({g.iloc[0]['device']})", caption,
                                  F.speed_vs_axis(g, axis, speedup_over=over)))
        for (mode, scope), part in _panels(g):
            section.items.append(Table(f"{section.key}-{i}-{mode}-{scope}",
                                       f"Step time (ms) vs {axis}, {mode}, {scope} scope", caption,
                                       _pivot_ms(part, axis)))
    if not section.items:
        section.missing = SPEED.format({"d_k": "dk-sweep", "d_model": "dmodel-sweep"}[axis])
    return section


def floor_section(runs: pd.DataFrame) -> Section:
    """The GPU targets, where each stands per card (``targets``), then every measurement at the
    targets' N against its floor; ``runs``: :func:`speed_runs`' rows."""
    goals = speed_tables.gpu_targets()
    section = Section("floor", "Step time against the floor (GPU targets)",
                      "Each measurement's median step time over its floor: the larger of the FLOP model's FLOPs "
                      "at the card's measured bf16 matrix rate and the fewest bytes the step must move at its "
                      "measured copy bandwidth (flurka.speed.ceilings, measured in the same run). At the largest "
                      f"N of the sweeps the targets name: every layer within {goals.layer:g}× of its floor, "
                      f"every FLuRKA layer within {goals.flurka_layer:g}× (flurka tables --table floor).")
    targets = speed_tables.targets_frame(runs, goals)
    if not targets.empty:
        caption = ("Each GPU target where it is set: the N-sweep's layer (floors; FLuRKA against Linformer and "
                   "its kernel) and the flash comparison's 6-layer model (FLuRKA against cuDNN flash) at their "
                   "largest N, bf16, every mechanism at its fastest measured execution. "
                   "worst: the mechanism (× floor) or pair (speedup) furthest from the target, value its "
                   "number, range all of them, points how many were measured. Speedups are ratios within a "
                   "run; 'within spread' where the worst is faster but inside its two times' p10–p90 spread "
                   "(flurka tables --table targets).")
        section.items.append(Table("targets", "The GPU targets, per card", caption,
                                   targets.set_index(["device", "target", "mode"])))
    rows = combine_runs(runs)
    for i, ((device, sweep, scope, dtype), part) in enumerate(speed_tables.floor_groups(rows)):
        first = part.iloc[0]
        fixed = [c for c in _fixed(part, SPEED_CONFIG) if c not in ("device", "mode", *speed_tables.EXECUTION)]
        caption = (f"Device: {device}. Config: {describe(first, fixed)}. Speed sweep: {sweep}; one row per "
                   f"execution measured (plain, aligned, padded, fused).")
        title = f"Step time against the floor, {sweep} at N = {int(first['N'])} ({device}, {dtype})"
        table = speed_tables.floor_frame(part, goals)
        section.items.append(Table(f"floor-{i}", title, caption, table))
        section.items.append(Plot(f"floor-{i}-fig", title, caption, F.floor_ratios(table)))
    if not section.items:
        section.missing = SPEED.format("n-sweep")  # on a GPU: the title says so
    return section


def flop_pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """FLuRKA vs each constituent, flash and full at the same configuration: the FLOP model's
    predicted speedup (baseline FLOPs / FLuRKA FLOPs), the measured one (time ratio) and that
    ratio's spread (:func:`flurka.results.speed_tables.with_ratio`).

    Where ``rows`` name their run (:func:`speed_runs`), a ratio is taken within each run that
    timed both mechanisms, as they shared its machine's state, and a point's runs combine to the
    median ratio and spread (``runs`` counts them); a point whose two mechanisms no run timed
    together pairs the runs' combined times (``paired`` False). Rows without runs are one run."""
    ok = rows[(rows["status"] == "ok") & rows["flops"].notna()]
    cfg = [c for c in SPEED_CONFIG if c in ok]
    columns = [*cfg, "mechanism", "baseline", "predicted_speedup", "measured_speedup", "ratio_spread", "runs", "paired"]
    out = []
    for variant, kernel in KERNEL_OF.items():
        for baseline in (LOW_RANK, kernel, "flash", "full"):
            pair = speed_tables.paired_runs(ok, variant, baseline, cfg)
            if pair.empty:
                continue
            pair = speed_tables.with_ratio(pair).assign(predicted_speedup=pair["flops_b"] / pair["flops"], baseline=baseline)
            out.append(speed_tables.run_medians(pair, ["predicted_speedup", "measured_speedup", "ratio_spread"])[columns])
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=columns)


def pairing_note(pairs: pd.DataFrame) -> str:
    """How :func:`flop_pairs` took ``pairs``' ratios, for a caption ("" where there are none)."""
    if pairs.empty:
        return ""
    lone = int((~pairs["paired"]).sum())
    note = (" Speedups are time ratios within a run (both mechanisms timed by one flurka.speed document), "
            "a point's runs combined to the median ratio")
    return note + (f"; {lone} of {len(pairs)} pair times from different runs (no run timed both)." if lone else ".")


# The paper's regime claims (flurka.theory.cost_model.claim1..3): (label, predicate, the baselines
# FLuRKA must beat where the predicate holds).
CLAIMS = (("claim 1: N > d_k(H+2) > d_m > d_k > d_h", "claim1", ("low-rank", "kernel")),
          ("claim 2: N − 1 > d_k > d_h", "claim2", ("low-rank",)),
          ("claim 3: N > d_k(H+2), d_m > d_k", "claim3", ("kernel",)))


def claims_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """Each claim's regime boundary against measurement: per claim, variant, mode and scope, the
    configurations where its condition holds and where it does not, and at how many of them
    FLuRKA was measured faster than every baseline the claim names, slower than one, or neither
    beyond the ratios' spread (``ratio_spread``: a tie), and at how many the FLOP model predicts
    it faster. A claim is a sufficient condition: only a "met" row's slower points refute it."""
    from flurka.theory import cost_model  # pure Python; the package brings JAX

    cfg = [c for c in SPEED_CONFIG if c in pairs]
    pairs = pairs.assign(side=speed_tables.measured_side(pairs))
    rows = []
    for variant, kernel in KERNEL_OF.items():
        sides = {role: pairs[(pairs["mechanism"] == variant) & (pairs["baseline"] == base)]
                 for role, base in (("low-rank", LOW_RANK), ("kernel", kernel))}
        both = sides["low-rank"].merge(sides["kernel"], on=cfg, how="outer", suffixes=("_low-rank", "_kernel"))
        for _, r in both[both["d_k"].notna()].iterrows():
            N = r["N"]
            met = cost_model.claims_at(N, r["d_model"], r["d_k"], r["heads"])
            for label, name, roles in CLAIMS:
                measured = [r.get(f"measured_speedup_{role}") for role in roles]
                if any(v is None or v != v for v in measured):
                    continue
                side = [r[f"side_{role}"] for role in roles]
                faster, slower = all(v > 0 for v in side), any(v < 0 for v in side)
                predicted = [r[f"predicted_speedup_{role}"] for role in roles]
                rows.append({"claim": label, "mechanism": variant, "mode": r["mode"], "scope": r["scope"],
                             "condition": "met" if met[name] else "not met", "N": N, "faster": faster,
                             "tie": not (faster or slower), "slower": slower,
                             "predicted": all(v > 1 for v in predicted)})
    if not rows:
        return pd.DataFrame()
    order = {v: i for i, v in enumerate([c[0] for c in CLAIMS] + list(KERNEL_OF) + ["met", "not met"])}
    table = (pd.DataFrame(rows).sort_values(["claim", "mechanism", "mode", "scope", "condition"],
                                            key=lambda col: col.map(lambda v: order.get(v, v)))
             .groupby(["claim", "mechanism", "mode", "scope", "condition"], sort=False)
             .agg(points=("faster", "size"), N_min=("N", "min"), N_max=("N", "max"),
                  measured_faster=("faster", "sum"), tie=("tie", "sum"), slower=("slower", "sum"),
                  FLOP_model_faster=("predicted", "sum")))
    table = table.rename(columns={"N_min": "N from", "N_max": "N to", "measured_faster": "measured faster",
                                  "tie": "within spread", "slower": "measured slower",
                                  "FLOP_model_faster": "FLOP model: faster"})
    table.attrs["floatfmt"] = ".0f"
    return table


def _onset(ns: list, faster: list, slower: list | None = None) -> str:
    """Where on the grid ``ns`` (ascending) the baseline is overtaken for good: "a–b" (slower at a,
    faster at b and every larger N; ties between), "≤ b" (never slower, faster from b on), "> a"
    (slower at a, not faster for good by the largest N), "never slower, tie at c" (ties at the
    largest N c). ``slower`` defaults to not ``faster`` (a prediction has no ties)."""
    slower = [not f for f in faster] if slower is None else slower
    last_slower = max((i for i, s in enumerate(slower) if s), default=None)
    first = len(faster)
    while first and faster[first - 1]:
        first -= 1
    if first == len(faster):
        return f"> {ns[last_slower]:.0f}" if last_slower is not None else f"never slower, tie at {ns[-1]:.0f}"
    return f"≤ {ns[first]:.0f}" if last_slower is None else f"{ns[last_slower]:.0f}–{ns[first]:.0f}"


NO_BOUND = {"low-rank": "none (d_k ≤ d_h)", "kernel": "none (d_m ≤ d_k)"}  # why a claim says nothing


def crossings_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """Where FLuRKA overtakes each constituent as N grows, for every configuration measured at
    ≥ 3 lengths: measured, by the FLOP model and by the paper's appendix-B cost model, next to
    the length from which the paper's claim promises it (claim 2 for low-rank, claim 3 for the
    kernel). A claim's bound far above the measured onset is loose, not wrong; an onset above a
    bound refutes the claim on this device."""
    from flurka.theory import cost_model  # pure Python; the package brings JAX

    cfg = [c for c in SPEED_CONFIG if c in pairs and c != "N"]
    rows = []
    for variant, kernel in KERNEL_OF.items():
        for role, base in (("low-rank", LOW_RANK), ("kernel", kernel)):
            part = pairs[(pairs["mechanism"] == variant) & (pairs["baseline"] == base) & pairs["d_k"].notna()]
            for _, g in part.groupby(cfg, dropna=False, sort=True):
                g = g.sort_values("N")
                if g["N"].nunique() < 3 or g["N"].duplicated().any():
                    continue
                r = g.iloc[0]
                d_m, d_k, H = r["d_model"], r["d_k"], r["heads"]
                ns, side = list(g["N"]), speed_tables.measured_side(g)
                paper = [cost_model.paper_speedup_at(role, n, d_m, d_k, H) > 1 for n in ns]
                bound = cost_model.claim_bounds(d_m, d_k, H)[role]
                bound = f"> {bound:.0f}" if bound is not None else NO_BOUND[role]
                rows.append({"mechanism": variant, "baseline": base, "mode": r["mode"], "scope": r["scope"],
                             "d_model": d_m, "heads": H, "d_k": d_k, "N measured": f"{ns[0]:.0f}–{ns[-1]:.0f} ({len(ns)})",
                             "measured": _onset(ns, list(side > 0), list(side < 0)),
                             "FLOP model": _onset(ns, list(g["predicted_speedup"] > 1)),
                             "paper's cost model": _onset(ns, paper), "claim's bound": bound})
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows).set_index(["mechanism", "baseline", "mode", "scope"])
    table.attrs["floatfmt"] = ".0f"
    return table


# The paper's own speedups at the end of its N-sweep (§5.1, Fig. 3: inference on A100s at
# N = 55.5k, d_model 2600, 8 heads, d_k 1500): each FLuRKA variant over its low-rank and its
# kernel constituent.
PAPER_FIG3 = {"flurka-performer": (1.86, 1.37), "flurka-rnn": (1.83, 1.37), "flurka-eva": (1.86, 1.31)}
FIG3_SHAPE, FIG3_N = {"d_model": 2600, "heads": 8, "d_k": 1500}, 55500


def paper_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """FLuRKA over its constituents at the largest N measured in the paper's N-sweep shape, per
    mode and execution: measured (within runs) and its spread, the FLOP model's and the paper's
    appendix-B cost model's predictions, and the paper's own measured speedup (forward at
    N = 55.5k only: its Fig. 3 timed inference, and quotes its largest N)."""
    from flurka.theory import cost_model  # pure Python; the package brings JAX

    shape = (pairs["scope"] == "layer") & pairs["mechanism"].isin(list(PAPER_FIG3))
    for name, value in FIG3_SHAPE.items():
        shape &= pairs[name] == value
    part = pairs[shape & pairs["baseline"].isin([LOW_RANK, *KERNEL_OF.values()])]
    if part.empty:
        return pd.DataFrame()
    part = part[part["N"] == part["N"].max()]
    N, (d_m, H, d_k) = part["N"].iloc[0], FIG3_SHAPE.values()
    role = lambda base: "low-rank" if base == LOW_RANK else "kernel"  # noqa: E731
    order = {m: i for i, m in enumerate(PAPER_FIG3)}
    table = pd.DataFrame({
        "mechanism": part["mechanism"], "baseline": part["baseline"], "mode": part["mode"],
        "execution": part.apply(speed_tables.execution_label, axis=1), "N": part["N"],
        "measured": part["measured_speedup"], "± spread": part["ratio_spread"],
        "FLOP model": part["predicted_speedup"],
        "paper's cost model": [cost_model.paper_speedup_at(role(b), N, d_m, d_k, H) for b in part["baseline"]],
        "paper (Fig. 3)": [PAPER_FIG3[m][role(b) == "kernel"] if mode == "forward" and N == FIG3_N else None
                           for m, b, mode in zip(part["mechanism"], part["baseline"], part["mode"])],
        "_order": part["mechanism"].map(order), "_kernel": part["baseline"] != LOW_RANK,
    }).sort_values(["_order", "_kernel", "mode", "execution"]).drop(columns=["_order", "_kernel"])
    table = table.set_index(["mechanism", "baseline", "mode", "execution"])
    table.attrs["floatfmt"] = ".3g"
    return table


def agreement_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per variant, baseline and mode: how many points, the median predicted and measured
    speedups, the ties (:func:`flurka.results.speed_tables.measured_side` 0) and, of the other
    points, the share (%) where the FLOP model predicts the side that was measured faster (NaN
    where every point is a tie)."""
    side = speed_tables.measured_side(pairs)
    agree = ((pairs["predicted_speedup"] > 1) == (side > 0)).astype(float).where(side != 0)
    summary = (pairs.assign(tie=side == 0, agree=agree)
               .groupby(["mechanism", "baseline", "mode"], sort=False)
               .agg(points=("tie", "size"), predicted=("predicted_speedup", "median"),
                    measured=("measured_speedup", "median"), tie=("tie", "sum"), agree=("agree", "mean")))
    summary["agree"] *= 100
    summary = summary.rename(columns={"predicted": "median predicted", "measured": "median measured",
                                      "tie": "within spread", "agree": "agree (%)"})
    summary.attrs["floatfmt"] = ".3g"
    return summary


def flops_section(runs: pd.DataFrame) -> Section:
    """From :func:`speed_runs`' rows: ratios within runs (:func:`flop_pairs`), times per point."""
    section = Section("flops", "FLOP model vs measured",
                      "Does the FLOP model (flurka.attention.flops, stored with each measurement) predict "
                      "step time, and which FLuRKA speedups it predicts that the device delivers.")
    pairs, rows = flop_pairs(runs), combine_runs(runs)
    ok = rows[(rows["status"] == "ok") & rows["flops"].notna()]
    for i, (device, part) in enumerate(ok.groupby("device", sort=True)):
        p = pairs[pairs["device"] == device]
        fixed = [c for c in _fixed(part, SPEED_CONFIG) if c != "device"]
        ranges = "; ".join(f"{c} {int(part[c].min())}–{int(part[c].max())}" for c in ("N", "d_model", "d_k")
                           if c not in fixed and part[c].notna().any())
        caption = (f"Device: {device}. Config: {describe(part.iloc[0], fixed) or 'various'}"
                   f"{'; ' + ranges if ranges else ''}; modes {', '.join(sorted(part['mode'].unique()))}, "
                   f"scopes {', '.join(sorted(part['scope'].dropna().unique()))}; {len(part)} measurements."
                   f"{pairing_note(p)}")
        section.items.append(Plot(f"flops-{i}", f"FLOP model vs measured ({device})", caption,
                                  F.flops_vs_measured(part, p)))
        if not p.empty:
            section.items.append(Table(f"flops-{i}-summary", f"Predicted vs measured speedups ({device})",
                                       caption + " Agree: of the points measured beyond the spread of their two "
                                       "step times, the share where the FLOP model names the same side faster; "
                                       "within spread: the ties, which agree with neither.", agreement_table(p)))
            for key, title, about, table in (
                    ("paper", "FLuRKA over its constituents in Fig. 3's shape, next to the paper",
                     "The paper's N-sweep shape (d_model 2600, 8 heads, d_k 1500) at its largest N measured, "
                     "one layer, each execution: the measured speedup (baseline time / FLuRKA time) and its "
                     "spread (a speedup within 1 ± spread is a tie), the FLOP model's and the paper's "
                     "appendix-B cost model's predictions, and the paper's own measured speedup (§5.1: "
                     "inference on A100s at N = 55.5k, so forward only).", paper_table(p)),
                    ("claims", "The paper's regime claims vs measured",
                     "Per claim: configurations where its condition is met (where it predicts FLuRKA faster "
                     "than the baselines it names: low-rank, kernel or both) and where it is not, and at how "
                     "many FLuRKA was measured faster than all of them, slower than one, or neither beyond the "
                     "spread of the two step times (their p10–p90 ranges overlap: within spread), and at how "
                     "many the FLOP model says faster. A claim is refuted only by a met row with points "
                     "measured slower.", claims_table(p)),
                    ("crossings", "Where FLuRKA overtakes its constituents as N grows",
                     "For every configuration measured at 3 or more lengths N: the interval of N in which "
                     "FLuRKA becomes faster than the baseline for good (slower at its left end, faster at its "
                     "right end and at every larger N measured; ≤ N: never slower, faster from N on; > N: "
                     "slower at N and not faster for good by the largest; never slower, tie at N: a tie at the largest N "
                     "and no point slower), measured (faster or slower beyond "
                     "the spread of the two step times; ties between count as neither, so the interval spans "
                     "them) and as the FLOP model and the paper's appendix-B cost model "
                     "predict on the same lengths, next to the N from which the paper's claim promises it "
                     "(claim 2 for low-rank, claim 3 for the kernel).", crossings_table(p))):
                if not table.empty:
                    section.items.append(Table(f"flops-{i}-{key}", f"{title} ({device})", f"{caption} {about}",
                                               table))
    if not section.items:
        section.missing = SPEED.format("n-sweep")
    return section


# ---------------------------------------------------------------------------------------------
# Theory (Theorem 1, Fig. 2)
# ---------------------------------------------------------------------------------------------
THEORY = "python -m flurka.theory --out theory.json && flurka ingest --db URL theory.json"


def _theory_groups(df: pd.DataFrame, by=("device", "config")):
    """One group per theory run configuration: captured inputs (their ``inputs`` and ``source``
    are in the config) never share a figure with random inputs."""
    return list(df.groupby(list(by), dropna=False, sort=True)) if not df.empty else []


def _theory_caption(device: str, config: str, part: pd.DataFrame) -> str:
    return (f"Device: {device}. Config: {config or 'not recorded'}. "
            f"Source: {', '.join(sorted(part['source'].unique()))}.")


def _where(device: str, part: pd.DataFrame, layer: float | None = None) -> str:
    """A theory title's parenthesis: device; inputs[, layer k]."""
    inputs = part["inputs"].dropna().iloc[0] if part["inputs"].notna().any() else ""
    where = "; ".join(w for w in (device, inputs) if w)
    return where + (f", layer {int(layer)}" if layer is not None and layer == layer else "")


def _layers(part: pd.DataFrame) -> list[int]:
    return sorted(int(v) for v in part["layer"].dropna().unique())


def error_section(theory: Theory) -> Section:
    section = Section("approximation-error", "Approximation error vs m and d_k (Theorem 1)",
                      "Relative Frobenius error of each mechanism against full attention with the same "
                      "projections; FLuRKA's bound is its kernel term plus its low-rank term. Captured "
                      "inputs of a trained model: one figure per layer.")
    for i, ((device, config, layer), part) in enumerate(_theory_groups(theory.errors, ("device", "config", "layer"))):
        where = _where(device, part, layer)
        caption = _theory_caption(device, config, part)
        if layer == layer:
            caption += f" Inputs captured at layer {int(layer)}."
        section.items.append(Plot(f"error-{i}", f"Approximation error ({where})", caption,
                                  F.approximation_error(part)))
        table = part.groupby(["mechanism", "d_k", "m"], dropna=False, sort=False).agg(
            seeds=("rel_error", "size"), rel_error=("rel_error", "mean"), inf_error=("inf_error", "mean"),
            kernel_term=("kernel_term", "mean"), lowrank_term=("lowrank_term", "mean"))
        table = table.reindex(sorted(table.index, key=lambda k: (F._ordered(part["mechanism"]).index(k[0]),
                                                                 -1 if k[1] != k[1] else k[1], -1 if k[2] != k[2] else k[2])))
        table.attrs["floatfmt"] = ".4g"
        section.items.append(Table(f"error-{i}-table", f"Approximation error ({where})", caption, table))
    if not section.items:
        section.missing = THEORY
    return section


def rank_section(theory: Theory) -> Section:
    section = Section("rank", "Rank of kernelized attention (Fig. 2)",
                      "Numerical rank of φ(Q)φ(K)ᵀ per head: how far below full rank kernelized attention is "
                      "(per layer where a trained model's captured inputs were used).")
    for i, ((device, config), part) in enumerate(_theory_groups(theory.ranks)):
        layers = _layers(part)
        caption = _theory_caption(device, config, part)
        if layers:
            caption += (f" Per layer (bars L<layer>H<head>, table rows per layer): inputs captured at layer(s) "
                        f"{', '.join(map(str, layers))}.")
        title = f"Rank per {'layer and ' if layers else ''}head ({_where(device, part)})"
        section.items.append(Plot(f"rank-{i}", title, caption, F.ranks(part)))
        agg = dict(heads=("rank", "size"), mean_rank=("rank", "mean"), min_rank=("rank", "min"), max_rank=("rank", "max"))
        if part["max_rank"].notna().any():
            agg["full_rank"] = ("max_rank", "max")
        if layers:
            table = part.groupby(["mechanism", "layer"], dropna=False, sort=False).agg(**agg)
            order = F._ordered(part["mechanism"])
            table = table.reindex(sorted(table.index, key=lambda k: (order.index(k[0]), -1 if k[1] != k[1] else k[1])))
        else:
            table = part.groupby("mechanism", sort=False).agg(**agg)
            table = table.reindex(F._ordered(table.index))
        table.attrs["floatfmt"] = ".4g"
        section.items.append(Table(f"rank-{i}-table", f"Rank summary ({_where(device, part)})", caption,
                                   table))
    if not section.items:
        section.missing = THEORY
    return section


def profile_section(rows: pd.DataFrame) -> Section:
    """Profiled measurements: how much of each step is GEMMs, elementwise and reduction passes,
    copies, cuDNN or our Pallas kernels — why a point sits where it does against its floor."""
    section = Section("profiles", "Where the step time goes (profiles)",
                      "Device time of each profiled step by kind of XLA op (kernels traced with "
                      "jax.profiler, kinds read from the optimised HLO: flurka.speed.profile). GEMM-bound "
                      "steps gain from better GEMM shapes (alignment); elementwise/reduction/copy time is "
                      "memory traffic the FLOP floor does not count (fusion's target).")
    for i, (device, part) in enumerate(rows.groupby("device", sort=True)):
        part = part.sort_values(["mode", "scope", "N", "mechanism", *speed_tables.EXECUTION]).copy()
        part["label"] = [f"{r.mechanism} {r.mode} {r.scope} N={r.N}"
                         + ("" if (how := speed_tables.execution_label(r._asdict())) == "plain" else f", {how}")
                         for r in part.itertuples()]
        kinds = [k for k in PROFILE_KINDS if part[f"share_{k}"].any()]
        fixed = [c for c in _fixed(part, SPEED_CONFIG) if c != "device"]
        caption = (f"Device: {device}. Config: {describe(part.iloc[0], fixed) or 'various'}; "
                   f"{len(part)} profiled measurements; shares are of the traced device time, bars scale "
                   "them to the measured median step time.")
        section.items.append(Plot(f"profiles-{i}", f"Where the step time goes ({device})", caption,
                                  F.time_split(part, kinds)))
        table = part.set_index(["mechanism", "mode", "scope", "N", *speed_tables.EXECUTION])[
            ["median_s", "traced_s", *[f"share_{k}" for k in kinds], "top_op"]].copy()
        table[["median_s", "traced_s"]] *= 1e3
        table[[f"share_{k}" for k in kinds]] *= 100
        table = table.rename(columns={"median_s": "step ms", "traced_s": "traced ms",
                                      **{f"share_{k}": f"{k} %" for k in kinds}, "top_op": "top op"})
        table.attrs["floatfmt"] = ".3g"
        section.items.append(Table(f"profiles-{i}-table", f"Time by kind ({device})", caption, table))
    if not section.items:
        section.missing = SPEED.format("n-sweep --profile-steps 3")
    return section


# ---------------------------------------------------------------------------------------------
def build_sections(engine: Engine, theory: Theory) -> list[Section]:
    """Every section of the report: the main job's result first (up-training, then loss vs
    training FLOPs), the rest in the paper's order; ``theory`` (the files' rows) is joined by the
    database's theory runs."""
    prov = trial_provenance(engine)
    theory = with_stored(engine, theory)
    runs = speed_runs(engine)
    rows = combine_runs(runs)
    speed, ups = speed_vs_n_section(engine, rows)
    return [
        uptraining_section(engine, prov),
        isoflops_section(engine, prov),
        speed,
        speed_vs_section(rows, "d_k"),
        speed_vs_section(rows, "d_model"),
        ups,
        floor_section(runs),
        *quality_sections(engine, prov),
        error_section(theory),
        rank_section(theory),
        flops_section(runs),
        profile_section(profile_rows(engine)),
    ]
