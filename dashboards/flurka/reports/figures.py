"""The report's figures: pure functions from DataFrames to matplotlib ``Figure`` objects.

``matplotlib.figure.Figure`` is used directly (no pyplot state), so figures render with Agg in
any process, headless or not. Colours follow the paper: FLuRKA green, low-rank blue, kernel
orange, full/flash attention grey.
"""

from __future__ import annotations

import io
import math

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.figure import Figure
from scipy import stats as st

from flurka.results.records import MECHANISMS
from flurka.catalogue.mechanisms import CONTROL, CONTROL_LABEL, KERNEL_OF, LOW_RANK, base_mechanism, is_control
from flurka.results.quality_tables import NO_VALUE

STYLE = {  # mechanism -> (colour, marker)
    "full": ("#222222", "o"), "flash": ("#8c8c8c", "D"), "linformer": ("#1f5fbf", "o"),
    "performer": ("#ff8c00", "o"), "rnn": ("#d95f02", "s"), "eva": ("#b8860b", "^"),
    "flurka-performer": ("#1a9850", "o"), "flurka-rnn": ("#006d2c", "s"), "flurka-eva": ("#66bd63", "^"),
}
BASELINE_LINE = {"vs low-rank": "-", "vs kernel": "--", "vs flash": ":", "vs full": "-."}


def _style(mech: str) -> dict:
    colour, marker = STYLE.get(mech, ("#555555", "o"))
    return {"color": colour, "marker": marker, "markersize": 4, "linewidth": 1.4}


def _ordered(mechs) -> list[str]:
    mechs = set(mechs)
    return [m for m in MECHANISMS if m in mechs] + sorted(mechs - set(MECHANISMS))


def _panels(n: int, width: float = 4.6, height: float = 3.4) -> tuple[Figure, list]:
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols + 1.8, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


LEGEND_PT = 8  # legend text (points): the smallest a printed page reads


