"""The paper's tables from a hand-built sweep (conftest.paper_sweep); every expected number
below is worked out by hand from that data (CI half-widths from the tabled t quantiles, paired
p-values from scipy's own ttest_rel), on SQLite and PostgreSQL."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from flurka.catalogue.mechanisms import KERNEL_OF
from flurka.results import quality_tables, speed_tables, tables

nan = math.nan


def assert_frame(df: pd.DataFrame, index: list, columns: list[str], rows: list[list]) -> None:
    assert list(df.index) == index
    assert list(df.columns) == columns
    for label, expected in zip(index, rows):
        for col, want in zip(columns, expected):
            got = df.at[label, col]
            if isinstance(want, float) and math.isnan(want):
                assert isinstance(got, float) and math.isnan(got), (label, col, got)
            elif isinstance(want, float):
                assert got == pytest.approx(want, abs=1e-9), (label, col, got)
            else:
                assert got == want, (label, col, got)


T1 = 12.706204736174707   # Student's t 97.5 % quantile, 1 degree of freedom
T2 = 4.302652729749464    # 2 degrees of freedom


def test_uptraining_table_mean_and_best(seeded):
    # performer: nf=64 seeds (27.0, 28.0) -> 27.5, nf=128 -> 27.9 (1 seed): best config 27.9; best trial 28.0.
    # linformer d_k=64 seeds (28.0, 27.0) -> 27.5 ± T1 * 0.5 = 6.35 | 28.0. flurka-performer alpha=12.5%:
    # (27.98, 27.0) -> 27.49 ± T1 * 0.49 = 6.23 | 27.98; its diverged 25% trial (99.0) and from-scratch trial
    # (50.0) are not in the alpha columns. The best α per row is marked.
    cols = ["kernel constituent", "kernel", "low-rank", "12.5%", "25%", "37.5%"]
    index = [("flurka-performer", "low-rank", 64), ("flurka-rnn", "low-rank", 64), ("flurka-eva", "low-rank", 64)]
    table = quality_tables.uptraining_table(seeded)
    assert table.index.names == ["variant", "base", "d_k"]
    assert_frame(table, index, cols, [
        ["performer", "27.9 (1 seed)", "27.5 ± 6.4 (n=2)", "27.5 ± 6.2 (n=2)", nan, "28.0 (1 seed) *"],
        ["rnn", "23.4 (1 seed)", "27.5 ± 6.4 (n=2)", nan, "24.6 (1 seed) *", nan],
        ["eva", nan, "27.5 ± 6.4 (n=2)", nan, nan, "28.9 (1 seed) *"],
    ])
    assert "BLEU (0–100), higher is better" in table.attrs["title"]
    assert_frame(quality_tables.uptraining_table(seeded, agg="best"), index, cols, [
        ["performer", "28.0 (1 seed)", "28.0 (1 seed)", "28.0 (1 seed)", nan, "28.0 (1 seed) *"],
        ["rnn", "23.4 (1 seed)", "28.0 (1 seed)", nan, "24.6 (1 seed) *", nan],
        ["eva", nan, "28.0 (1 seed)", nan, nan, "28.9 (1 seed) *"],
    ])
    with pytest.raises(tables.NoResults, match="no ok FLuRKA trials with 'bleu' on nmt-wmt14-enfr"):
        quality_tables.uptraining_table(seeded, benchmark="nmt-wmt14-enfr")
    with pytest.raises(ValueError, match="agg 'median' is not one of mean, best"):
        quality_tables.uptraining_table(seeded, agg="median")


def test_uptraining_stats_carry_the_cells_numbers(seeded):
    stats = quality_tables.uptraining_stats(seeded)
    assert list(stats.columns) == ["variant", "base", "d_k", "column", "mechanism", "alpha", "config", "seeds", "mean",
                                   "low", "high", "n", "decimals", "best", "at_chance", "at_floor"]
    assert stats["at_chance"].isna().all() and "note" not in stats.attrs     # BLEU has no chance line
    assert stats["at_floor"].isna().all() and set(stats["base"]) == {"low-rank"}   # nor a control
    cell = lambda v, c: stats[(stats["variant"] == v) & (stats["column"] == c)].iloc[0]  # noqa: E731
    low = cell("flurka-performer", "low-rank")
    assert (low["mechanism"], low["config"], low["seeds"], low["n"]) == ("linformer", "d_k=64", "0,1", 2)
    assert (low["low"], low["high"]) == pytest.approx((27.5 - T1 * 0.5, 27.5 + T1 * 0.5))
    a1 = cell("flurka-performer", "12.5%")
    assert a1["mean"] == pytest.approx(27.49) and a1["high"] == pytest.approx(27.49 + T1 * 0.49)
    assert a1["alpha"] == 0.125 and a1["config"] == "alpha=0.125, base=low-rank, d_k=64" and not a1["best"]
    kernel = cell("flurka-performer", "kernel")
    assert (kernel["mechanism"], kernel["config"], kernel["n"]) == ("performer", "num_features=128", 1)
    assert math.isnan(kernel["low"])
    assert cell("flurka-performer", "37.5%")["best"] and cell("flurka-rnn", "25%")["best"]
    assert not ((stats["variant"] == "flurka-eva") & (stats["column"] == "kernel")).any()   # no eva trial

    numbers = quality_tables.uptraining_table(seeded, numbers=True)
    assert list(numbers.columns[:5]) == ["kernel constituent", "kernel mean", "kernel ci_low", "kernel ci_high",
                                         "kernel n"]
    row = numbers.loc[("flurka-performer", "low-rank", 64)]
    assert (row["low-rank mean"], row["low-rank ci_low"], row["low-rank ci_high"], row["low-rank n"]) == \
        (27.5, 21.1, 33.9, 2)                                                # rounded to 0.1
    assert row["12.5% ci_low"] == 21.3 and row["12.5% mean"] == 27.5 and row["best α"] == "37.5%"
    assert math.isnan(row["25% mean"]) and row["25% n"] == 0


def _uptrain_sweep(sweep_dict, make_trial) -> dict:
    """nmt-small, 3 seeds, flurka-rnn up-trained at α 25 % and 50 % on Linformer d_k 8 and 16: BLEU
    and eval loss per seed (the expectations below are worked from these)."""
    t = []

    def add(key, mech, bleu, loss, **kw):
        for s, (b, l) in enumerate(zip(bleu, loss)):
            t.append(make_trial(f"{key}-s{s}", mech, "nmt-small", {"bleu": b, "loss": l}, seed=s, **kw))

    add("rnn", "rnn", (70.0, 71.0, 72.0), (1.0, 1.1, 0.9))
    add("lin8", "linformer", (80.0, 82.0, 81.0), (0.5, 0.6, 0.4), d_k=8)
    add("lin16", "linformer", (84.0, 86.0, 85.0), (0.3, 0.4, 0.2), d_k=16)
    up = {"base": "low-rank"}
    add("fr8-25", "flurka-rnn", (82.5, 83.5, 83.0), (0.55, 0.65, 0.45), alpha=0.25, d_k=8, **up)
    add("fr8-50", "flurka-rnn", (76.0, 77.0, 78.0), (0.45, 0.52, 0.38), alpha=0.5, d_k=8, **up)
    add("fr16-25", "flurka-rnn", (85.5, 84.5, 86.0), (0.35, 0.45, 0.25), alpha=0.25, d_k=16, **up)
    add("fr16-50", "flurka-rnn", (80.0, 81.0, 79.0), (0.32, 0.41, 0.26), alpha=0.5, d_k=16, **up)
    return {**sweep_dict, "sweep_id": "nmt-uptrain", "name": "nmt up-training", "trials": t}


def _paired_text(a, b, digits, family=()):
    """A paired difference as the tables print it; with ``family`` (the (a, b) pairs of every test in
    the table, this one among them) also its Holm-adjusted p over them."""
    d = np.array(a) - np.array(b)
    half = T2 * d.std(ddof=1) / math.sqrt(len(d))
    text = f"{d.mean():+.{digits}f} ± {half:.{digits}f} (n={len(d)}), p={st.ttest_rel(a, b).pvalue:.2g}"
    if family:
        from statsmodels.stats.multitest import multipletests

        ps = [st.ttest_rel(x, y).pvalue for x, y in family]
        adjusted = multipletests(ps, method="holm")[1]
        text += f", p_holm={adjusted[[tuple(map(tuple, f)) for f in family].index((tuple(a), tuple(b)))]:.2g}"
    return text


def test_uptraining_per_d_k_and_the_papers_observations(engine, sweep_dict, make_trial):
    from flurka.results import ingest_sweep

    ingest_sweep(engine, _uptrain_sweep(sweep_dict, make_trial))
    table = quality_tables.uptraining_table(engine, benchmark="nmt-small", metric="bleu")
    # rnn 71 ± T2/sqrt(3) = 2.48; each row's low-rank is Linformer at its d_k: 81 and 85 (± 2.48)
    assert_frame(table, [("flurka-rnn", "low-rank", 8), ("flurka-rnn", "low-rank", 16)],
                 ["kernel constituent", "kernel", "low-rank", "25%", "50%"], [
        ["rnn", "71.0 ± 2.5 (n=3)", "81.0 ± 2.5 (n=3)", "83.0 ± 1.2 (n=3) *", "77.0 ± 2.5 (n=3)"],
        ["rnn", "71.0 ± 2.5 (n=3)", "85.0 ± 2.5 (n=3)", "85.3 ± 1.9 (n=3) *", "80.0 ± 2.5 (n=3)"],
    ])
    assert "BLEU (char, 0–100)" in table.attrs["title"]

    obs = quality_tables.uptraining_observations(engine, benchmark="nmt-small", metric="bleu")
    d8, d16 = ("flurka-rnn", "low-rank", 8), ("flurka-rnn", "low-rank", 16)
    assert list(obs.index) == [d8, d16]
    # d_k 8: 83 is above both constituents (71, 81), 77 between; d_k 16: 80 between, 85.33 above 85
    assert obs["between"].tolist() == [1, 1] and obs["judged"].tolist() == [2, 2]
    assert obs["best α"].tolist() == ["25%", "25%"] and obs["best α in [25 %, 37.5 %]"].tolist() == ["yes", "yes"]
    # the table's four tests (each row's best α against each constituent) are one family
    best8, best16, rnn = [82.5, 83.5, 83.0], [85.5, 84.5, 86.0], [70.0, 71.0, 72.0]
    lin8, lin16 = [80.0, 82.0, 81.0], [84.0, 86.0, 85.0]
    family = [(best8, rnn), (best8, lin8), (best16, rnn), (best16, lin16)]
    # d_k 8, best (25 %) − linformer: 2.5, 1.5, 2.0 (p = 0.02; Holm's 0.04 over the four, still below
    # 0.05): FLuRKA; − rnn: 12.5, 12.5, 11
    assert obs.at[d8, "best − low-rank"] == _paired_text(best8, lin8, 1, family)
    assert obs.at[d8, "best − kernel"] == _paired_text(best8, rnn, 1, family)
    assert obs.at[d8, "vs low-rank"] == "flurka-rnn" == obs.at[d8, "vs kernel"]
    assert obs["beats both"].tolist() == ["yes", "no"]
    # d_k 16: 1.5, -1.5, 1.0 against Linformer: the CI holds 0, a tie, though the mean is higher
    assert obs.at[d16, "vs low-rank"] == "tie"
    assert obs["overall best"].tolist() == [False, True]                  # 85.33 > 83
    one, two, three = quality_tables.observation_lines(obs)
    assert one == "(1) most α cells lie between their constituents (kernel, low-rank): no (2 of 4)"
    assert two.startswith("(2) best variant beats both: no (flurka-rnn d_k=16 at α=25%")
    assert "vs linformer: " + _paired_text(best16, lin16, 1, family) + " -> tie" in two
    assert three.startswith("(3) best α in [25 %, 37.5 %]: yes (2 of 2 rows")


def test_one_alpha_per_row_leaves_the_best_alpha_unjudged(engine, sweep_dict, make_trial):
    from flurka.results import ingest_sweep

    sweep = _uptrain_sweep(sweep_dict, make_trial)
    # keep α = 25 % on d_k 8 only: d_k 16 has one α cell (50 %), whose "best" compares nothing
    sweep["trials"] = [t for t in sweep["trials"] if not t["trial_key"].startswith("fr16-25")]
    ingest_sweep(engine, sweep)
    obs = quality_tables.uptraining_observations(engine, benchmark="nmt-small", metric="bleu")
    assert obs["best α in [25 %, 37.5 %]"].tolist() == ["yes", quality_tables.ONE_ALPHA]
    three = quality_tables.observation_lines(obs)[2]
    assert three == ("(3) best α in [25 %, 37.5 %]: yes (1 of 1 rows; flurka-rnn d_k=8 25%); "
                     "1 row of one α, not judged")
    sweep["trials"] = [t for t in sweep["trials"] if not t["trial_key"].startswith("fr8-50")]
    sweep["sweep_id"] = "nmt-one-alpha"
    ingest_sweep(engine, sweep)
    obs = quality_tables.uptraining_observations(engine, benchmark="nmt-small", metric="bleu", sweep="nmt-one-alpha")
    assert quality_tables.observation_lines(obs)[2].startswith("(3) best α in [25 %, 37.5 %]: not judged (one α per row")
    # (1) and (2) still judge the single cells: 83 above both at d_k 8, 80 between at d_k 16
    assert obs["between"].tolist() == [0, 1] and obs["judged"].tolist() == [1, 1]


def test_uptraining_on_eval_loss_is_lower_is_better(engine, sweep_dict, make_trial):
    from flurka.results import ingest_sweep

    ingest_sweep(engine, _uptrain_sweep(sweep_dict, make_trial))
    table = quality_tables.uptraining_table(engine, benchmark="nmt-small", metric="loss")
    # 3 significant digits; the lower α = 50 % loss is the best on both rows (0.45 < 0.55, 0.33 < 0.35)
    assert_frame(table.drop(columns="kernel constituent"), [("flurka-rnn", "low-rank", 8), ("flurka-rnn", "low-rank", 16)],
                 ["kernel", "low-rank", "25%", "50%"], [
        ["1.00 ± 0.25 (n=3)", "0.500 ± 0.248 (n=3)", "0.550 ± 0.248 (n=3)", "0.450 ± 0.174 (n=3) *"],
        ["1.00 ± 0.25 (n=3)", "0.300 ± 0.248 (n=3)", "0.350 ± 0.248 (n=3)", "0.330 ± 0.188 (n=3) *"],
    ])
    assert "eval loss, lower is better" in table.attrs["title"]
    obs = quality_tables.uptraining_observations(engine, benchmark="nmt-small", metric="loss")
    assert obs["best α"].tolist() == ["50%", "50%"] and obs["best α in [25 %, 37.5 %]"].tolist() == ["no", "no"]
    # d_k 8: 0.55 between 0.5 and 1.0, 0.45 below both; d_k 16: 0.35 and 0.33 between 0.3 and 1.0
    assert obs["between"].tolist() == [1, 2]
    # lower loss than rnn beyond noise: FLuRKA wins though its difference is negative
    d8 = ("flurka-rnn", "low-rank", 8)
    assert obs.at[d8, "vs kernel"] == "flurka-rnn"
    family = [([0.45, 0.52, 0.38], [1.0, 1.1, 0.9]), ([0.45, 0.52, 0.38], [0.5, 0.6, 0.4]),
              ([0.33, 0.41, 0.26], [1.0, 1.1, 0.9]), ([0.33, 0.41, 0.26], [0.3, 0.4, 0.2])]
    assert obs.at[d8, "best − kernel"] == _paired_text([0.45, 0.52, 0.38], [1.0, 1.1, 0.9], 3, family)
    assert obs["vs low-rank"].tolist() == ["tie", "tie"] and obs["beats both"].tolist() == ["no", "no"]
    assert obs["overall best"].tolist() == [False, True]                  # 0.33 < 0.45
    lines = quality_tables.observation_lines(obs)
    assert lines[0].endswith("yes (3 of 4)") and lines[2].startswith("(3) best α in [25 %, 37.5 %]: no (0 of 2")
    numbers = quality_tables.uptraining_table(engine, benchmark="nmt-small", metric="loss", numbers=True)
    assert numbers.at[d8, "50% ci_low"] == round(0.45 - T2 * np.std([0.45, 0.52, 0.38], ddof=1) / math.sqrt(3), 3)
    assert numbers.at[d8, "best α"] == "50%"


def test_collective_table(seeded):
    # En-De: flurka-performer's configs are alpha 12.5% (27.49), 37.5% (28.0), scratch (50.0) -> 50.0.
    # WikiText-103 perplexity is lower-is-better: full seeds (5.533, 5.633) -> 5.583 ± T1 * 0.05 = 0.635
    # (3 significant digits); linformer min(7.696, 7.5). No En-Fr results: that column is left out.
    # ImageNet fractions are shown in percent; full's En-De seeds agree (24.65 twice): a zero-width CI.
    cols = ["En-De (BLEU, 0–100)", "ImageNet top-1 (%)", "ImageNet top-5 (%)", "WikiText-103 (perplexity)"]
    assert_frame(quality_tables.collective_table(seeded),
                 ["full", "linformer", "performer", "rnn", "flurka-performer", "flurka-rnn", "flurka-eva"], cols, [
                     ["24.6 ± 0.0 (n=2)", "71.7 (1 seed)", "91.0 (1 seed)", "5.58 ± 0.64 (n=2)"],
                     ["27.5 ± 6.4 (n=2)", nan, nan, "7.50 (1 seed)"],
                     ["27.9 (1 seed)", nan, nan, nan],
                     ["23.4 (1 seed)", nan, nan, nan],
                     ["50.0 (1 seed)", nan, nan, nan],
                     ["24.6 (1 seed)", nan, nan, nan],
                     ["28.9 (1 seed)", nan, nan, nan],
                 ])
    best = quality_tables.collective_table(seeded, agg="best")
    assert best.at["full", "WikiText-103 (perplexity)"] == "5.53 (1 seed)"
    assert best.at["linformer", "En-De (BLEU, 0–100)"] == "28.0 (1 seed)"
    numbers = quality_tables.collective_table(seeded, numbers=True)
    ppl = "WikiText-103 (perplexity)"
    assert (numbers.at["full", f"{ppl} mean"], numbers.at["full", f"{ppl} ci_low"],
            numbers.at["full", f"{ppl} ci_high"], numbers.at["full", f"{ppl} n"]) == \
        (round(5.583, 2), round(5.583 - T1 * 0.05, 2), round(5.583 + T1 * 0.05, 2), 2)
    assert numbers.at["full", "ImageNet top-1 (%) mean"] == 71.7 and numbers.at["full", "ImageNet top-1 (%) n"] == 1
    stats = quality_tables.metric_stats(seeded, quality_tables.COLLECTIVE_COLUMNS)
    assert list(stats.columns) == ["mechanism", "column", "benchmark", "metric", "config", "seeds", "mean", "low",
                                   "high", "n", "decimals", "at_chance", "at_floor"]
    assert stats["at_chance"].isna().all() and quality_tables.CHANCE not in set(stats["mechanism"])  # none recorded
    full_ppl = stats[(stats["mechanism"] == "full") & (stats["column"] == ppl)].iloc[0]
    assert full_ppl["mean"] == pytest.approx(5.583) and full_ppl["seeds"] == "0,1" and full_ppl["decimals"] == 2
    lin = stats[(stats["mechanism"] == "linformer") & (stats["column"] == ppl)].iloc[0]
    assert lin["config"] == "d_k=128" and lin["mean"] == pytest.approx(7.5)


def test_glue_table_average_matches_the_paper(seeded):
    df = quality_tables.glue_table(seeded)
    assert list(df.index) == ["full", "linformer"]
    assert list(df.columns) == [label for label, _, _ in quality_tables.GLUE_COLUMNS] + ["Average (%)"]
    assert df.loc["full"].tolist()[:-1] == [f"{v} (1 seed)" for v in
                                            ("48.9", "90.7", "89.1", "84.8", "85.5", "85.6", "86.4", "90.0", "81.3",
                                             "81.8", "88.2", "65.7")]
    assert df.at["full", "Average (%)"] == "81.5 (1 seed)"  # the paper's Table 2 value
    numbers = quality_tables.glue_table(seeded, numbers=True)
    assert numbers.at["full", "Average (%) mean"] == 81.5 and numbers.at["full", "Average (%) n"] == 1
    assert df.at["linformer", "CoLA (mcc, %)"] == "29.2 (1 seed)"
    assert math.isnan(df.at["linformer", "Average (%)"])  # missing tasks: no average, never a partial one


def test_lra_table(seeded):
    cols = ["ListOps (acc, %)", "Text (acc, %)", "Retrieval (acc, %)", "Image (acc, %)", "Pathfinder (acc, %)",
            "Average (%)"]
    numbers = quality_tables.lra_table(seeded, numbers=True)
    assert [numbers.at["full", f"{c} mean"] for c in cols] == [38.0, 60.2, 80.5, 37.4, 70.2, 57.2]  # Table 3: 57.23
    assert [numbers.at["eva", f"{c} mean"] for c in cols] == [38.6, 65.2, 81.0, 41.6, 69.3, 59.1]   # Table 3: 59.13
    assert quality_tables.lra_table(seeded).at["eva", "Average (%)"] == "59.1 (1 seed)"
    # flurka-eva on ListOps-small: seeds 50 and 60 -> 55 ± T1 * 5 = 63.5; the average of one column is it
    assert_frame(quality_tables.lra_table(seeded, small=True), ["flurka-eva"], ["ListOps (acc, %)", "Average (%)"],
                 [["55.0 ± 63.5 (n=2)", "55.0 ± 63.5 (n=2)"]])
    assert_frame(quality_tables.lra_table(seeded, small=True, agg="best"), ["flurka-eva"], ["ListOps (acc, %)", "Average (%)"],
                 [["60.0 (1 seed)", "60.0 (1 seed)"]])


def test_accuracy_columns_show_their_chance_line_and_the_cells_at_it(engine, sweep_dict, make_trial):
    """ListOps-small's majority class answers 13.9 % of its eval set, Image-small's 11.7 %: a cell
    whose 95 % CI (scipy's t interval, written out here) reaches that line is "at chance"."""
    from flurka.results import ingest_sweep

    accuracy = {("full", "lra-listops-small"): [0.50, 0.52, 0.54], ("rnn", "lra-listops-small"): [0.13, 0.15, 0.17],
                ("performer", "lra-listops-small"): [0.13], ("full", "lra-image-small"): [0.90, 0.96],
                ("rnn", "lra-image-small"): [0.40, 0.44, 0.48]}
    chance = {"lra-listops-small": 0.139, "lra-image-small": 0.117}
    trials = [make_trial(f"{m}-{b}-{seed}", m, b, {"accuracy": a, "majority_accuracy": chance[b]}, seed=seed)
              for (m, b), values in accuracy.items() for seed, a in enumerate(values)]
    ingest_sweep(engine, {**sweep_dict, "trials": trials})

    def ci(values):
        values = np.array(values) * 100
        return st.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=st.sem(values))

    assert ci(accuracy[("rnn", "lra-listops-small")])[0] <= 13.9 < ci(accuracy[("full", "lra-listops-small")])[0]
    half = (ci([0.13, 0.15, 0.17])[1] - ci([0.13, 0.15, 0.17])[0]) / 2
    cols = ["ListOps (acc, %)", "Image (acc, %)", "Average (%)"]
    df = quality_tables.lra_table(engine, small=True)
    assert list(df.index) == ["full", "performer", "rnn", "chance"]
    assert df.at["rnn", cols[0]] == f"15.0 ± {half:.1f} (n=3), at chance"
    assert df.at["performer", cols[0]] == "13.0 (1 seed), at chance"          # one seed: its mean decides
    assert df.at["full", cols[0]] == f"52.0 ± {half:.1f} (n=3)"                # clears the line
    assert df.at["rnn", cols[1]] == f"44.0 ± {half * 2:.1f} (n=3)"
    assert [df.at["chance", c] for c in cols] == ["13.9", "11.7", "12.8"]
    assert "majority class" in df.attrs["note"]
    numbers = quality_tables.lra_table(engine, small=True, numbers=True)
    assert (numbers.at["chance", "ListOps (acc, %) mean"], numbers.at["chance", "ListOps (acc, %) n"]) == (13.9, 0)
    assert math.isnan(numbers.at["chance", "ListOps (acc, %) ci_low"])
    stats = quality_tables.metric_stats(engine, quality_tables.LRA_SMALL_COLUMNS)
    flagged = stats[stats["at_chance"] == True]   # noqa: E712 (None elsewhere)
    assert sorted(zip(flagged["mechanism"], flagged["column"])) == [("performer", cols[0]), ("rnn", cols[0])]


