"""Every figure of the report is legible as drawn: on the synthetic data set and on every result
recorded in the repository (benchmarks/results/: real step times over one to five decades, one-N
training panels), each figure's text stays on the canvas, no two tick labels of an axis collide,
ticks read as plain numbers (no 10^k powers or "6×10¹" minor labels), every log axis has at least
two labelled ticks, and no axis label runs into its panel's title. On the main job's database:
the α figure's CI bands and colours, the loss-vs-FLOPs figure's mean curves and FLOP unit."""

from __future__ import annotations

import colorsys
import json
import re

import matplotlib
import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from flurka.reports import figures, sections, sources  # noqa: E402
from flurka.catalogue.mechanisms import KERNEL_OF  # noqa: E402
from flurka.results import connect, ingest_file, open_results, quality_tables  # noqa: E402
from testsupport import RECORDED  # noqa: E402

RESULT_FILES = sorted(p for p in RECORDED.rglob("*.json")
                      if str(json.loads(p.read_text()).get("schema", "")).startswith(("flurka.speed/", "flurka.theory/")))
SLACK = 0.5  # pixels two boxes may share before they count as overlapping


def _plots(url: str, theory=()) -> list[sections.Plot]:
    engine = open_results(url)
    try:
        built = sections.build_sections(engine, sources.load_theory(theory))
    finally:
        engine.dispose()
    return [i for s in built for i in s.items if isinstance(i, sections.Plot)]


@pytest.fixture(scope="module")
def recorded_plots(tmp_path_factory) -> list[sections.Plot]:
    url = f"sqlite:///{tmp_path_factory.mktemp('recorded') / 'results.db'}"
    engine = open_results(url)
    try:
        for path in RESULT_FILES:
            ingest_file(engine, path)
    finally:
        engine.dispose()
    return _plots(url)


@pytest.fixture(scope="module")
def synthetic_plots(populated) -> list[sections.Plot]:
    url, theory = populated
    return _plots(url, [theory])


def _shrunk(box):
    return box.expanded(1.0, 1.0).padded(-SLACK)


def _shown_ticklabels(ax, name: str) -> list:
    """The tick labels drawn on ``ax``'s x or y axis: visible, non-empty and inside its view."""
    axis = getattr(ax, f"{name}axis")
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) * 1e-9
    return [t for t in axis.get_ticklabels(which="both")
            if t.get_visible() and t.get_text() and lo - span <= t.get_position()[0 if name == "x" else 1] <= hi + span]


def legibility_problems(plot: sections.Plot) -> list[str]:
    """What a reader of the drawn figure would trip over, one line each (empty: legible)."""
    fig = plot.fig
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox.padded(SLACK)
    problems = []
    for ax in (a for a in fig.axes if a.get_visible()):
        where = f"{plot.key} [{ax.get_title()}]"
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label]
        for name in "xy":
            labels = _shown_ticklabels(ax, name)
            texts += labels
            if any("$" in t.get_text() for t in labels):
                problems.append(f"{where}: {name} ticks as powers: {[t.get_text() for t in labels]}")
            if getattr(ax, f"get_{name}scale")() == "log" and len(labels) < 2:
                problems.append(f"{where}: log {name} axis with {len(labels)} labelled tick(s)")
            boxes = sorted((t.get_window_extent(renderer) for t in labels),
                           key=lambda b: b.x0 if name == "x" else b.y0)
            for a, b in zip(boxes, boxes[1:]):
                if _shrunk(a).overlaps(_shrunk(b)):
                    problems.append(f"{where}: {name} tick labels collide: "
                                    f"{[t.get_text() for t in labels]}")
                    break
        for label in (ax.xaxis.label, ax.yaxis.label):
            if label.get_text() and ax.title.get_text() and _shrunk(label.get_window_extent(renderer)).overlaps(
                    _shrunk(ax.title.get_window_extent(renderer))):
                problems.append(f"{where}: axis label {label.get_text()!r} runs into the title")
        for t in texts:
            if t.get_visible() and t.get_text():
                box = t.get_window_extent(renderer)
                if not (canvas.x0 <= box.x0 and box.x1 <= canvas.x1 and canvas.y0 <= box.y0 and box.y1 <= canvas.y1):
                    problems.append(f"{where}: {t.get_text()!r} runs off the figure")
    return problems