def _legend(fig: Figure, axes, *, loc: str = "outside right upper", ncols: int = 1, last: tuple[str, ...] = ()) -> None:
    """One legend for the whole figure, outside the plots (panels share their mechanisms): each
    label once, with the first panel's handle for it; labels that start with one of ``last``
    (what explains the others: bands, a target line) after the curves."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    seen = dict(sorted(seen.items(), key=lambda item: item[0].startswith(last) if last else False))
    if seen:
        fig.legend(list(seen.values()), list(seen), loc=loc, ncols=ncols, fontsize=LEGEND_PT, frameon=False)


class PlainLogLocator(ticker.Locator):
    """Log-axis ticks as dense as the drawn axis has room for: per decade 1, 1.2, 1.5 … 8 on a
    short range, thinning to 1, 2, 5 or one power of ten (every k-th on a long one) so that no
    two labels come closer than ``gap_pt`` points; a range under a decade too narrow for three
    such ticks gets linear ones. Decided at draw time, from the axis's length after layout. Matplotlib's default
    labels minor ticks as "6×10¹" where the range is under a decade or two, and they collide."""

    SUBS = ((1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8), (1, 1.5, 2, 3, 5, 7), (1, 2, 5), (1, 3), (1,))

    def __init__(self, gap_pt: float):
        self.gap_pt = gap_pt

    def __call__(self):
        lo, hi = self.axis.get_view_interval()
        return self.tick_values(lo, hi)

    def _length_pt(self) -> float:
        box = self.axis.axes.bbox
        pixels = box.width if self.axis.axis_name == "x" else box.height
        return max(pixels * 72.0 / self.axis.figure.dpi, 1.0)  # not laid out yet: a point

    def tick_values(self, vmin, vmax):
        lo, hi = sorted((vmin, vmax))
        if not 0 < lo < hi:
            return ticker.LogLocator().tick_values(vmin, vmax)
        decades = math.log10(hi / lo)
        per_decade = self._length_pt() / decades
        stride = 1
        for subs in self.SUBS:
            gaps = np.diff(np.log10([*subs, 10]))
            if gaps.min() * per_decade >= self.gap_pt:
                break
        else:
            stride = math.ceil(self.gap_pt / per_decade)
        first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        ticks = [s * 10.0 ** e for e in range(first - first % stride, last + 1, stride) for s in subs]
        inside = [t for t in ticks if lo <= t <= hi]
        if len(inside) >= 3 or decades >= 1:
            return np.array(ticks)
        for nbins in range(max(1, int(self._length_pt() // self.gap_pt)), 0, -1):
            linear = ticker.MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
            shown = linear[(linear >= lo) & (linear <= hi)]
            if len(shown) < 2 or np.diff(np.log10(shown)).min() * per_decade >= self.gap_pt:
                break
        return linear


def plain_number(value: float, _pos=None) -> str:
    """A tick label without powers: 0.25, 1.5, 300, 1024, 15k, 2M, 3T (what a step time, a length
    N or a FLOP count reads as in the text; a suffix only where it keeps three digits or fewer)."""
    if value == 0 or abs(value) < 1000:
        return f"{value:.4g}"
    exponent = min(int(math.log10(abs(value)) // 3), 6)
    mantissa = f"{value / 10 ** (3 * exponent):.3g}"
    if not math.isclose(float(mantissa) * 10 ** (3 * exponent), value, rel_tol=1e-9) and abs(value) < 1e6:
        return f"{value:.6g}"
    return mantissa + " kMGTPE"[exponent]


def _log(ax, which: str = "xy", base: int = 10) -> None:
    """Log axes labelled in plain numbers (:class:`PlainLogLocator`; base 2: the powers of two,
    e.g. d_k and m, written out)."""
    for name in which:
        axis = getattr(ax, f"{name}axis")
        getattr(ax, f"set_{name}scale")("log", base=base)
        axis.set_major_locator(PlainLogLocator(gap_pt=30 if name == "x" else 16) if base == 10
                               else ticker.LogLocator(base=base, subs=(1.0,)))
        axis.set_major_formatter(ticker.FuncFormatter(plain_number))
        axis.set_minor_locator(ticker.LogLocator(base=base, subs="auto"))
        axis.set_minor_formatter(ticker.NullFormatter())


def _size_axis(ax, values) -> None:
    """An x axis of sizes (N, d_k, d_model): log past a factor of 8; with three sizes or fewer
    (a training panel's one N) ticks at those sizes alone, not at 53k … 58k around them."""
    values = np.unique(np.asarray(values, float))
    if values.max() / max(values.min(), 1) >= 8:
        _log(ax, "x")
    if len(values) <= 3:
        ax.set_xticks(values, [plain_number(v) for v in values])
        ax.xaxis.set_minor_locator(ticker.NullLocator())


def png(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


# The speed figures' p10–p90 bands (a ratio's: r·(1 ± w), w as the tables' "within spread").
SPREAD_ALPHA = 0.15
SPREAD_LABEL = "bands: p10–p90 of the step times"
RATIO_SPREAD_LABEL = "bands: ratio × (1 ± half the two times' p10–p90 widths)"


def _spread_band(ax, x, low, high, mech: str, label: str) -> None:
    """``mech``'s p10–p90 band over ``x`` (gaps where either end is NaN); one point's, which a
    band cannot show, as an error bar."""
    x, low, high = (np.asarray(v, float) for v in (x, low, high))
    have = np.isfinite(low) & np.isfinite(high)
    colour = STYLE.get(mech, ("#555555",))[0]
    if have.sum() >= 2:
        _band(ax, x, low, high, colour, label=label, alpha=SPREAD_ALPHA)
    elif have.any():
        mid = (low + high)[have] / 2
        ax.errorbar(x[have], mid, yerr=(high - low)[have] / 2, fmt="none", ecolor=colour, elinewidth=0.9,
                    capsize=3, alpha=0.8)


def speed_vs_axis(df: pd.DataFrame, axis: str, *, speedup_over: str | None = None) -> Figure:
    """One panel per (mode, scope): step time (ms) per mechanism against ``axis`` in its p10–p90
    band, OOM as ×; with ``speedup_over`` the y axis is that mechanism's time divided by each
    mechanism's, in the ratio's band (:func:`flurka.results.speed_tables.with_ratio`'s spread)."""
    groups = list(df.groupby(["mode", "scope"], dropna=False, sort=True))
    fig, axes = _panels(len(groups))
    for ax, ((mode, scope), part) in zip(axes, groups):
        ok = part[part["status"] == "ok"]
        nan = pd.Series(float("nan"), index=ok.index)

        def wide(column: str) -> pd.DataFrame:
            values = pd.to_numeric(ok[column], errors="coerce") if column in ok else nan
            return ok.assign(_v=values).pivot(index=axis, columns="mechanism", values="_v").sort_index()

        times = wide("median_s") * 1e3
        if speedup_over is None:
            low, high, label = wide("p10_s") * 1e3, wide("p90_s") * 1e3, SPREAD_LABEL
        else:
            width = wide("spread_s") * 1e3 / times
            times = times.rdiv(times[speedup_over], axis=0)
            w = width.add(width[speedup_over], axis=0) / 2
            low, high, label = times * (1 - w), times * (1 + w), RATIO_SPREAD_LABEL
            times = times.drop(columns=speedup_over)
        for mech in _ordered(times.columns):
            s = times[mech].dropna()
            ax.plot(s.index, s.values, label=mech, **_style(mech))
            _spread_band(ax, s.index, low[mech].reindex(s.index), high[mech].reindex(s.index), mech, label)
        oom = part[part["status"] == "oom"]
        if not oom.empty and speedup_over is None and not times.empty:
            top = float(np.nanmax(times.to_numpy())) * 1.3
            for mech, o in oom.groupby("mechanism"):
                ax.scatter(o[axis], [top] * len(o), marker="x", color=STYLE.get(mech, ("#555",))[0], s=30)
            ax.annotate("× = out of memory", xy=(0.02, 0.97), xycoords="axes fraction", va="top", fontsize=7)
        if speedup_over is not None:
            ax.axhline(1.0, color="#999999", linewidth=0.8)
        _log(ax, "y")
        _size_axis(ax, part[axis])
        ax.set_xlabel(axis)
        ax.set_ylabel(f"speedup over {speedup_over}" if speedup_over else "median step time (ms)")
        ax.set_title(f"{mode}, {scope} scope", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    _legend(fig, fig.axes)
    return fig


def speedups(panels: dict[str, pd.DataFrame], claim_bound: float | None = None) -> Figure:
    """One panel per title: each FLuRKA variant's speedup over its constituents / flash / full vs N
    (``flurka.results.speed_tables.speedup_table`` frames); the line at 1 is break-even, the dotted
    vertical one the paper's claims 1 and 3 bound N = d_k(H+2) when given and in range; each
    ratio r in its band r·(1 ± w), w the table's ``attrs["spread"]`` where it has one."""
    fig, axes = _panels(len(panels))
    for ax, (title, table) in zip(axes, panels.items()):
        spread = table.attrs.get("spread")
        for variant, part in table.groupby(level="variant", sort=False):
            part = part.droplevel("variant").sort_index()
            widths = (spread.loc[variant].sort_index() if spread is not None and variant in spread.index
                      else pd.DataFrame(index=part.index))
            for col, ls in BASELINE_LINE.items():
                s = part[col].dropna() if col in part else pd.Series(dtype=float)
                if not s.empty:
                    ax.plot(s.index, s.values, linestyle=ls, label=f"{variant} {col}",
                            **{**_style(variant), "markersize": 3})
                    w = widths[col].reindex(s.index) if col in widths else pd.Series(float("nan"), index=s.index)
                    _spread_band(ax, s.index, s * (1 - w), s * (1 + w), variant, RATIO_SPREAD_LABEL)
        ax.axhline(1.0, color="#999999", linewidth=0.8)
        ns = table.index.get_level_values("N")
        if claim_bound is not None and ns.min() <= claim_bound <= ns.max():
            ax.axvline(claim_bound, color="#555555", linestyle=":", linewidth=1.0,
                       label="claims 1, 3: N = d_k(H+2)")
        _log(ax, "y")
        _size_axis(ax, ns)
        ax.set_xlabel("N")
        ax.set_ylabel("speedup (baseline time / FLuRKA time)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    _legend(fig, fig.axes)
    return fig


# Reference lines of the up-training figure: the kernel constituent dashed, low-rank dotted.
KERNEL_LINE, LOW_RANK_LINE = "--", ":"
BAND_ALPHA, REF_BAND_ALPHA = 0.22, 0.12


def _band(ax, x, low, high, colour, label=None, alpha=BAND_ALPHA):
    """A shaded CI band (a ``PolyCollection``) from ``low`` to ``high`` over ``x``."""
    return ax.fill_between(x, low, high, color=colour, alpha=alpha, linewidth=0, label=label)


def _no_dk(d_k) -> bool:
    """No d_k recorded: None, NaN or the tables' "—"."""
    return d_k is None or d_k == NO_VALUE or (isinstance(d_k, float) and d_k != d_k)


def _dk_label(d_k) -> str:
    return "d_k —" if _no_dk(d_k) else f"d_k={int(d_k)}"


BEST_ALPHA_LABEL = "the row's best α (its best mean)"


def uptraining(stats: pd.DataFrame, label: str | None = None) -> Figure:
    """Table 5 as a figure: one panel per FLuRKA variant (rows) and d_k (columns; one d_k: the
    variants two to a row), the variant's seed mean against α with its 95 % CI band, its kernel
    constituent (orange family, dashed) and Linformer at that d_k (blue, dotted) trained from
    scratch as horizontal lines with their own bands; the row's best α starred (a row of one α
    compares nothing: no star); one legend below the panels names every line once (panels share
    the variant's and its kernel's entries). ``stats``: :func:`flurka.results.quality_tables.uptraining_stats`'
    frame (one row per variant, d_k and column "kernel", "low-rank" or an α, with ``mechanism``,
    ``alpha``, ``mean``, ``low``, ``high``, ``n`` and ``best``); ``label``: the y axis's (default
    the frame's ``attrs["metric"]``)."""
    no_dk = stats["d_k"].map(_no_dk).astype(bool)
    bases = stats["base"] if "base" in stats else pd.Series("low-rank", index=stats.index)
    variants = [(v, b) for v in _ordered(stats["variant"])
                for b in sorted(set(bases[stats["variant"] == v]), key=lambda b: b != "low-rank")]
    dks = sorted({int(d) for d in stats.loc[~no_dk, "d_k"]})
    dks = [*dks, None] if no_dk.any() or not dks else dks
    panels = [(v, b, d) for v, b in variants for d in dks]
    cols = len(dks) if len(dks) > 1 else min(2, len(variants))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.3 * cols + 1.2, 3.9 * rows + 0.2), layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel().tolist()
    for ax in grid[len(panels):]:
        ax.set_visible(False)
    ups = stats[stats["alpha"].notna()]
    xs_all = np.sort(ups["alpha"].unique()) * 100
    pad = max(4.0, 0.06 * (xs_all.max() - xs_all.min())) if len(xs_all) else 5.0
    span = np.array([xs_all.min() - pad, xs_all.max() + pad]) if len(xs_all) else np.array([0.0, 100.0])
    for i, (variant, base, d_k) in enumerate(panels):
        ax, c = grid[i], i % cols
        at_dk = stats["d_k"].map(lambda d, want=d_k: _no_dk(d) if want is None else not _no_dk(d) and int(d) == want)
        here = stats[(stats["variant"] == variant) & (bases == base) & at_dk.astype(bool)]
        curve = here[here["alpha"].notna()].sort_values("alpha")
        if curve.empty:
            ax.set_visible(False)
            continue
        colour = STYLE.get(variant, ("#555555",))[0]
        kernel = KERNEL_OF.get(variant, "kernel")
        for column, name, line in (("kernel", f"{kernel}: kernel, from scratch", KERNEL_LINE),
                                   ("low-rank", f"{LOW_RANK} {_dk_label(d_k)}: low-rank, from scratch",
                                    LOW_RANK_LINE)):
            ref = here[here["column"] == column]
            if ref.empty or ref["mean"].isna().all():
                continue
            ref = ref.iloc[0]
            ref_colour = STYLE.get(ref["mechanism"], ("#555555",))[0]
            ax.plot(span, [ref["mean"]] * 2, linestyle=line, linewidth=1.4, color=ref_colour,
                    label=f"{name} (n={int(ref['n'])})")
            _band(ax, span, [ref["low"]] * 2, [ref["high"]] * 2, ref_colour, alpha=REF_BAND_ALPHA)
            for edge in (ref["low"], ref["high"]):  # where overlapping bands blend, their edges still show
                ax.plot(span, [edge] * 2, linestyle=line, linewidth=0.6, color=ref_colour, alpha=0.6)
        x = curve["alpha"].to_numpy(float) * 100
        ax.plot(x, curve["mean"].to_numpy(float), label=f"{variant}: up-trained (n={int(curve['n'].max())})",
                **{**_style(variant), "linewidth": 1.8, "markersize": 5})
        mean, low, high = (curve[k].to_numpy(float) for k in ("mean", "low", "high"))
        if len(x) == 1:     # one α: a band over one point has no width; its CI as an error bar
            ax.errorbar(x, mean, yerr=[mean - low, high - mean], color=colour, capsize=5, linewidth=1.4,
                        label="bar and bands: 95 % CI over seeds")
        else:
            _band(ax, x, low, high, colour, label="bands: 95 % CI over seeds")
        for _, best in curve[curve["best"].astype(bool) & (len(x) > 1)].iterrows():
            ax.plot([best["alpha"] * 100], [best["mean"]], linestyle="none", marker="*", markersize=12,
                    color=colour, markeredgecolor="#222222", markeredgewidth=0.6,
                    label=BEST_ALPHA_LABEL)
        ax.set_xlim(*span)
        ax.set_xticks(x, [f"{v:g}" for v in x])
        ax.set_title(f"{variant}{'' if base == 'low-rank' else f' ({base} base)'}, {_dk_label(d_k)}", fontsize=10)
        ax.set_xlabel("α: % of steps trained as the base model")
        if c == 0:
            ax.set_ylabel(f"{label or stats.attrs.get('metric', 'value')}, mean ± 95 % CI")
        ax.grid(True, alpha=0.25)
    _legend(fig, grid, loc="outside lower center", ncols=2 if cols == 1 else min(3, cols + 1),
            last=("bands: ", "bar and bands: ", BEST_ALPHA_LABEL))
    return fig


# SI prefixes for a FLOP axis: the largest one the data's maximum reaches.
FLOP_UNITS = ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP"))
DK_LINES = ("-", "--", "-.", ":")


def flop_unit(largest: float) -> tuple[float, str]:
    """(scale, unit) with ``largest / scale`` in [1, 1000): 1.2e14 -> (1e12, "TFLOP")."""
    for scale, name in FLOP_UNITS:
        if largest >= scale:
            return scale, name
    return 1.0, "FLOP"


def _full_length(part: pd.DataFrame) -> pd.DataFrame:
    """The trials of a group that ran its whole length (a stopped base run's prefix left out)."""
    last = part.groupby("trial_id")["step"].max()
    return part[part["trial_id"].isin(last[last == last.max()].index)]


def _seed_values(part: pd.DataFrame, y: str, x: str, points: int):
    """(grid, values, runs): each seed's ``y`` on one x grid (``values``: seeds × grid points),
    the seeds' common x points where they share them, else ``points`` x values spanning the range
    every seed covers, each seed interpolated there; ``runs`` each trial's own (x, y)."""
    runs = [(g[x].to_numpy(float), g[y].to_numpy(float)) for _, g in part.sort_values("step").groupby("trial_id")]
    first = runs[0][0]
    if all(len(r[0]) == len(first) and np.allclose(r[0], first) for r in runs):
        grid = first
    else:
        lo, hi = max(r[0][0] for r in runs), min(r[0][-1] for r in runs)
        grid = np.linspace(lo, hi, points) if hi > lo else first
    return grid, np.array([np.interp(grid, rx, ry) for rx, ry in runs]), runs


def mean_curve(part: pd.DataFrame, y: str, x: str = "train_flops", points: int = 200):
    """(grid, mean, runs): the seeds' mean of ``y`` against ``x``, on the seeds' common x points
    where they share them, else interpolated on ``points`` x values spanning the range every seed
    covers; ``runs`` each trial's own (x, y)."""
    grid, values, runs = _seed_values(part, y, x, points)
    return grid, values.mean(axis=0), runs


CONFIDENCE = 0.95


def seed_interval(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) over the seeds (axis 0 of ``values``) at each point: scipy's Student t
    interval at 95 % with n − 1 degrees of freedom around the mean, scaled by the standard error
    (``scipy.stats.sem``); low = high = mean where the seeds agree; NaN bounds with one seed."""
    values = np.atleast_2d(np.asarray(values, float))
    n, mean = len(values), values.mean(axis=0)
    if n < 2:
        return mean, np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    sem = st.sem(values, axis=0)
    spread = sem > 0
    low, high = st.t.interval(CONFIDENCE, n - 1, loc=mean, scale=np.where(spread, sem, 1.0))
    return mean, np.where(spread, low, mean), np.where(spread, high, mean)


def mean_band(part: pd.DataFrame, y: str, x: str = "train_flops", points: int = 200):
    """(grid, mean, low, high, runs): :func:`mean_curve` with its 95 % CI over the seeds at each
    grid point (:func:`seed_interval`)."""
    grid, values, runs = _seed_values(part, y, x, points)
    return (grid, *seed_interval(values), runs)


def _group_label(mech: str, d_k, num_features, many_m: bool) -> str:
    label = mech
    if d_k == d_k and d_k is not None:
        label += f" d_k={int(d_k)}"
    if many_m and num_features == num_features and num_features is not None:
        label += f" m={int(num_features)}"
    return label


def _seeds(n: int) -> str:
    """A mean curve's legend suffix: how many seeds it averages (one: no mean, no band)."""
    return "1 seed" if n == 1 else f"mean of {n} seeds"


CURVE_BAND_ALPHA = 0.16
CONTROL_COLOUR = "#9e9e9e"   # the no-attention control: grey, dotted
CURVE_BAND_LABEL = "bands: 95 % CI over seeds (Student t)"


def _log_limits(values, target: float | None = None, pad: float = 0.06) -> tuple[float, float]:
    """Log-axis limits holding every finite positive value (and the target), padded by ``pad`` of
    the span in log space on each side (a flat set: ±10 %)."""
    v = np.concatenate([np.ravel(np.asarray(a, float)) for a in values] + [np.array([target or np.nan])])
    v = v[np.isfinite(v) & (v > 0)]
    lo, hi = np.log10(v.min()), np.log10(v.max())
    margin = pad * (hi - lo) if hi > lo else 0.04
    return 10 ** (lo - margin), 10 ** (hi + margin)


def _fork(g: pd.DataFrame, alpha: float) -> float:
    """An α branch's fork, in training FLOPs: its seeds' mean at the last logged step at or before
    round(α · steps) (flurka.configs.switch_step; steps: the branch's last logged step), where
    its curve, the base's until then, becomes its own."""
    steps = int(g["step"].max())
    before = g[g["step"] <= int(round(alpha * steps))]
    if before.empty:
        return float(g["train_flops"].min())
    return float(before.sort_values("step").groupby("trial_id").tail(1)["train_flops"].mean())


def loss_vs_flops(curves: pd.DataFrame, loss: str, target: float | None, *, kind: str = "train") -> Figure:
    """``kind`` (training) ``loss`` against cumulative training FLOPs (Table 1: what a mechanism's
    loss costs), in an SI unit chosen from the data; the y axes log-scaled, their limits from the
    curves drawn (and the target) with a margin, so no curve leaves its panel.

    Top panel: every mechanism trained from scratch over its whole run, each seed faint, the mean
    over seeds bold inside its 95 % CI band (:func:`seed_interval`; "1 seed": no band). Then a row
    per up-trained FLuRKA variant, drawn for what Table 1 asks of it (how low its loss has come for
    the FLOPs spent, against its constituents and the target): each α branch's seed mean (darker
    green = larger α) in its band, from its fork (•) on, since before the fork a branch *is* its
    base run, whose curve is drawn beside it with the kernel constituent's. So that the part after
    the fork is not a few pixels at the right end, the row's x axis starts shortly before the
    earliest fork's FLOPs and its y axis spans what is drawn there; where the last fork still
    leaves its branch under a third of that width, a second panel to the right shows the run from
    shortly before the last fork to the end, where every branch runs on its own. Line style tells
    d_k apart; the dashed grey line is the target loss (full attention's final loss). One legend for
    the figure: a curve drawn in several panels is one entry."""
    up = curves["alpha"].notna() & (curves["alpha"] > 0) & (curves["alpha"] < 1)
    scratch, branches = curves[~up], curves[up].assign(alpha=curves.loc[up, "alpha"].round(6))
    variants = _ordered(branches["attention"].unique())
    scale, unit = flop_unit(float(curves["train_flops"].max()))
    control = [is_control(a, d) for a, d in zip(curves["attention"], curves["d_k"])]
    dks = sorted(curves.loc[~np.array(control, dtype=bool), "d_k"].dropna().unique())
    dk_line = {d: DK_LINES[i % len(DK_LINES)] for i, d in enumerate(dks)}
    alphas = sorted(branches["alpha"].unique())
    cmap = matplotlib.colormaps["Greens"]
    shade = {a: cmap(0.45 + 0.5 * i / max(len(alphas) - 1, 1)) for i, a in enumerate(alphas)}
    many_m = scratch.groupby("attention")["num_features"].nunique().to_dict()

    means = {}   # from scratch: (attention, d_k, m) -> (x, mean, low, high, runs, label, colour, line style)
    for k, part in scratch.groupby(["attention", "d_k", "num_features"], dropna=False, sort=False):
        grid, mean, low, high, runs = mean_band(_full_length(part), loss)
        ctrl = is_control(k[0], k[1])
        name = f"{CONTROL_LABEL}: {LOW_RANK} d_k={CONTROL[1]}" if ctrl else _group_label(*k, many_m.get(k[0], 0) > 1)
        means[k] = (grid / scale, mean, low, high, runs, f"{name} ({_seeds(len(runs))})",
                    CONTROL_COLOUR if ctrl else _style(k[0])["color"], ":" if ctrl else dk_line.get(k[1], "-"))
    rows = []    # per variant: its reference curves, its branches and the x window
    for variant in variants:
        part = branches[branches["attention"] == variant]
        bases = {base_mechanism(variant, b) for b in part["base"].dropna()} or {LOW_RANK}
        kernel = KERNEL_OF.get(variant)
        refs = [means[k] for ref in [*sorted(bases), kernel] for k in means
                if k[0] == ref and not is_control(k[0], k[1]) and (k[1] != k[1] or k[1] in set(part["d_k"]))]
        curves_here = []
        for (d_k, alpha), g in part.groupby(["d_k", "alpha"], dropna=False):
            g = _full_length(g)
            grid, mean, low, high, runs = mean_band(g, loss)
            fork = _fork(g, alpha)
            after = grid >= fork * (1 - 1e-9)
            curves_here.append((grid[after] / scale, mean[after], low[after], high[after], runs,
                                f"α = {alpha * 100:g}%, {_dk_label(d_k)} ({_seeds(len(runs))})", shade[alpha],
                                dk_line.get(d_k, "-"), fork / scale))
        end = max(float(c[0].max()) for c in [*refs, *curves_here])
        first, last = min(c[8] for c in curves_here), max(c[8] for c in curves_here)
        left = max(0.0, first - 0.05 * (end - first))
        zoom = max(0.0, last - 0.08 * (end - last)) if end - last < (end - left) / 3 else None
        rows.append((variant, bases, kernel, refs, curves_here, (left, end), zoom))

    zoomed = any(r[6] is not None for r in rows)
    layout = [["scratch"] * (1 + zoomed)] if not scratch.empty else []
    layout += [[v, f"{v} end"] if z is not None else [v] * (1 + zoomed) for v, *_, z in rows]
    fig = Figure(figsize=(10.4, 3.3 * len(layout) + 0.3), layout="constrained")
    panels = fig.subplot_mosaic(layout, width_ratios=[2, 1] if zoomed else None)
    def draw(ax, curve, lw=1.8):
        x, mean, low, high, runs, label, colour, style = curve[:8]
        ax.plot(x, mean, linestyle=style, color=colour, linewidth=lw, label=label)
        if len(runs) >= 2:   # a band's floor above 0: a log axis draws nothing at or below 0
            _band(ax, x, np.maximum(low, mean * 1e-3), high, colour, alpha=CURVE_BAND_ALPHA)

    def window(ax, drawn, lo, hi):
        ax.set_xlim(lo, hi + 0.02 * (hi - lo))
        ax.set_ylim(*_log_limits([c[1][(c[0] >= lo) & (c[0] <= hi)] for c in drawn], target))

    shown = []
    if not scratch.empty:
        ax = panels["scratch"]
        order = _ordered({k[0] for k in means})
        for k in sorted(means, key=lambda k: (is_control(k[0], k[1]), order.index(k[0]), -1 if k[1] != k[1] else k[1])):
            for rx, ry in means[k][4]:
                ax.plot(rx / scale, ry, color=means[k][6], linestyle=means[k][7], linewidth=0.6, alpha=0.3)
            draw(ax, means[k])
        ax.set_xlim(left=0)
        ax.set_ylim(*_log_limits([m[1] for m in means.values()] + [r[1] for m in means.values() for r in m[4]], target))
        ax.set_title("trained from scratch: each seed (faint), their mean (bold) and its 95 % CI", fontsize=10)
        ax.set_xlabel(f"training FLOPs ({unit})")
        shown.append(ax)
    for variant, bases, kernel, refs, here, (left, end), zoom in rows:
        targets = [(panels[variant], left)]
        if zoom is not None:
            targets.append((panels[f"{variant} end"], zoom))
        for ax, lo in targets:
            for curve in refs:
                draw(ax, curve)
            for curve in here:
                draw(ax, curve, lw=1.6)
            for x, mean, *_, colour, _style_, _fork_ in here:
                ax.plot(x[:1], mean[:1], marker="o", markersize=3.5, linestyle="none", color=colour)
            window(ax, [*refs, *here], lo, end)
            ax.set_xlabel(f"training FLOPs ({unit})")
            shown.append(ax)
        panels[variant].set_title(f"{variant} from its {', '.join(sorted(bases))} base: α branches from their "
                                  f"fork (•)", fontsize=10)
        if zoom is not None:
            panels[f"{variant} end"].set_title(f"{variant}: from the last fork", fontsize=10)
    for ax in shown:
        if target is not None:
            ax.axhline(target, color="#999999", linestyle="--", linewidth=0.9,
                       label=f"target: full attention's final {kind} {loss}, {target:.4g}")
        bottom, top = ax.get_ylim()
        _log(ax, "y")
        ax.set_ylim(bottom, top)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(plain_number))
        ax.grid(True, which="both", alpha=0.25)
    if any(len(c[4]) >= 2 for c in [*means.values(), *(h for r in rows for h in r[4])]):
        _band(shown[0], [], [], [], "#777777", label=CURVE_BAND_LABEL, alpha=0.3)   # the legend's grey swatch
    for ax in shown:
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel(f"{kind} {loss} (log scale)")
    _legend(fig, shown, loc="outside lower center", ncols=3 if zoomed else 2, last=(CURVE_BAND_LABEL, "target: "))
    return fig


def approximation_error(errors: pd.DataFrame) -> Figure:
    """Relative error vs full attention (seed mean ± std) against d_k (at the largest m) and against
    m (at the largest d_k); FLuRKA's Theorem 1 bound (kernel + low-rank term) dashed; mechanisms
    with neither knob as horizontal lines."""
    fig, (ax_dk, ax_m) = _panels(2)
    for ax, axis, other in ((ax_dk, "d_k", "m"), (ax_m, "m", "d_k")):
        for mech in _ordered(errors["mechanism"]):
            part = errors[errors["mechanism"] == mech]
            if part[axis].notna().any():
                part = part[part[axis].notna()]
                if part[other].notna().any():
                    part = part[part[other] == part[other].max()]
                stats = part.groupby(axis)["rel_error"].agg(["mean", "std"]).sort_index()
                ax.errorbar(stats.index, stats["mean"], yerr=stats["std"].fillna(0), label=mech, capsize=2,
                            **_style(mech))
                if {"kernel_term", "lowrank_term"} <= set(part.columns) and part["kernel_term"].notna().any():
                    bound = (part["kernel_term"] + part["lowrank_term"]).groupby(part[axis]).mean().sort_index()
                    ax.plot(bound.index, bound.values, linestyle="--", linewidth=1,
                            color=STYLE.get(mech, ("#555",))[0], label=f"{mech} bound")
            elif part[other].isna().all():
                ax.axhline(part["rel_error"].mean(), linestyle=":", linewidth=1.2,
                           color=STYLE.get(mech, ("#555",))[0], label=f"{mech} (no d_k or m)")
        _log(ax, "x", base=2)
        ax.set_xlabel(axis)
        ax.set_ylabel("‖out − full‖_F / ‖full‖_F")
        ax.set_title(f"error vs {axis}", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    _legend(fig, fig.axes)
    return fig


def ranks(ranks: pd.DataFrame) -> Figure:
    """Numerical rank of φ(Q)φ(K)ᵀ per head (mean over examples), grouped bars per mechanism,
    with the full rank min(N, N_k) dashed where recorded."""
    ranks = ranks.copy()
    ranks["where"] = [f"L{int(layer)}H{int(h)}" if "layer" in ranks and layer == layer
                      else f"H{int(h)}" if h == h else "all"
                      for layer, h in zip(ranks.get("layer", pd.Series([float("nan")] * len(ranks))),
                                      ranks.get("head", pd.Series([float("nan")] * len(ranks))))]
    mean = ranks.groupby(["where", "mechanism"], sort=False)["rank"].mean().unstack("mechanism")
    mechs = _ordered(mean.columns)
    fig = Figure(figsize=(max(6.4, 0.5 * len(mean) * len(mechs)), 3.8), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(mechs)
    x = np.arange(len(mean))
    for i, mech in enumerate(mechs):
        ax.bar(x + i * width - 0.4 + width / 2, mean[mech].to_numpy(float), width, label=mech,
               color=STYLE.get(mech, ("#555",))[0])
    if "max_rank" in ranks and ranks["max_rank"].notna().any():
        for i, mech in enumerate(mechs):
            full = ranks.loc[ranks["mechanism"] == mech, "max_rank"].max()
            if full == full:
                ax.axhline(full, linestyle="--", linewidth=0.9, color=STYLE.get(mech, ("#555",))[0],
                           label=f"{mech} full rank {int(full)}")
    ax.set_xticks(x, mean.index, rotation=90 if len(mean) > 12 else 0, fontsize=7)
    ax.set_ylabel("numerical rank of φ(Q)φ(K)ᵀ")
    ax.set_xlabel("layer / head")
    ax.grid(True, axis="y", alpha=0.25)
    _legend(fig, fig.axes)
    return fig


def flops_vs_measured(rows: pd.DataFrame, pairs: pd.DataFrame) -> Figure:
    """Left: measured step time against the FLOP model's count per mechanism. Right: FLOP-model
    predicted speedup against measured speedup of FLuRKA over each baseline, its bar the ratio's
    spread (``ratio_spread``: a bar across 1 is a tie; y = x dashed; the shaded quadrants are
    where prediction and measurement disagree about who is faster)."""
    fig, (ax_t, ax_s) = _panels(2)
    for mech in _ordered(rows["mechanism"]):
        part = rows[rows["mechanism"] == mech]
        ax_t.scatter(part["flops"], part["median_s"] * 1e3, s=14, label=mech,
                     color=STYLE.get(mech, ("#555",))[0], marker=STYLE.get(mech, ("", "o"))[1])
    _log(ax_t)
    ax_t.set_xlabel("FLOP model (FLOPs per step)")
    ax_t.set_ylabel("measured median step time (ms)")
    ax_t.set_title("time vs FLOP model", fontsize=10)
    ax_t.grid(True, which="both", alpha=0.25)
    if not pairs.empty:
        for (variant, baseline), part in pairs.groupby(["mechanism", "baseline"], sort=False):
            measured = part["measured_speedup"].to_numpy(float)
            spread = (pd.to_numeric(part["ratio_spread"], errors="coerce").fillna(0.0).to_numpy(float)
                      if "ratio_spread" in part else np.zeros_like(measured))
            ax_s.errorbar(part["predicted_speedup"], measured, yerr=[measured * np.minimum(spread, 0.9),
                                                                     measured * spread],
                          fmt=STYLE.get(variant, ("", "o"))[1], markersize=4, elinewidth=0.8, capsize=0,
                          label=f"{variant} vs {baseline}", color=STYLE.get(baseline, ("#555",))[0])
        lo = float(min(pairs["predicted_speedup"].min(), pairs["measured_speedup"].min())) / 1.5
        hi = float(max(pairs["predicted_speedup"].max(), pairs["measured_speedup"].max())) * 1.5
        ax_s.plot([lo, hi], [lo, hi], "--", color="#999999", linewidth=0.9)
        ax_s.fill_between([lo, 1], 1, hi, color="#f4cccc", alpha=0.4, linewidth=0)
        ax_s.fill_between([1, hi], lo, 1, color="#f4cccc", alpha=0.4, linewidth=0)
        ax_s.set_xlim(lo, hi)
        ax_s.set_ylim(lo, hi)
        _log(ax_s)
    ax_s.set_xlabel("predicted speedup\n(baseline FLOPs / FLuRKA FLOPs)")
    ax_s.set_ylabel("measured speedup\n(baseline time / FLuRKA time)")
    ax_s.set_title("FLuRKA speedups: FLOP model vs measured", fontsize=10)
    ax_s.grid(True, which="both", alpha=0.25)
    _legend(fig, fig.axes)
    return fig


def floor_ratios(table: pd.DataFrame) -> Figure:
    """One panel per mode: each mechanism's (and execution's) step time over its floor as a bar
    (``flurka.results.speed_tables.floor_frame``) with its p10–p90 as an error bar, the targets
    its layers are held to as dashed lines."""
    modes = list(dict.fromkeys(table.index.get_level_values("mode")))
    rows = max(len(table.xs(m, level="mode")) for m in modes)
    fig, axes = _panels(len(modes), height=1.0 + 0.24 * rows)
    for ax, mode in zip(axes, modes):
        part = table.xs(mode, level="mode")
        y = np.arange(len(part))
        colours = [STYLE.get(m, ("#555555",))[0] for m in part.index.get_level_values("mechanism")]
        ratios = part["× floor"].to_numpy(float)
        low, high = (part.get(f"{q} (× floor)", pd.Series(float("nan"), index=part.index)).to_numpy(float)
                     for q in ("p10", "p90"))
        spread = np.isfinite(low) & np.isfinite(high)
        ax.barh(y, ratios, color=colours, height=0.7)
        if spread.any():
            ax.errorbar(ratios[spread], y[spread], xerr=[np.maximum(ratios - low, 0)[spread],
                                                         np.maximum(high - ratios, 0)[spread]],
                        fmt="none", ecolor="#222222", elinewidth=0.8, capsize=2, label="p10–p90")
        ends = np.where(spread, np.fmax(high, ratios), ratios)
        for yi, r, end in zip(y, ratios, ends):
            ax.annotate(f"{r:.2f}", xy=(end, yi), xytext=(2, 0), textcoords="offset points", va="center", fontsize=7)
        ax.set_yticks(y, [f"{m} ({e})" for m, e in part.index], fontsize=7)
        ax.set_ylim(rows - 0.5, -0.5)  # every panel's bars as thick as the fullest's, top down
        targets = sorted(set(part["target (× floor)"].dropna()))
        for target in targets:
            ax.axvline(target, color="#555555", linestyle="--", linewidth=0.9)
            ax.annotate(f"{target:g}×", xy=(target, 1.0), xycoords=("data", "axes fraction"), ha="center",
                        va="bottom", fontsize=7)
        ax.axvline(1.0, color="#999999", linewidth=0.8)
        ax.set_xlim(0, max(float(np.nanmax(ends)), *targets, 1.0) * 1.15)
        ax.set_xlabel("median step time / floor")
        ax.set_title(mode, fontsize=10, pad=12 if targets else 6)
        ax.grid(True, axis="x", alpha=0.25)
    return fig


KIND_COLOURS = {"gemm": "#1f5fbf", "attention": "#8c8c8c", "pallas": "#1a9850", "reduction": "#d95f02",
                "elementwise": "#ff8c00", "copy": "#b8860b", "other": "#cccccc"}


def time_split(rows: pd.DataFrame, kinds) -> Figure:
    """Where each profiled step's time goes: one horizontal bar per measurement (its median step
    time), split by the share of traced device time of each kind."""
    labels = rows["label"].tolist()
    fig = Figure(figsize=(8.6, 1.2 + 0.28 * len(rows)), layout="constrained")
    ax = fig.subplots()
    left = np.zeros(len(rows))
    for kind in kinds:
        ms = rows["median_s"].to_numpy(float) * 1e3 * rows[f"share_{kind}"].to_numpy(float)
        if ms.any():
            ax.barh(np.arange(len(rows)), ms, left=left, color=KIND_COLOURS.get(kind, "#555"), label=kind)
            left += ms
    ax.set_yticks(np.arange(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("median step time (ms), split by traced device time per kind")
    ax.grid(True, axis="x", alpha=0.25)
    _legend(fig, [ax])
    return fig