def test_uptraining_on_a_classification_task_shows_its_chance_line(engine, sweep_dict, make_trial):
    """Table 5 on ListOps: a "chance" column per row; the up-trained cell whose CI reaches 13.9 %
    says so, the constituents above it do not."""
    from flurka.results import ingest_sweep

    runs = {("performer", None, None): (0.40, 0.42, 0.44), ("linformer", 16, None): (0.50, 0.52, 0.54),
            ("flurka-performer", 16, 0.5): (0.13, 0.15, 0.17)}
    trials = [make_trial(f"{m}-{seed}", m, "lra-listops-small",
                         {"accuracy": a, "majority_accuracy": 0.139, "loss": 2.0 - a},
                         seed=seed, d_k=d_k, alpha=alpha, base="low-rank" if alpha else None)
              for (m, d_k, alpha), values in runs.items() for seed, a in enumerate(values)]
    ingest_sweep(engine, {**sweep_dict, "trials": trials})
    half = st.t.ppf(0.975, 2) * 2 / math.sqrt(3)
    table = quality_tables.uptraining_table(engine, benchmark="lra-listops-small", metric="accuracy")
    assert list(table.columns) == ["kernel constituent", "kernel", "low-rank", "50%", "chance"]
    assert table.iloc[0].tolist() == ["performer", f"42.0 ± {half:.1f} (n=3)", f"52.0 ± {half:.1f} (n=3)",
                                      f"15.0 ± {half:.1f} (n=3), at chance *", "13.9"]   # * its best α
    assert "majority class" in table.attrs["note"]
    numbers = quality_tables.uptraining_table(engine, benchmark="lra-listops-small", metric="accuracy", numbers=True)
    assert (numbers["chance mean"].tolist(), numbers["chance n"].tolist()) == ([13.9], [0])
    assert numbers["best α"].tolist() == ["50%"]
    assert quality_tables.uptraining_table(engine, benchmark="lra-listops-small", metric="loss").columns[-1] == "50%"


