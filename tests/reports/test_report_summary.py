"""Issue 59's report: each caption once; the tables the sweep prints at its end (Table 5 on the
eval loss, the quality table) in the report with the numbers their builders give; a star in a
caption only where the figure draws one; the loss figure's promise of FLOPs-to-target kept or
not made."""

from __future__ import annotations

import html as H
import re

import pytest

from flurka.configs import get_config, metric_label
from flurka.reports import build_report, figures
from flurka.results import connect, quality_tables

SWEEP = "uptrain-small-test"   # the main job fixture's sweep id


@pytest.fixture(scope="module")
def main_report(main_job, tmp_path_factory):
    return build_report(main_job, tmp_path_factory.mktemp("summary") / "report").read_text()


def _figure(page: str, key: str) -> str:
    found = re.search(rf'<figure class="[^"]*" id="{re.escape(key)}">(.*?)</figure>', page, re.S)
    assert found, key
    return found.group(1)


def _table(page: str, key: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the HTML table of the report item ``key``, as the page shows them."""
    body = _figure(page, key)
    rows = [[H.unescape(c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]
    return rows[0], rows[1:]


def _same_table(page: str, key: str, built) -> None:
    """The page's table ``key`` is ``built``: its header, its row labels and every text cell."""
    header, rows = _table(page, key)
    flat = built.reset_index()
    assert header == [str(c) for c in flat.columns]
    assert len(rows) == len(flat)
    for shown, (_, want) in zip(rows, flat.iterrows()):
        for column, cell in zip(flat.columns, shown):
            value = want[column]
            if isinstance(value, str):
                assert cell == value, (key, column, cell, value)
            elif value == value and value is not None:
                assert float(cell) == pytest.approx(float(value), abs=0.5 * 10 ** -2), (key, column, cell, value)


def test_each_caption_appears_once(main_report):
    """Every caption of the page, the sweep's long provenance sentence among them, occurs in the
    HTML exactly once (not under every table and figure of the sweep)."""
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", main_report, re.S)
    assert len(captions) >= 8
    for caption in captions:
        assert main_report.count(caption) == 1, caption
    provenance = re.match(r"Device: .*?ok trials\.", captions[0])
    assert provenance and main_report.count(provenance.group(0)) == 1, captions[0]
    assert main_report.count(f"sweep &#x27;uptrain-small&#x27; ({SWEEP}") == 1


def test_the_sweeps_eval_loss_table_is_in_the_report(main_report, main_job):
    """Table 5 on the eval loss, which the sweep prints at its end: the builder the sweep's summary
    calls (``uptraining_table`` with metric "loss", for its sweep) gives the page's cells."""
    engine = connect(main_job)
    try:
        built = quality_tables.uptraining_table(engine, benchmark="nmt-small", metric="loss", sweep=SWEEP)
    finally:
        engine.dispose()
    assert "eval loss" in built.attrs["title"]
    _same_table(main_report, "uptraining-nmt-small-loss", built)
    header, rows = _table(main_report, "uptraining-nmt-small-loss")
    assert any("±" in cell and "(n=3)" in cell for row in rows for cell in row)
    assert "eval loss" in _figure(main_report, "uptraining-nmt-small-loss")


def test_the_sweeps_quality_table_is_in_the_report(main_report, main_job):
    """The quality table the sweep prints: ``metric_table`` over the benchmark's reported metrics,
    its columns named as the sweep's summary names them, the page's cells its cells."""
    columns = [(f"nmt-small: {metric_label(m, 'nmt-small')}", "nmt-small", m)
               for m in get_config("nmt-small").reported_metrics]
    engine = connect(main_job)
    try:
        built = quality_tables.metric_table(engine, columns, sweep=SWEEP)
    finally:
        engine.dispose()
    assert list(built.columns) == ["nmt-small: BLEU (char, 0–100)"]
    _same_table(main_report, "uptraining-quality", built)
    header, rows = _table(main_report, "uptraining-quality")
    assert {row[0] for row in rows} >= {"full", "linformer", "performer", "rnn", "eva", "flurka-performer", "flurka-rnn"}


def test_a_star_is_in_the_caption_only_where_the_figure_draws_one(main_report, one_alpha_job, tmp_path):
    """Several α per row: the figure stars each row's best and its caption says so; one α per row
    (nothing to compare): neither star nor word of one."""
    assert "the star: the row&#x27;s best α" in _figure(main_report, "uptraining-nmt-small-fig")
    page = build_report(one_alpha_job, tmp_path / "one").read_text()
    caption = _figure(page, "uptraining-nmt-small-fig")
    assert "star" not in caption and "<figcaption>" in caption
    engine = connect(one_alpha_job)
    try:
        cells = quality_tables.uptraining_stats(engine, benchmark="nmt-small", metric="bleu")
    finally:
        engine.dispose()
    fig = figures.uptraining(cells, "BLEU")
    assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_marker() == "*"]
    assert figures.BEST_ALPHA_LABEL not in [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_flops_to_target_promise_is_kept_or_not_made(main_report, no_full_job, tmp_path):
    """Where full attention was trained the section promises, and shows, the training FLOPs each
    mechanism needs to reach its final loss, and how many seeds get there (full: two of its three
    seeds at their end, the third ends above the three seeds' mean; a mechanism none of whose seeds gets
    there says 0/3, "not reached"); without full attention the promise is not made, and the section
    says why."""
    about = re.search(r'<section id="isoflops"><h2>[^<]*</h2><p class="about">(.*?)</p>', main_report).group(1)
    assert "training FLOPs each mechanism needs to reach full attention" in about
    header, rows = _table(main_report, "isoflops-nmt-small")
    assert header == ["mechanism", "reached", "train loss there", "training FLOPs (TFLOP)"]
    by = {row[0]: row for row in rows}
    flops = re.fullmatch(r"(\d+) ± (\d+) \(n=2\)", by["full"][3])
    assert by["full"][1] == "2/3" and flops and float(flops.group(1)) == pytest.approx(144, rel=0.01)
    assert by["rnn"][1:] == ["0/3", "--", "not reached"]
    assert "how many of its seeds" in _figure(main_report, "isoflops-nmt-small")
    page = build_report(no_full_job, tmp_path / "no-full").read_text()
    about = re.search(r'<section id="isoflops"><h2>[^<]*</h2><p class="about">(.*?)</p>', page).group(1)
    assert "needs to reach" not in about and "No full attention trained on nmt-small: no target loss" in about
    assert 'id="isoflops-nmt-small"' not in page and 'id="loss-vs-flops-nmt-small"' in page
    assert "No full attention trained here: no target loss." in _figure(page, "loss-vs-flops-nmt-small")