def test_recorded_results_draw_legible_figures(recorded_plots):
    assert len(recorded_plots) >= 15, [p.key for p in recorded_plots]
    problems = [line for p in recorded_plots for line in legibility_problems(p)]
    assert not problems, "\n".join(problems)


def test_synthetic_results_draw_legible_figures(synthetic_plots):
    families = ("loss-vs-flops-", "uptraining-", "speed-n-", "speed-dk-", "speed-dmodel-", "speedups-", "error-",
                "rank-", "flops-", "profiles-", "floor-")
    assert {f for f in families if any(p.key.startswith(f) for p in synthetic_plots)} == set(families)
    problems = [line for p in synthetic_plots for line in legibility_problems(p)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("value, label", [
    (0, "0"), (0.25, "0.25"), (1.5, "1.5"), (300, "300"), (1024, "1024"), (2000, "2k"), (1.2 * 1000, "1.2k"),
    (55500, "55.5k"), (52608, "52608"), (2e12, "2T"), (3.5e13, "35T"), (1.5e18, "1.5E")])
def test_tick_labels_are_plain_numbers(value, label):
    assert figures.plain_number(value) == label


@pytest.mark.parametrize("lo, hi", [(0.5, 300.0), (14.4, 22.9), (2e3, 5.55e4), (1.5e12, 6e13), (1e3, 1e30)])
def test_log_ticks_keep_the_labels_apart(lo, hi):
    """On a drawn 4 × 3 inch panel: at least two labelled ticks per axis, none closer to the next
    than the locator's gap (30 points across, 16 up)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.plot([lo, hi], [lo, hi])
    figures._log(ax)
    FigureCanvasAgg(fig).draw()
    for name, gap in (("x", 30), ("y", 16)):
        axis = getattr(ax, f"{name}axis")
        ticks = [t for t in axis.get_majorticklocs() if lo <= t <= hi]
        at = [ax.transData.transform((t, t))[0 if name == "x" else 1] * 72 / fig.dpi for t in ticks]
        assert len(ticks) >= 2, (name, ticks)
        assert min(abs(b - a) for a, b in zip(at, at[1:])) >= gap - 1e-6, (name, ticks)


def test_a_panel_not_laid_out_yet_still_gets_ticks():
    from matplotlib.figure import Figure

    ax = Figure(figsize=(0.01, 0.01)).subplots()
    ax.plot([1.0, 1e6], [1.0, 2.0])
    figures._log(ax, "x")
    assert len(ax.xaxis.get_major_locator()()) >= 1


def test_measured_speedups_carry_their_spread():
    """The predicted-vs-measured panel draws each measured ratio r with a bar from r(1 − w) to
    r(1 + w), w its ``ratio_spread`` (none where a pair has no spread)."""
    rows = pd.DataFrame({"mechanism": ["rnn", "flurka-rnn"], "flops": [2e12, 1e12], "median_s": [0.02, 0.01]})
    pairs = pd.DataFrame({"mechanism": ["flurka-rnn"] * 3, "baseline": ["rnn"] * 3,
                          "predicted_speedup": [1.2, 1.5, 2.0], "measured_speedup": [1.1, 1.4, 2.2],
                          "ratio_spread": [0.05, None, 0.2]})
    fig = figures.flops_vs_measured(rows, pairs)
    (bars,) = [c for c in fig.axes[1].containers if c.has_yerr]
    segments = np.array(bars.lines[2][0].get_segments())       # (point, end, xy)
    r, w = np.array([1.1, 1.4, 2.2]), np.array([0.05, 0.0, 0.2])
    assert np.allclose(segments[:, 0, 1], r * (1 - w)) and np.allclose(segments[:, 1, 1], r * (1 + w))
    assert np.allclose(segments[:, 0, 0], [1.2, 1.5, 2.0])
    assert not legibility_problems(sections.Plot("flops-bars", "t", "c", fig))


def _speed_rows(points):
    """Speed rows as :func:`flurka.reports.sources.combine_runs` gives them: (mechanism, N, median,
    p10, p90) in seconds, one forward layer panel."""
    return pd.DataFrame([{"mechanism": m, "N": n, "mode": "forward", "scope": "layer", "status": "ok",
                          "median_s": t, "p10_s": lo, "p90_s": hi, "spread_s": hi - lo} for m, n, t, lo, hi in points])


def _band_vertices(ax, mech):
    """The y range of ``mech``'s band at each x: rows (x, low, high), x ascending."""
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)
               and np.allclose(c.get_facecolor()[0][:3], to_rgb(figures.STYLE[mech][0]))]
    out = {}
    for x, y in band.get_paths()[0].vertices:
        lo, hi = out.get(round(x, 6), (np.inf, -np.inf))
        out[round(x, 6)] = (min(lo, y), max(hi, y))
    return np.array([(x, *out[x]) for x in sorted(out)])