def test_average_over_cells_of_different_seeds_has_no_ci(engine, sweep_dict, make_trial):
    from flurka.results import ingest_sweep

    trials = [make_trial("a0", "rnn", "lra-listops-small", {"accuracy": 0.40}, seed=0),
              make_trial("a1", "rnn", "lra-listops-small", {"accuracy": 0.42}, seed=1),
              make_trial("i0", "rnn", "lra-image-small", {"accuracy": 0.90}, seed=0),
              make_trial("j0", "full", "lra-listops-small", {"accuracy": 0.50}, seed=0),
              make_trial("j1", "full", "lra-listops-small", {"accuracy": 0.54}, seed=1),
              make_trial("k0", "full", "lra-image-small", {"accuracy": 0.96}, seed=0),
              make_trial("k1", "full", "lra-image-small", {"accuracy": 0.98}, seed=1)]
    ingest_sweep(engine, {**sweep_dict, "trials": trials})
    df = quality_tables.lra_table(engine, small=True)
    assert df.at["rnn", "Average (%)"] == "65.5 (no CI)"          # (41 + 90) / 2 over seeds {0, 1} and {0}
    # full: per-seed averages (50 + 96) / 2 = 73, (54 + 98) / 2 = 76 -> 74.5 ± T1 * 1.5
    assert df.at["full", "Average (%)"] == f"74.5 ± {T1 * 1.5:.1f} (n=2)"


