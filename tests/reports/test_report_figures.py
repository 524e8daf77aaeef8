"""Every figure of the report is legible as drawn: on the synthetic data set and on every result
recorded in the repository (benchmarks/results/: real step times over one to five decades, one-N
training panels), each figure's text stays on the canvas, no two tick labels of an axis collide,
ticks read as plain numbers (no 10^k powers or "6×10¹" minor labels), every log axis has at least
two labelled ticks, and no axis label runs into its panel's title."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from flurka.reports import figures, sections, sources  # noqa: E402
from flurka.results import ingest_file, open_results  # noqa: E402
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