def test_speed_figures_draw_each_points_p10_p90():
    """Step times in ms inside their p10–p90 band; as speedups over full, each ratio r in
    r·(1 ± w), w half the two times' p10–p90 widths over their medians (the tables' tie rule); a
    panel of one N, which a band cannot show, as an error bar from p10 to p90."""
    rows = _speed_rows([("full", 1024, 0.010, 0.009, 0.012), ("full", 4096, 0.080, 0.078, 0.090),
                        ("rnn", 1024, 0.004, 0.0038, 0.0041), ("rnn", 4096, 0.010, 0.0095, 0.013)])
    ax = figures.speed_vs_axis(rows, "N").axes[0]
    assert _band_vertices(ax, "rnn") == pytest.approx(np.array([[1024, 3.8, 4.1], [4096, 9.5, 13.0]]))
    assert _band_vertices(ax, "full") == pytest.approx(np.array([[1024, 9.0, 12.0], [4096, 78.0, 90.0]]))
    ax = figures.speed_vs_axis(rows, "N", speedup_over="full").axes[0]
    expected = []
    for n, (full, rnn) in {1024: ((0.010, 0.003), (0.004, 0.0003)), 4096: ((0.080, 0.012), (0.010, 0.0035))}.items():
        r, w = full[0] / rnn[0], (full[1] / full[0] + rnn[1] / rnn[0]) / 2
        expected.append([n, r * (1 - w), r * (1 + w)])
    assert _band_vertices(ax, "rnn") == pytest.approx(np.array(expected))
    one = figures.speed_vs_axis(_speed_rows([("rnn", 1024, 0.004, 0.0038, 0.0041)]), "N").axes[0]
    (bar,) = [c for c in one.containers if getattr(c, "has_yerr", False)]
    assert np.array(bar.lines[2][0].get_segments())[0, :, 1] == pytest.approx([3.8, 4.1])


def test_speedup_figure_draws_each_ratio_in_its_spread():
    """The speedups figure reads each ratio's spread w from the table's ``attrs["spread"]``
    (:func:`flurka.results.speed_tables.speedup_table`) and shades r·(1 ± w)."""
    index = pd.MultiIndex.from_tuples([("flurka-rnn", 1024), ("flurka-rnn", 4096)], names=["variant", "N"])
    table = pd.DataFrame({"vs low-rank": [1.5, 2.0], "vs kernel": [1.1, 1.2]}, index=index)
    table.attrs["spread"] = pd.DataFrame({"vs low-rank": [0.1, 0.05], "vs kernel": [0.02, float("nan")]}, index=index)
    ax = figures.speedups({"forward, layer scope": table}).axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1    # vs kernel has one spread only: its one point is an error bar
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert (ys.min(), ys.max()) == pytest.approx((1.5 * 0.9, 2.0 * 1.05))
    (bar,) = [c for c in ax.containers if getattr(c, "has_yerr", False)]
    assert np.array(bar.lines[2][0].get_segments())[0, :, 1] == pytest.approx([1.1 * 0.98, 1.1 * 1.02])