def test_sweep_filter(seeded, sweep_dict, make_trial):
    from flurka.results import ingest_sweep

    ingest_sweep(seeded, {**sweep_dict, "sweep_id": "later", "name": "later run",
                          "trials": [make_trial("x", "rnn", "lra-listops-small", {"accuracy": 0.25})]})
    assert list(quality_tables.lra_table(seeded, small=True).index) == ["rnn", "flurka-eva"]
    assert_frame(quality_tables.lra_table(seeded, small=True, sweep="later run"), ["rnn"], ["ListOps (acc, %)", "Average (%)"],
                 [["25.0 (1 seed)", "25.0 (1 seed)"]])
    assert list(quality_tables.lra_table(seeded, small=True, sweep="paper-2024-05-01").index) == ["flurka-eva"]


def test_isoflops_table(seeded):
    # Target = full's final loss averaged over seeds: (0.2 + 0.3) / 2 = 0.25.
    # full: seed 0 first reaches <= 0.25 at step 3 (0.2, 3 EFLOPs), seed 1 at step 2 (0.25, 2 EFLOPs):
    # 2.5 ± T1 * 0.5 over both. linformer: its one seed with a curve ends at 0.5, never (0/1).
    # flurka-eva reaches 0.24 at step 2 after 1 EFLOP, one seed.
    df = quality_tables.isoflops_table(seeded)
    assert df.attrs["target_loss"] == pytest.approx(0.25)
    assert_frame(df, ["full", "linformer", "flurka-eva"], ["reached", "Loss", "EFLOPs"],
                 [["2/2", 0.225, f"2.50 ± {T1 * 0.5:.2f} (n=2)"], ["0/1", nan, quality_tables.NOT_REACHED],
                  ["1/1", 0.24, "1.00 (1 seed)"]])
    assert "loss <= 0.25 (full's final loss)" in df.attrs["title"]
    # An explicit target of 0.5: everyone's step 2.
    assert_frame(quality_tables.isoflops_table(seeded, target_loss=0.5), ["full", "linformer", "flurka-eva"],
                 ["reached", "Loss", "EFLOPs"], [["2/2", 0.375, "2.00 ± 0.00 (n=2)"], ["1/1", 0.5, "2.00 (1 seed)"],
                                                 ["1/1", 0.24, "1.00 (1 seed)"]])
    with pytest.raises(tables.NoResults, match="no 'rnn' trials"):
        quality_tables.isoflops_table(seeded, reference="rnn")


