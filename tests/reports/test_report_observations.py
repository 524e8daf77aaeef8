"""The report's observations judge every metric a benchmark reports, not its first alone: on
nmt-list-small (character BLEU and exact match) a variant that wins on BLEU and ties on exact match
is said to do both, each metric's paired tests Holm-adjusted as a family of their own."""

from __future__ import annotations

import html as H
import re

import pandas as pd
import pytest
from scipy import stats as st
from statsmodels.stats.multitest import multipletests

from flurka.configs import get_config, metric_label
from flurka.reports import build_report
from flurka.results import ingest_sweep, open_results

BENCH = "nmt-list-small"
SEEDS = (0, 1, 2)
# per mechanism and seed: BLEU far apart beyond the seeds' spread; exact match (a fraction) all
# within it, no order shared by the seeds
BLEU = {"rnn": (70.0, 70.6, 69.7), "linformer": (80.0, 80.4, 79.9), "flurka-rnn": (90.0, 90.5, 90.1)}
EXACT = {"rnn": (0.50, 0.55, 0.45), "linformer": (0.52, 0.47, 0.50), "flurka-rnn": (0.49, 0.51, 0.53)}
ROW = {"rnn": (None, None), "linformer": (16, None), "flurka-rnn": (16, 0.25)}


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """(index.html text, tables folder) of the report of a one-row nmt-list-small sweep."""
    trials = []
    for mech, (d_k, alpha) in ROW.items():
        for i, seed in enumerate(SEEDS):
            trials.append({"trial_key": f"{mech}/s{seed}", "attention": mech, "benchmark": BENCH, "seed": seed,
                           "status": "ok", "steps": 600, "alpha": alpha, "base": "low-rank" if alpha else None,
                           "d_k": d_k, "num_features": None, "train_flops": 1e14, "wall_time_s": 80.0,
                           "metrics": {"bleu": BLEU[mech][i], "exact_match": EXACT[mech][i]}, "curve": []})
    root = tmp_path_factory.mktemp("observations")
    engine = open_results(f"sqlite:///{root / 'results.db'}")
    ingest_sweep(engine, {"sweep_id": "list-small-1", "name": "uptrain-list-small",
                          "created_at": "2026-12-01T10:00:00+00:00", "git_commit": "abc1234",
                          "environment": {"device": "cpu", "host": "laptop", "versions": {}}, "trials": trials})
    engine.dispose()
    out = root / "report"
    return build_report(f"sqlite:///{root / 'results.db'}", out).read_text(), out / "tables"


def _paired(values: dict, scale: float) -> list[tuple[str, float, float]]:
    """(constituent, raw p, Holm p) of the variant against each constituent on one metric: scipy's
    ttest_rel, statsmodels' Holm over that metric's two tests."""
    x = [v * scale for v in values["flurka-rnn"]]
    raw = [st.ttest_rel(x, [v * scale for v in values[m]]).pvalue for m in ("rnn", "linformer")]
    return list(zip(("rnn", "linformer"), raw, multipletests(raw, method="holm")[1]))


def test_each_reported_metric_has_its_observations(page):
    html, tables = page
    assert get_config(BENCH).reported_metrics == ("bleu", "exact_match")
    bleu, exact = metric_label("bleu", BENCH), metric_label("exact_match", BENCH)
    lines = pd.read_csv(tables / f"uptraining-{BENCH}-observations.csv").set_index(["metric", "observation"])
    assert list(lines.index) == [(m, n) for m in (bleu, exact) for n in ("(1)", "(2)", "(3)")]
    two = lines["on this data"]
    # BLEU: better than both constituents beyond noise, each verdict on its Holm-adjusted p
    assert two[(bleu, "(2)")].startswith("best variant beats both: yes (flurka-rnn d_k=16 at α=25%, 90.2; ")
    for name, p, holm in _paired(BLEU, 1.0):
        assert holm < 0.05
        assert re.search(rf"vs {name}: \+[\d.]+ ± [\d.]+ \(n=3\), p={p:.2g}, p_holm={holm:.2g} -> flurka-rnn",
                         two[(bleu, "(2)")]), (name, two[(bleu, "(2)")])
    # exact match: a tie with each, said as a tie (and so no win)
    assert two[(exact, "(2)")].startswith("best variant beats both: no (flurka-rnn d_k=16 at α=25%, 51; ")
    for name, p, holm in _paired(EXACT, 100.0):
        assert holm >= 0.05
        assert re.search(rf"vs {name}: [+-][\d.]+ ± [\d.]+ \(n=3\), p={p:.2g}, p_holm={holm:.2g} -> tie",
                         two[(exact, "(2)")]), (name, two[(exact, "(2)")])
    rows = pd.read_csv(tables / f"uptraining-{BENCH}-observations-rows.csv").set_index("metric")
    assert rows.loc[bleu, ["vs kernel", "vs low-rank", "beats both"]].tolist() == ["flurka-rnn", "flurka-rnn", "yes"]
    assert rows.loc[exact, ["vs kernel", "vs low-rank", "beats both"]].tolist() == ["tie", "tie", "no"]
    # the page: both metrics' observations, after both Table 5s, said to be judged each on its own
    keys = re.findall(r'<figure class="[^"]*" id="(uptraining-[^"]*)">', html)
    assert keys[:5] == [f"uptraining-{BENCH}", f"uptraining-{BENCH}-fig", f"uptraining-{BENCH}-exact-match",
                        f"uptraining-{BENCH}-observations", f"uptraining-{BENCH}-observations-rows"]
    shown = H.unescape(re.search(rf'id="uptraining-{BENCH}-observations">(.*?)</figure>', html, re.S).group(1))
    assert shown.count("-> tie") == 2 and shown.count("beats both: yes") == 1
    assert "Each metric the benchmark reports is judged on its own" in shown