def test_floor_figure_bars_carry_their_p10_p90():
    table = pd.DataFrame({"mode": ["forward"] * 2, "mechanism": ["rnn", "flurka-rnn"], "execution": ["plain"] * 2,
                          "× floor": [1.8, 1.4], "p10 (× floor)": [1.7, 1.35], "p90 (× floor)": [2.1, 1.5],
                          "target (× floor)": [2.0, 1.5]}).set_index(["mode", "mechanism", "execution"])
    ax = figures.floor_ratios(table).axes[0]
    (bar,) = [c for c in ax.containers if getattr(c, "has_xerr", False)]
    segments = np.array(bar.lines[2][0].get_segments())   # (bar, end, xy)
    assert segments[:, :, 0] == pytest.approx(np.array([[1.7, 2.1], [1.35, 1.5]]))
    assert not legibility_problems(sections.Plot("floor-bars", "t", "c", ax.figure))


@pytest.fixture(scope="module")
def main_job_plots(main_job) -> dict[str, sections.Plot]:
    return {p.key: p for p in _plots(main_job)}


def test_main_job_figures_are_legible(main_job_plots):
    assert sorted(main_job_plots) == ["loss-vs-flops-nmt-small", "uptraining-nmt-small-fig"]
    problems = [line for p in main_job_plots.values() for line in legibility_problems(p)]
    assert not problems, "\n".join(problems)


def _legend_texts(fig) -> list[str]:
    """The figure's one legend (no panel has its own), its entries at least 8 pt, none twice."""
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    texts = fig.legends[0].get_texts()
    assert all(t.get_fontsize() >= 8 for t in texts)
    labels = [t.get_text() for t in texts]
    assert len(set(labels)) == len(labels), labels
    return labels


def _hue(colour) -> float:
    return colorsys.rgb_to_hsv(*to_rgb(colour))[0]


def _band_of(ax, line):
    """The fill_between band (a PolyCollection) drawn in ``line``'s colour."""
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)
             and np.allclose(c.get_facecolor()[0][:3], to_rgb(line.get_color()))]
    assert len(bands) == 1, (line.get_label(), len(bands))
    return bands[0].get_paths()[0].vertices