def _isoflops_runs(make_trial, runs) -> list[dict]:
    """nmt-small trials with loss / train_flops curves: {(mechanism, seed): [(loss, EFLOPs), ...]}."""
    return [make_trial(f"{m}-{seed}-{d_k}", m, "nmt-small", {"bleu": 50.0}, seed=seed, d_k=d_k,
                       curve=[{"step": i + 1, "loss": loss, "train_flops": flops * 1e18}
                              for i, (loss, flops) in enumerate(points)])
            for (m, seed, d_k), points in runs.items()]


def test_isoflops_says_how_many_seeds_reach_the_target(engine, sweep_dict, make_trial):
    """One seed of three never gets to the target: the table says 2/3 and its FLOPs are the mean and
    Student's t interval over the two that do (scipy's, worked here); a mechanism none of whose
    seeds gets there says 0/3 and "not reached", not a bare NaN."""
    from flurka.results import ingest_sweep

    runs = {("full", s, None): [(1.0, 1.0), (0.5, 2.0), (l, 3.0)] for s, l in enumerate((0.2, 0.3, 0.25))}
    # target 0.25; performer: seed 0 at 2 EFLOPs, seed 1 at 3, seed 2 never (ends at 0.4)
    runs.update({("performer", 0, None): [(0.9, 1.0), (0.25, 2.0), (0.2, 3.0)],
                 ("performer", 1, None): [(0.9, 1.0), (0.5, 2.0), (0.22, 3.0)],
                 ("performer", 2, None): [(0.9, 1.0), (0.5, 2.0), (0.4, 3.0)]})
    runs.update({("rnn", s, None): [(2.0, 1.0), (1.0, 2.0), (0.9, 3.0)] for s in range(3)})
    ingest_sweep(engine, {**sweep_dict, "trials": _isoflops_runs(make_trial, runs)})
    df = quality_tables.isoflops_table(engine, benchmark="nmt-small")
    two = [2.0, 3.0]
    low, high = st.t.interval(0.95, 1, loc=np.mean(two), scale=st.sem(two))
    assert list(df.index) == ["full", "performer", "rnn"]
    assert df.at["performer", "reached"] == "2/3"
    assert df.at["performer", "EFLOPs"] == f"2.50 ± {(high - low) / 2:.2f} (n=2)"
    assert df.at["performer", "Loss"] == pytest.approx((0.25 + 0.22) / 2)
    # full itself: its seed 1 ends at 0.3, above the mean of the three finals it sets the target by
    assert (df.at["full", "reached"], df.at["full", "EFLOPs"]) == ("2/3", "3.00 ± 0.00 (n=2)")
    assert (df.at["rnn", "reached"], df.at["rnn", "EFLOPs"]) == ("0/3", quality_tables.NOT_REACHED)
    numbers = quality_tables.isoflops_table(engine, benchmark="nmt-small", numbers=True)
    assert list(numbers.columns) == ["reached", "seeds", "Loss", "EFLOPs mean", "EFLOPs ci_low", "EFLOPs ci_high"]
    assert numbers.loc["performer", ["reached", "seeds"]].tolist() == [2, 3]
    assert numbers.at["performer", "EFLOPs ci_low"] == pytest.approx(float(f"{low:.4g}"))
    assert numbers.loc["rnn", ["reached", "seeds"]].tolist() == [0, 3]
    assert math.isnan(numbers.at["rnn", "EFLOPs mean"]) and math.isnan(numbers.at["rnn", "Loss"])
    text = tables.format_table(df, "markdown")
    assert "| performer   | 2/3       |" in text and "| rnn         | 0/3       | --" in text