def test_alpha_figure_has_a_ci_band_per_variant_and_tells_it_from_its_kernel(main_job_plots):
    """One panel per (variant, d_k). In each: the variant's mean against α inside its own CI
    band (a band with height at every α), its kernel and Linformer as lines with bands of their
    own, the variant and its kernel in different hues, Linformer a third, and the legend naming
    the variant, its kernel and Linformer at the panel's d_k."""
    fig = main_job_plots["uptraining-nmt-small-fig"].fig
    axes = [a for a in fig.axes if a.get_visible()]
    assert sorted(a.get_title() for a in axes) == ["flurka-performer, d_k=16", "flurka-performer, d_k=32",
                                                   "flurka-rnn, d_k=16", "flurka-rnn, d_k=32"]
    for ax in axes:
        variant, d_k = ax.get_title().split(", ")
        kernel = KERNEL_OF[variant]
        lines = {line.get_label(): line for line in ax.get_lines()}
        own = next(v for k, v in lines.items() if k.startswith(f"{variant}: up-trained"))
        ref_k = next(v for k, v in lines.items() if k.startswith(f"{kernel}: kernel"))
        ref_l = next(v for k, v in lines.items() if k.startswith(f"linformer {d_k}: low-rank"))
        band = _band_of(ax, own)
        for x, y in zip(own.get_xdata(), own.get_ydata()):
            at = band[np.isclose(band[:, 0], x), 1]
            assert at.min() < y < at.max(), (ax.get_title(), x, y, at)
        for ref in (ref_k, ref_l):
            ref_band = _band_of(ax, ref)
            assert ref_band[:, 1].min() < ref.get_ydata()[0] < ref_band[:, 1].max()
        hues = [_hue(line.get_color()) for line in (own, ref_k, ref_l)]
        gaps = [min(abs(a - b), 1 - abs(a - b)) for a, b in ((hues[0], hues[1]), (hues[0], hues[2]), (hues[1], hues[2]))]
        assert min(gaps) > 0.15, (ax.get_title(), [own.get_color(), ref_k.get_color(), ref_l.get_color()])
        legend = _legend_texts(fig)
        assert any(t.startswith(f"{variant}: up-trained (n=3)") for t in legend), legend
        assert any(t.startswith(f"{kernel}: kernel") for t in legend) and any(t.startswith(f"linformer {d_k}") for t in legend)


def test_alpha_figure_draws_the_raw_trials_means_and_t_intervals(main_job_plots, main_job):
    """The α figure's numbers against the raw trials: in each panel the variant's line at α is
    the seeds' mean, its band spans scipy's 95 % t interval, Linformer's line and band those of
    its seeds at the panel's d_k, and the one star sits at the row's best α by mean."""
    from scipy import stats as st

    engine = connect(main_job)
    raw = pd.read_sql("SELECT t.attention, t.alpha, t.d_k, t.seed, m.value FROM trials t JOIN metrics m "
                      "ON m.trial_id = t.id WHERE m.name = 'bleu'", engine)
    engine.dispose()

    def interval(values):
        values = np.asarray(values, dtype=float)
        return (values.mean(), *st.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=st.sem(values)))

    fig = main_job_plots["uptraining-nmt-small-fig"].fig
    for ax in [a for a in fig.axes if a.get_visible()]:
        variant, d_k = ax.get_title().split(", ")
        d_k = int(d_k.removeprefix("d_k="))
        lines = {line.get_label(): line for line in ax.get_lines()}
        own = next(v for k, v in lines.items() if k.startswith(f"{variant}: up-trained"))
        band = _band_of(ax, own)
        mine = raw[(raw["attention"] == variant) & (raw["d_k"] == d_k)]
        means = {}
        for x, y in zip(own.get_xdata(), own.get_ydata()):
            mean, low, high = interval(mine.loc[np.isclose(mine["alpha"] * 100, x), "value"])
            at = band[np.isclose(band[:, 0], x), 1]
            assert y == pytest.approx(mean) and (at.min(), at.max()) == (pytest.approx(low), pytest.approx(high))
            means[x] = mean
        low_rank = next(v for k, v in lines.items() if k.startswith(f"linformer d_k={d_k}: low-rank"))
        mean, low, high = interval(raw.loc[(raw["attention"] == "linformer") & (raw["d_k"] == d_k), "value"])
        ref_band = _band_of(ax, low_rank)[:, 1]
        assert low_rank.get_ydata()[0] == pytest.approx(mean)
        assert (ref_band.min(), ref_band.max()) == (pytest.approx(low), pytest.approx(high))
        stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
        assert len(stars) == 1
        best = max(means, key=means.get)
        assert (stars[0].get_xdata()[0], stars[0].get_ydata()[0]) == (pytest.approx(best), pytest.approx(means[best]))
        assert stars[0].get_label() == figures.BEST_ALPHA_LABEL


def _main_curves(main_job) -> pd.DataFrame:
    engine = connect(main_job)
    try:
        return quality_tables.curves(engine, "nmt-small", ["loss", "train_flops"])
    finally:
        engine.dispose()