def test_isoflops_picks_the_configuration_whose_seeds_get_there(engine, sweep_dict, make_trial):
    """Linformer at d_k 8 reaches the target sooner on one of its three seeds; at d_k 16 all three
    get there: the row is d_k 16's (3/3), not the lucky seed's (1/3)."""
    from flurka.results import ingest_sweep

    runs = {("full", s, None): [(1.0, 1.0), (0.5, 2.0), (0.25, 3.0)] for s in range(3)}
    runs.update({("linformer", s, 8): [(0.2 if s == 0 else 0.9, 1.0), (0.9, 2.0), (0.9, 3.0)] for s in range(3)})
    runs.update({("linformer", s, 16): [(0.9, 1.0), (0.24 + 0.001 * s, 2.0), (0.2, 3.0)] for s in range(3)})
    ingest_sweep(engine, {**sweep_dict, "trials": _isoflops_runs(make_trial, runs)})
    df = quality_tables.isoflops_table(engine, benchmark="nmt-small")
    assert (df.at["linformer", "reached"], df.at["linformer", "EFLOPs"]) == ("3/3", "2.00 ± 0.00 (n=3)")
    stats = quality_tables.isoflops_stats(engine, benchmark="nmt-small")
    assert stats.set_index("mechanism").at["linformer", "config"] == "d_k=16"


def test_isoflops_numbers_for_csv_are_rounded(engine, sweep_dict, make_trial):
    from flurka.results import ingest_sweep

    curve = [{"step": 1, "loss": 0.123456789, "train_flops": 1.23456789e18}]
    ingest_sweep(engine, {**sweep_dict, "trials": [make_trial("f", "full", "nmt-small", {"bleu": 50.0}, curve=curve)]})
    exact = quality_tables.isoflops_table(engine, benchmark="nmt-small")
    assert exact.at["full", "Loss"] == 0.123456789
    assert exact.at["full", "EFLOPs"] == "1.23 (1 seed)"
    numbers = quality_tables.isoflops_table(engine, benchmark="nmt-small", numbers=True)
    assert numbers.loc["full", ["reached", "seeds", "Loss", "EFLOPs mean"]].tolist() == [1, 1, 0.1235, 1.235]
    assert math.isnan(numbers.at["full", "EFLOPs ci_low"])


def test_speed_and_speedup_tables(seeded):
    with pytest.raises(ValueError, match=r"several speed measurements per mechanism and N \(device in "
                                         r"\['NVIDIA H100 80GB HBM3', 'cpu'\]\): filter by device"):
        speed_tables.speed_table(seeded)
    df = speed_tables.speed_table(seeded, device="H100")
    assert_frame(df, [1024, 4096], ["full", "flash", "linformer", "performer", "flurka-performer"], [
        [10.0, 4.0, 6.0, 5.0, 2.0],
        ["OOM", 40.0, 30.0, 20.0, 10.0],
    ])
    # 1024: linformer 6/2, performer 5/2, flash 4/2, full 10/2; 4096: 30/10, 20/10, 40/10, full OOM.
    up = speed_tables.speedup_table(seeded, device="H100")
    assert_frame(up, [("flurka-performer", 1024), ("flurka-performer", 4096)],
                 ["vs low-rank", "vs kernel", "vs flash", "vs full"],
                 [[3.0, 2.5, 2.0, 5.0], [3.0, 2.0, 4.0, nan]])
    with pytest.raises(tables.NoResults, match="no 'forward' speed measurements"):
        speed_tables.speed_table(seeded, mode="forward")
    with pytest.raises(ValueError, match="unknown speed filter seq"):
        speed_tables.speed_table(seeded, seq=3)


def test_repeated_runs_of_a_point_combine_to_the_median(engine):
    """Three leases timed the same point (host/versions differ, so three records): the table shows
    the median of their medians; an OOM in one run does not hide the runs that fitted."""
    from flurka.results import ingest_speed

    def speed(mechanism, n, median, status="ok"):
        return {"device": "NVIDIA H200", "versions": {"jax": "0.11.2"}, "mechanism": mechanism, "mode": "train",
                "N": n, "d_model": 512, "heads": 8, "d_k": 256, "m": 64, "batch": 1, "dtype": "bfloat16",
                "status": status, "median_s": median, "flops": 1e12}

    records = [dict(speed("linformer", 1024, t), host=f"node-{i}") for i, t in enumerate((0.006, 0.009, 0.007))]
    records += [dict(speed("flurka-performer", 1024, t), host=f"node-{i}") for i, t in enumerate((0.002, 0.004))]
    records += [dict(speed("flurka-performer", 1024, None, "oom"), host="node-9")]
    records += [dict(speed("full", 1024, None, "oom"), host=f"node-{i}") for i in range(2)]
    assert ingest_speed(engine, records).added == 8
    df = speed_tables.speed_table(engine)
    assert_frame(df, [1024], ["full", "linformer", "flurka-performer"], [["OOM", 7.0, 3.0]])
    up = speed_tables.speedup_table(engine)
    assert up.loc[("flurka-performer", 1024), "vs low-rank"] == pytest.approx(7.0 / 3.0)