def _mean_lines(ax) -> list:
    """The panel's labelled curves (seed means): not the faint seeds, fork dots or the target."""
    return [line for line in ax.get_lines() if not line.get_label().startswith(("_", "target"))]


def test_loss_vs_flops_draws_a_mean_curve_per_mechanism_in_readable_flops(main_job_plots, main_job):
    """From scratch: one bold curve per mechanism (and d_k), the mean of its three seeds (drawn
    faint), read back from the database; each up-trained variant's α branches in a row of their
    own; FLOPs in the SI unit the data calls for (600 steps at ~1.5e11: TFLOP), tick labels plain
    numbers and no offset text on either axis; one legend for the figure, 8 pt, each entry once."""
    fig = main_job_plots["loss-vs-flops-nmt-small"].fig
    FigureCanvasAgg(fig).draw()
    scratch, *branches = fig.axes
    for ax in fig.axes:
        assert ax.get_xlabel() == "training FLOPs (TFLOP)"
        assert ax.xaxis.get_offset_text().get_text() == "" and ax.yaxis.get_offset_text().get_text() == ""
        ticks = [t.get_text() for t in _shown_ticklabels(ax, "x")]
        assert len(ticks) >= 3 and all(re.fullmatch(r"\d+(\.\d+)?", t) for t in ticks), ticks
    bold = {line.get_label().split(" (")[0]: line for line in _mean_lines(scratch)}
    assert sorted(bold) == ["eva", "full", "linformer d_k=16", "linformer d_k=32", "performer", "rnn"]
    assert all(line.get_linewidth() >= 1.5 and line.get_label().endswith("(mean of 3 seeds)") for line in bold.values())
    faint = [line for line in scratch.get_lines() if (line.get_alpha() or 1) < 0.5]
    assert len(faint) == 6 * 3 and all(line.get_linewidth() < 1 for line in faint)
    curves = _main_curves(main_job)
    for label, query in (("full", "attention == 'full'"), ("linformer d_k=32", "attention == 'linformer' and d_k == 32")):
        want = curves.query(query).groupby("step")[["train_flops", "loss"]].mean()
        assert curves.query(query)["trial_id"].nunique() == 3
        assert np.allclose(bold[label].get_xdata(), want["train_flops"] / 1e12)
        assert np.allclose(bold[label].get_ydata(), want["loss"])
    assert max(max(line.get_xdata()) for line in scratch.get_lines()) == pytest.approx(144, rel=0.01)
    rows = [ax for ax in branches if "α branches" in ax.get_title()]
    assert [ax.get_title().split(" ")[0] for ax in rows] == ["flurka-performer", "flurka-rnn"]
    for ax in rows:
        labels = [line.get_label() for line in _mean_lines(ax)]
        assert sum(label.startswith("α = ") for label in labels) == 4 * 2     # 4 α × 2 d_k, each a seed mean
        assert {"linformer d_k=16 (mean of 3 seeds)", "linformer d_k=32 (mean of 3 seeds)"} <= set(labels)
    legend = _legend_texts(fig)     # the curves once each (α entries shared by both rows), then what explains them
    assert sum(t.startswith("α = ") for t in legend) == 4 * 2
    assert legend[-2:] == ["target: full attention's final train loss, 0.3177", figures.CURVE_BAND_LABEL]


def test_loss_vs_flops_names_its_loss_and_holds_every_curve(main_job_plots):
    """The y axis says which loss and that it is log-scaled; no mean curve leaves its panel: every
    point of every curve inside the panel's x range lies inside its y limits (the issue's curves
    ran above the top tick and off the panel)."""
    fig = main_job_plots["loss-vs-flops-nmt-small"].fig
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
        assert ax.get_yscale() == "log"
        if ax.get_subplotspec().is_first_col():
            assert ax.get_ylabel() == "train loss (log scale)"
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        lines = _mean_lines(ax)
        assert lines
        for line in lines:
            x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
            inside = y[(x >= x0) & (x <= x1)]
            assert inside.size and y0 < inside.min() and inside.max() < y1, (ax.get_title(), line.get_label(),
                                                                             (y0, y1), (inside.min(), inside.max()))