def test_empty_database_says_so(engine):
    with pytest.raises(tables.NoResults, match="no ok trials with metrics for glue-cola"):
        quality_tables.glue_table(engine)
    with pytest.raises(tables.NoResults, match="no ok trials with 'loss' and 'train_flops' curves on nmt-small"):
        quality_tables.isoflops_table(engine, benchmark="nmt-small")
    with pytest.raises(tables.NoResults, match="no 'train' speed measurements"):
        speed_tables.speedup_table(engine)


def test_aligned_and_unaligned_runs_are_different_measurements(engine):
    """A --align 128 run of a point is not a repeat of the unaligned one: the table asks which
    (align comes from the stored config; records without it ran unaligned)."""
    from flurka.results import ingest_speed

    def speed(mechanism, median, align=None):
        return {"device": "NVIDIA H200", "host": "node", "versions": {"jax": "0.11.2"}, "mechanism": mechanism,
                "mode": "forward", "N": 55500, "d_model": 2600, "heads": 8, "d_k": 1500, "m": 325,
                "status": "ok", "median_s": median, "config": None if align is None else {"align": align}}

    records = [speed("linformer", 0.016), speed("flurka-rnn", 0.010),
               speed("linformer", 0.008, align=128), speed("flurka-rnn", 0.004, align=128)]
    assert ingest_speed(engine, records).added == 4
    with pytest.raises(ValueError, match=r"\(align in \['1', '128'\]\): filter by align"):
        speed_tables.speed_table(engine, mode="forward")
    assert_frame(speed_tables.speed_table(engine, mode="forward", align=1), [55500], ["linformer", "flurka-rnn"],
                 [[16.0, 10.0]])
    assert_frame(speed_tables.speed_table(engine, mode="forward", align=128), [55500], ["linformer", "flurka-rnn"],
                 [[8.0, 4.0]])


def test_fused_and_xla_runs_are_different_measurements(engine):
    """A --fused run (Pallas query-side kernel) is not a repeat of the XLA one; records without
    the option ran unfused."""
    from flurka.results import ingest_speed

    def speed(mechanism, median, config=None):
        return {"device": "NVIDIA H200", "host": "node", "versions": {"jax": "0.11.2"}, "mechanism": mechanism,
                "mode": "forward", "N": 52500, "d_model": 512, "heads": 4, "d_k": 1024, "m": 128,
                "status": "ok", "median_s": median, "config": config}

    records = [speed("flurka-rnn", 0.0067), speed("flurka-rnn", 0.0060, {"fused": False, "align": 1}),
               speed("flurka-rnn", 0.0050, {"fused": True, "align": 1})]
    assert ingest_speed(engine, records).added == 3
    with pytest.raises(ValueError, match=r"\(fused in \['False', 'True'\]\): filter by fused"):
        speed_tables.speed_table(engine, mode="forward")
    assert_frame(speed_tables.speed_table(engine, mode="forward", fused=False), [52500], ["flurka-rnn"], [[6.35]])
    assert_frame(speed_tables.speed_table(engine, mode="forward", fused=True), [52500], ["flurka-rnn"], [[5.0]])
    from flurka.results import cli   # the same filter from the command line
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--table", "speed", "--mode", "forward", "--no-fused"])
    assert_frame(cli.build(engine, args), [52500], ["flurka-rnn"], [[6.35]])


def test_padded_and_unpadded_runs_are_different_measurements(engine):
    """A run whose batch was padded to a multiple of 128 (pad_to) is not a repeat of the unpadded
    one though FLOPs count the same N; records without the option ran unpadded."""
    from flurka.results import ingest_speed

    def speed(mechanism, median, config=None):
        return {"device": "NVIDIA H200", "host": "node", "versions": {"jax": "0.11.2"}, "mechanism": mechanism,
                "mode": "forward", "N": 52500, "d_model": 512, "heads": 4, "d_k": 1024, "m": 128,
                "status": "ok", "median_s": median, "config": config}

    records = [speed("flurka-rnn", 0.0067), speed("flurka-rnn", 0.0060, {"pad_to": 1}),
               speed("flurka-rnn", 0.0052, {"pad_to": 128})]
    assert ingest_speed(engine, records).added == 3
    with pytest.raises(ValueError, match=r"\(pad_to in \['1', '128'\]\): filter by pad_to"):
        speed_tables.speed_table(engine, mode="forward")
    assert_frame(speed_tables.speed_table(engine, mode="forward", pad_to=1), [52500], ["flurka-rnn"], [[6.35]])
    assert_frame(speed_tables.speed_table(engine, mode="forward", pad_to=128), [52500], ["flurka-rnn"], [[5.2]])
    from flurka.results import cli   # the same filter from the command line
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--table", "speed", "--mode", "forward", "--pad-to", "128"])
    assert_frame(cli.build(engine, args), [52500], ["flurka-rnn"], [[5.2]])


def test_runs_under_other_xla_options_are_different_measurements(engine):
    """A run compiled with XLA options (``--xla``, recorded as {name: value}) is not a repeat of
    the default one; the tables and the CLI select them by their sorted name=value list."""
    from flurka.results import ingest_speed

    def speed(median, config=None):
        return {"device": "NVIDIA H200", "host": "node", "versions": {"jax": "0.11.2"}, "mechanism": "flurka-rnn",
                "mode": "forward", "N": 52500, "d_model": 512, "heads": 4, "d_k": 1024, "m": 128,
                "status": "ok", "median_s": median, "config": config}

    v2 = {"xla": {"xla_gpu_experimental_gemm_fusion_v2": True, "xla_gpu_experimental_force_split_k": 1}}
    assert ingest_speed(engine, [speed(0.0050), speed(0.0052, {"xla": {}}), speed(0.0041, v2)]).added == 3
    with pytest.raises(ValueError, match=r"filter by xla"):
        speed_tables.speed_table(engine, mode="forward")
    assert_frame(speed_tables.speed_table(engine, mode="forward", xla=""), [52500], ["flurka-rnn"], [[5.1]])
    from flurka.results import cli
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--table", "speed", "--mode", "forward", "--xla",   # any order
                              "xla_gpu_experimental_gemm_fusion_v2=true,xla_gpu_experimental_force_split_k=1"])
    assert_frame(cli.build(engine, args), [52500], ["flurka-rnn"], [[4.1]])
    args.xla = "xla_gpu_experimental_gemm_fusion_v2=true"
    with pytest.raises(tables.NoResults):   # a subset of a run's options is another run
        cli.build(engine, args)


def test_best_execution_compares_each_mechanism_at_its_fastest(engine):
    """``best``: flash (plain only: cuDNN cannot be aligned or fused) against FLuRKA's fastest
    execution, fused and padded, and a constituent at its own fastest (aligned); the table says
    which execution each side ran. An OOM execution never hides one that fitted."""
    from flurka.results import ingest_speed

    def speed(mechanism, median, config=None, status="ok"):
        return {"device": "NVIDIA H200", "host": "node", "versions": {"jax": "0.11.2"}, "mechanism": mechanism,
                "mode": "forward", "N": 52500, "d_model": 512, "heads": 4, "d_k": 1024, "m": 128,
                "status": status, "median_s": median, "config": config}

    records = [speed("flash", 0.0656), speed("flurka-rnn", 0.0061),
               speed("flurka-rnn", 0.0045, {"fused": True, "pad_to": 128}),
               speed("flurka-rnn", None, {"fused": True, "pad_to": 256}, status="oom"),
               speed("rnn", 0.0090), speed("rnn", 0.0072, {"align": 128, "pad_to": 128})]
    assert ingest_speed(engine, records).added == 6
    with pytest.raises(ValueError, match="filter by"):
        speed_tables.speedup_table(engine, mode="forward")                 # several executions
    up = speed_tables.speedup_table(engine, mode="forward", best=True)
    row = up.loc[("flurka-rnn", 52500)]
    assert row["vs flash"] == pytest.approx(0.0656 / 0.0045)
    assert row["vs kernel"] == pytest.approx(0.0072 / 0.0045)
    assert row["executions"] == "flurka-rnn: fused, pad_to 128; rnn: align 128, pad_to 128; flash: plain"
    assert_frame(speed_tables.speed_table(engine, mode="forward", best=True), [52500],
                 ["flash", "rnn", "flurka-rnn"], [[65.6, 7.2, 4.5]])
    from flurka.results import cli   # the same from the command line
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--table", "speedup", "--mode", "forward", "--best"])
    assert cli.build(engine, args).loc[("flurka-rnn", 52500), "vs flash"] == pytest.approx(0.0656 / 0.0045)


def test_the_gpu_targets_are_data_read_from_benchmarks(tmp_path):
    """The targets live in benchmarks/targets.toml: the repository's file names FLuRKA variants,
    another file's numbers are the ones the floor table holds a layer to, and a missing or broken
    file is one clear error naming it."""
    shipped = speed_tables.gpu_targets()
    assert set(shipped.beats_constituents) <= set(KERNEL_OF) and shipped.flurka_layer <= shipped.layer
    other = tmp_path / "targets.toml"
    other.write_text('[floor]\nlayer = 3.0\nflurka_layer = 2.5\n[constituents]\nfaster = ["flurka-rnn"]\n'
                     'label = "FLuRKA-RNN faster"\n[flash]\nspeedup = 10\n')
    mine = speed_tables.gpu_targets(other)
    assert (mine.layer, mine.flurka_layer, mine.beats_constituents, mine.flash) == (3.0, 2.5, ("flurka-rnn",), 10.0)
    assert speed_tables.floor_target("flurka-rnn", "layer", mine) == 2.5
    assert speed_tables.floor_target("rnn", "layer", mine) == 3.0
    assert speed_tables.floor_target("rnn", "model", mine) is None
    with pytest.raises(tables.NoResults, match="no GPU targets file"):
        speed_tables.gpu_targets(tmp_path / "absent.toml")
    other.write_text(other.read_text().replace('["flurka-rnn"]', '["rnn"]'))
    with pytest.raises(ValueError, match="not FLuRKA variants"):
        speed_tables.gpu_targets(other)
    other.write_text("[floor]\nlayer = 2\n")
    with pytest.raises(ValueError, match="not a GPU targets file"):
        speed_tables.gpu_targets(other)


def test_the_no_attention_control_is_each_tables_floor(engine, sweep_dict, make_trial):
    """Linformer at d_k 1 (mechanisms.CONTROL) is no Linformer cell but the row "no attention": its
    mean ± CI over seeds (BLEU 56, 58, 54 -> 56.0 ± T2 * 2 / sqrt(3)); a cell whose CI does not clear
    its mean says "at floor" (rnn 55, 58, 61: its CI reaches 56); Table 5 gets it as a column."""
    from flurka.results import ingest_sweep

    runs = {("linformer", 16, None): (84.0, 86.0, 85.0), ("linformer", 1, None): (56.0, 58.0, 54.0),
            ("rnn", None, None): (55.0, 58.0, 61.0), ("flurka-rnn", 16, 0.5): (80.0, 81.0, 82.0)}
    trials = [make_trial(f"{m}-{d_k}-{seed}", m, "nmt-list-small", {"bleu": v, "loss": 1.0 - v / 100}, seed=seed,
                         d_k=d_k, alpha=alpha, base="low-rank" if alpha else None)
              for (m, d_k, alpha), values in runs.items() for seed, v in enumerate(values)]
    ingest_sweep(engine, {**sweep_dict, "trials": trials})
    half = T2 * 2 / math.sqrt(3)
    col = "BLEU (char, 0–100)"
    table = quality_tables.metric_table(engine, [(col, "nmt-list-small", "bleu")])
    assert list(table.index) == ["linformer", "rnn", "flurka-rnn", "no attention"]
    assert table.at["linformer", col] == "85.0 ± 2.5 (n=3)"                      # d_k 16 only
    assert table.at["no attention", col] == f"56.0 ± {half:.1f} (n=3)"
    assert table.at["rnn", col] == f"58.0 ± {T2 * 3 / math.sqrt(3):.1f} (n=3), at floor"
    assert "Linformer at d_k = 1" in table.attrs["note"]
    up = quality_tables.uptraining_table(engine, benchmark="nmt-list-small", metric="bleu")
    assert list(up.columns) == ["kernel constituent", "kernel", "low-rank", "50%", "no attention"]
    assert up.iloc[0].tolist() == ["rnn", f"58.0 ± {T2 * 3 / math.sqrt(3):.1f} (n=3), at floor", "85.0 ± 2.5 (n=3)",
                                   "81.0 ± 2.5 (n=3) *", f"56.0 ± {half:.1f} (n=3)"]
    loss = quality_tables.uptraining_table(engine, benchmark="nmt-list-small", metric="loss")
    assert loss.iloc[0]["kernel"].endswith("at floor")            # lower is better: 0.42 reaches 0.44
    assert not loss.iloc[0]["low-rank"].endswith("at floor")