def _curve_band(ax, line):
    """The CI band (a PolyCollection) drawn in ``line``'s colour, as (x, low, high) per x point."""
    bands = [c for c in ax.collections if isinstance(c, PolyCollection) and len(c.get_paths())
             and np.allclose(c.get_facecolor()[0][:3], to_rgb(line.get_color()))
             and np.allclose(c.get_paths()[0].vertices[0, 0], line.get_xdata()[0])]
    assert bands, line.get_label()
    vertices = bands[0].get_paths()[0].vertices
    out = {}
    for x, y in vertices:
        lo, hi = out.get(round(float(x), 9), (np.inf, -np.inf))
        out[round(float(x), 9)] = (min(lo, y), max(hi, y))
    return out


def test_loss_vs_flops_bands_are_t_intervals_over_the_seeds(main_job_plots, main_job):
    """Each mean of three seeds sits in a band whose bounds, at a logged step, are scipy's 95 % t
    interval (2 degrees of freedom) of the three seeds' losses there, worked out here from the
    database: full attention from scratch, and an α branch after its fork."""
    fig = main_job_plots["loss-vs-flops-nmt-small"].fig
    curves = _main_curves(main_job)
    scratch = fig.axes[0]
    row = next(ax for ax in fig.axes if ax.get_title().startswith("flurka-rnn from"))
    for ax, label, query in (
            (scratch, "full (mean of 3 seeds)", "attention == 'full'"),
            (row, "α = 50%, d_k=32 (mean of 3 seeds)", "attention == 'flurka-rnn' and d_k == 32 and alpha == 0.5")):
        line = next(line for line in ax.get_lines() if line.get_label() == label)
        band = _curve_band(ax, line)
        raw = curves.query(query)
        assert raw["trial_id"].nunique() == 3
        checked = 0
        for step in (400, 500, 600):
            at = raw[raw["step"] == step]
            values = at["loss"].to_numpy(float)
            low, high = st.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=st.sem(values))
            x = round(float(at["train_flops"].mean() / 1e12), 9)
            assert x in band, (label, step)
            assert band[x] == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
            assert low < np.interp(x, line.get_xdata(), line.get_ydata()) < high
            checked += 1
        assert checked == 3


def test_loss_vs_flops_branches_start_at_their_fork_in_a_window_that_shows_them(main_job_plots, main_job):
    """An α branch is drawn from its fork on (before it, it is its base's curve); a variant's row
    starts shortly before its earliest fork's FLOPs, not at 0; where the last branch would still be
    a sliver (α = 75 % of flurka-rnn) a right-hand panel starts shortly before the last fork."""
    fig = main_job_plots["loss-vs-flops-nmt-small"].fig
    curves = _main_curves(main_job)
    for variant in ("flurka-performer", "flurka-rnn"):
        ax = next(a for a in fig.axes if a.get_title().startswith(f"{variant} from"))
        forks = {}
        for alpha in (0.25, 0.375, 0.5, 0.75):
            part = curves.query(f"attention == '{variant}' and d_k == 16 and alpha == {alpha}")
            fork = part[part["step"] == round(alpha * 600)]["train_flops"].mean() / 1e12
            line = next(line for line in ax.get_lines() if line.get_label() == f"α = {alpha * 100:g}%, d_k=16 (mean of 3 seeds)")
            assert line.get_xdata()[0] == pytest.approx(fork)
            forks[alpha] = fork
        left, right = ax.get_xlim()
        assert forks[0.25] - 0.1 * (right - forks[0.25]) < left < forks[0.25]
    end = next(a for a in fig.axes if a.get_title() == "flurka-rnn: from the last fork")
    last = curves.query("attention == 'flurka-rnn' and alpha == 0.75 and step == 450")["train_flops"].mean() / 1e12
    assert last - 0.15 * (end.get_xlim()[1] - last) < end.get_xlim()[0] < last


def test_loss_vs_flops_of_one_seed_says_so_and_draws_no_band(synthetic_plots):
    """The synthetic data set trains each curve once: its labels say "1 seed", and no CI band is
    drawn (one value has no interval)."""
    fig = next(p for p in synthetic_plots if p.key == "loss-vs-flops-nmt-wmt14-ende").fig
    (ax,) = fig.axes
    labels = [line.get_label() for line in _mean_lines(ax)]
    assert labels and all(label.endswith("(1 seed)") for label in labels), labels
    assert not [c for c in ax.collections if isinstance(c, PolyCollection) and len(c.get_paths())]
    assert figures.CURVE_BAND_LABEL not in _legend_texts(fig)


@pytest.mark.parametrize("largest, unit", [(4.2e11, "GFLOP"), (1.44e14, "TFLOP"), (9.99e14, "TFLOP"),
                                           (1e15, "PFLOP"), (2.4e19, "EFLOP"), (512.0, "FLOP")])
def test_flop_unit_is_chosen_from_the_data(largest, unit):
    scale, name = figures.flop_unit(largest)
    assert name == unit and 1 <= largest / scale < 1000


def test_mean_curve_interpolates_seeds_on_a_common_grid():
    """Two seeds logged at different FLOPs: the mean is taken on the range both cover, each seed
    interpolated there (at 10: seed 1 logged 2.0, seed 2 lies halfway from 3 at 5 to 2 at 15)."""
    part = pd.DataFrame({"trial_id": [1] * 3 + [2] * 3, "step": [1, 2, 3] * 2,
                         "train_flops": [0.0, 10, 20, 5, 15, 25], "loss": [3.0, 2, 1, 3, 2, 1]})
    grid, mean, runs = figures.mean_curve(part, "loss")
    assert (grid[0], grid[-1], len(runs)) == (5, 20, 2)
    assert np.interp(10, grid, mean) == pytest.approx((2.0 + 2.5) / 2)


def test_alpha_figure_with_one_alpha_draws_its_ci_as_an_error_bar():
    """A sweep of one α per row (the main job): the point's 95 % CI as an error bar (a band over
    one α has no width), no "best α" star (one cell compares nothing)."""
    rows = []
    for d_k, shift in ((8, 0.0), (16, 1.0)):
        for column, mech, alpha, mean in (("kernel", "performer", None, 94.0), ("low-rank", "linformer", None, 95.0),
                                          ("37.5%", "flurka-performer", 0.375, 95.5)):
            rows.append({"variant": "flurka-performer", "d_k": d_k, "column": column, "mechanism": mech,
                         "alpha": alpha, "mean": mean + shift, "low": mean + shift - 0.6,
                         "high": mean + shift + 0.6, "n": 3, "best": alpha is not None})
    fig = figures.uptraining(pd.DataFrame(rows), label="BLEU")
    axes = [a for a in fig.axes if a.get_visible()]
    assert sorted(a.get_title() for a in axes) == ["flurka-performer, d_k=16", "flurka-performer, d_k=8"]
    for ax, shift in zip(sorted(axes, key=lambda a: a.get_title().endswith("d_k=16")), (0.0, 1.0)):
        (bar,) = [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
        (segment,) = bar.lines[2][0].get_segments()
        np.testing.assert_allclose(segment, [[37.5, 94.9 + shift], [37.5, 96.1 + shift]])
        assert not [line for line in ax.get_lines() if line.get_marker() == "*"]
        assert ax.get_legend() is None
    assert "bar and bands: 95 % CI over seeds" in _legend_texts(fig)
