"""flurka.stats against scipy on known samples (the expected numbers worked out here, by hand or
by scipy calls of their own), the tie rule, one seed, NaNs, the bootstrap from 10 seeds; and the
worker's quality table (``python -m flurka.training.quality_table``), which reports with it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as st

from flurka import stats

T_975_DF2 = 4.302652729749464    # Student's t 97.5 % quantile, 2 and 4 degrees of freedom (tables)
T_975_DF4 = 2.7764451051977987


def test_quantiles_are_the_tabled_ones():
    assert st.t.ppf(0.975, 2) == pytest.approx(T_975_DF2, rel=1e-12)
    assert st.t.ppf(0.975, 4) == pytest.approx(T_975_DF4, rel=1e-12)


def test_mean_ci_is_students_t_below_ten_seeds():
    est = stats.mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    sem = math.sqrt(2.5) / math.sqrt(5)              # sample sd sqrt(2.5), n = 5
    assert (est.mean, est.n) == (3.0, 5)
    assert est.low == pytest.approx(3.0 - T_975_DF4 * sem, rel=1e-12)
    assert est.high == pytest.approx(3.0 + T_975_DF4 * sem, rel=1e-12)
    assert est.half_width == pytest.approx(1.9632431614775574, rel=1e-12)
    lo, hi = st.t.interval(0.95, 4, loc=3.0, scale=st.sem([1, 2, 3, 4, 5]))
    assert (est.low, est.high) == pytest.approx((lo, hi), rel=1e-12)
    assert est.holds(3.0) and est.holds(1.04) and not est.holds(1.03) and not est.holds(4.97)


def test_format_of_a_cell():
    # 96.0, 97.5, 98.1: mean 97.2, sd sqrt(1.17), half-width 4.3027 * sqrt(1.17 / 3) = 2.687
    est = stats.mean_ci([96.0, 97.5, 98.1])
    assert est.half_width == pytest.approx(T_975_DF2 * math.sqrt(1.17 / 3), rel=1e-9)
    assert est.format() == "97.2 ± 2.7 (n=3)"
    assert est.format(2) == "97.20 ± 2.69 (n=3)"
    assert stats.mean_ci([97.25]).format() == "97.2 (1 seed)"
    assert stats.mean_ci([]).format() == "—"
    assert stats.Estimate(57.2, math.nan, math.nan, 3).format() == "57.2 (no CI)"
    assert stats.Estimate(1.25, 0.5, 2.0, 3).format(1, sign=True) == "+1.2 ± 0.8 (n=3)"
    assert stats.Estimate(97.2333, 95.1111, 99.3555, 3).rounded(1) == stats.Estimate(97.2, 95.1, 99.4, 3)


def test_above_a_line_means_the_whole_interval_clears_it():
    est = stats.mean_ci([13.0, 15.0, 17.0])          # 15 ± 4.3027 * 2 / sqrt(3) = 4.97: from 10.03
    lo, _ = st.t.interval(0.95, 2, loc=15.0, scale=st.sem([13.0, 15.0, 17.0]))
    assert est.above(lo - 0.01) and not est.above(lo + 0.01) and not est.above(13.9)
    assert stats.mean_ci([14.0]).above(13.9) and not stats.mean_ci([13.0]).above(13.9)   # one seed: the mean
    assert not stats.Estimate(14.0, math.nan, math.nan, 3).above(14.0)                   # no CI: the mean


def test_one_seed_has_no_interval():
    est = stats.mean_ci([0.7])
    assert est.mean == 0.7 and est.n == 1 and math.isnan(est.low) and math.isnan(est.high)
    assert not est.holds(0.7)
    p = stats.paired({0: 1.0, 1: 5.0}, {0: 0.5, 2: 9.0}, names=("a", "b"))   # one common seed
    assert p.seeds == (0,) and p.diff.n == 1 and p.diff.mean == 0.5 and math.isnan(p.p)
    assert p.verdict == "n<2" and p.winner(lower_is_better=True) == "n<2"
    assert p.format() == "+0.5 (1 seed)"


def test_nans_and_infinities_are_dropped():
    est = stats.mean_ci([1.0, math.nan, 3.0, math.inf])
    assert est.n == 2 and est.mean == 2.0
    assert est.high == pytest.approx(2.0 + st.t.ppf(0.975, 1) * 1.0, rel=1e-12)   # sem of (1, 3): 1
    p = stats.paired({0: 1.0, 1: math.nan, 2: 3.0, 3: 4.0}, {0: 0.0, 1: 1.0, 2: 1.0, 3: math.nan})
    assert p.seeds == (0, 2) and p.diff.mean == 1.5
    assert stats.mean_ci([math.nan]).n == 0


def test_paired_against_scipy_and_the_tie_rule():
    a = {0: 1.0, 1: 2.0, 2: 4.0, 7: 100.0}      # seed 7 has no partner: left out
    b = {0: 0.5, 1: 1.0, 2: 2.0}
    p = stats.paired(a, b, names=("flurka-rnn", "rnn"))
    d = np.array([0.5, 1.0, 2.0])
    assert p.seeds == (0, 1, 2) and p.diff.n == 3
    assert p.diff.mean == pytest.approx(7 / 6)
    half = T_975_DF2 * d.std(ddof=1) / math.sqrt(3)
    assert (p.diff.low, p.diff.high) == pytest.approx((7 / 6 - half, 7 / 6 + half), rel=1e-12)
    assert p.p == pytest.approx(st.ttest_rel([1.0, 2.0, 4.0], [0.5, 1.0, 2.0]).pvalue, rel=1e-12)
    assert p.p == pytest.approx(0.11808289631180308, rel=1e-9)
    assert p.diff.low < 0 < p.diff.high            # every seed says a > b, but the CI holds 0:
    assert p.verdict == "tie" and p.winner(True) == "tie"
    assert p.format(2) == "+1.17 ± 1.90 (n=3), p=0.12"


def test_paired_beyond_noise_and_lower_is_better():
    a = {0: 10.0, 1: 11.0, 2: 12.5}
    b = {0: 9.0, 1: 9.5, 2: 10.6}               # differences 1.0, 1.5, 1.9
    p = stats.paired(a, b, names=("A", "B"))
    half = T_975_DF2 * np.std([1.0, 1.5, 1.9], ddof=1) / math.sqrt(3)
    assert p.diff.low == pytest.approx(4.4 / 3 - half) and p.diff.low > 0
    assert p.p == pytest.approx(st.ttest_rel([10.0, 11.0, 12.5], [9.0, 9.5, 10.6]).pvalue)
    assert p.verdict == "A" and p.winner() == "A"
    assert p.winner(lower_is_better=True) == "B"    # A's loss is higher: B is better
    flipped = stats.paired(b, a, names=("B", "A"))
    assert flipped.verdict == "A" and flipped.diff.mean == pytest.approx(-p.diff.mean)
    same = stats.paired({0: 1.0, 1: 2.0}, {0: 0.0, 1: 1.0})       # equal differences: no spread
    assert same.diff.low == same.diff.high == 1.0 and same.verdict == "A" and same.p == 0.0


def test_bootstrap_from_ten_seeds():
    rng = np.random.default_rng(3)
    values = list(rng.normal(70.0, 2.0, size=12))
    est = stats.mean_ci(values)
    boot = st.bootstrap((np.array(values),), np.mean, confidence_level=0.95, method="BCa", n_resamples=9999,
                        random_state=0).confidence_interval
    assert est.n == 12 and est.mean == pytest.approx(np.mean(values))
    assert (est.low, est.high) == pytest.approx((boot.low, boot.high), rel=1e-12)
    t_lo, t_hi = st.t.interval(0.95, 11, loc=np.mean(values), scale=st.sem(values))
    assert abs(est.low - t_lo) > 1e-6 and est.low < est.mean < est.high       # not the t path
    assert stats.mean_ci(values) == est                                        # fixed seed: same cell twice
    nine = stats.mean_ci(values[:9])                                           # below ten: t again
    assert (nine.low, nine.high) == pytest.approx(
        st.t.interval(0.95, 8, loc=np.mean(values[:9]), scale=st.sem(values[:9])), rel=1e-12)


# -- python -m flurka.training.quality_table --------------------------------------------------------

def _line(bench, mech, seed, value, loss, metric="bleu", status="ok"):
    return json.dumps({"benchmark": bench, "attention": mech, "status": status, "metric": metric,
                       "value": value, "loss": loss, "seed": seed})


def test_quality_table_summarize(tmp_path, capsys):
    from flurka.training import quality_table as Q

    rnn = [(71.0, 0.91), (73.0, 0.88), (72.0, 0.90)]
    lin = [(97.9, 0.40), (97.2, 0.42), (97.5, 0.41)]
    fr = [(73.2, 0.85), (74.4, 0.86), (71.0, 0.87)]
    lines = [_line("nmt-small", m, s, v, l) for m, rows in (("rnn", rnn), ("linformer", lin), ("flurka-rnn", fr))
             for s, (v, l) in enumerate(rows)]
    lines += [_line("nmt-small", "rnn", 2, 10.0, 9.0),                 # a rerun of seed 2 listed earlier...
              _line("nmt-small", "rnn", 2, 72.0, 0.90),                # ...and the last one counts
              _line("lra-listops-small", "rnn", 0, 0.457, 1.6, metric="accuracy"),
              _line("lra-listops-small", "flurka-rnn", 0, None, None, status="error: boom"),
              "not json: a warning a library printed"]
    path = tmp_path / "table.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert Q.main(["--summarize", str(path)]) == 0
    out = capsys.readouterr().out
    # rnn 71, 73, 72: 72.0 ± 4.3027 * 1 / sqrt(3) = 2.48; linformer 97.5 ± 4.3027 * 0.3512 / sqrt(3) = 0.87
    assert "| rnn | 72.0 ± 2.5 (n=3) | 0.897 ± 0.038 (n=3) |" in out
    assert "| linformer | 97.5 ± 0.9 (n=3) | 0.410 ± 0.025 (n=3) |" in out
    assert "| rnn | 45.7 (1 seed) | 1.60 (1 seed) |" in out          # accuracy in percent
    assert "BLEU (char, 0–100)" in out and "accuracy (%)" in out
    assert out.index("lra-listops-small:") < out.index("nmt-small:")
    # flurka-rnn − linformer: −24.7, −22.8, −26.5; − rnn: +2.2, +1.4, −1.0 (a tie); loss: −0.06, −0.02, −0.03
    d_lin = np.array([73.2, 74.4, 71.0]) - np.array([97.9, 97.2, 97.5])
    p_lin = st.ttest_rel([73.2, 74.4, 71.0], [97.9, 97.2, 97.5]).pvalue
    half = T_975_DF2 * d_lin.std(ddof=1) / math.sqrt(3)
    row = next(r for r in out.splitlines() if r.startswith("| flurka-rnn | linformer |"))
    # two tests per column (vs linformer, vs rnn): Holm doubles the smaller p, linformer's
    assert f"| {d_lin.mean():+.1f} ± {half:.1f} (n=3), p={p_lin:.2g}, p_holm={2 * p_lin:.2g} | linformer |" in row
    loss_p = st.ttest_rel([0.85, 0.86, 0.87], [0.40, 0.42, 0.41]).pvalue
    assert row.endswith(f"p={loss_p:.2g}, p_holm={2 * loss_p:.2g} | linformer |")   # higher loss: linformer is better
    row = next(r for r in out.splitlines() if r.startswith("| flurka-rnn | rnn |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "tie"                                            # BLEU: CI holds 0
    d_loss = np.array([0.85, 0.86, 0.87]) - np.array([0.91, 0.88, 0.90])
    lo = d_loss.mean() - T_975_DF2 * d_loss.std(ddof=1) / math.sqrt(3)
    assert lo < 0 and d_loss.mean() + T_975_DF2 * d_loss.std(ddof=1) / math.sqrt(3) > 0   # a tie too
    assert cells[5] == "tie"

    # ListOps with its chance line (13.9 %): rnn 13, 15, 17 reaches it, full 50, 52, 54 clears it
    chance = [json.dumps({**json.loads(_line("lra-listops-small", m, s, v / 100, 1.5, metric="accuracy")),
                          "chance": 0.139}) for m, vals in (("full", (50, 52, 54)), ("rnn", (13, 15, 17)))
              for s, v in enumerate(vals)]
    path.write_text("\n".join(chance) + "\n")
    assert Q.main(["--summarize", str(path)]) == 0
    out = capsys.readouterr().out
    half = T_975_DF2 * 2 / math.sqrt(3)
    assert f"| rnn | 15.0 ± {half:.1f} (n=3), at chance |" in out and f"| full | 52.0 ± {half:.1f} (n=3) |" in out
    assert "| chance | 13.9 |  |" in out and stats.CHANCE_NOTE in out

    empty = tmp_path / "empty.jsonl"
    empty.write_text(_line("nmt-small", "rnn", 0, None, None, status="error: x") + "\n")
    assert Q.main(["--summarize", str(empty)]) == 1
    assert "no ok runs" in capsys.readouterr().err


def test_quality_table_runs_each_mechanism_per_seed(monkeypatch, capsys):
    from flurka.training import quality_table as Q

    seen = []

    def fake_run(config, progress=False):
        seen.append((config.model.attention, config.seed, config.steps))
        if config.model.attention == "rnn" and config.seed == 1:
            raise RuntimeError("boom")
        return {"status": "ok", "final_metrics": {"accuracy": 0.5 + config.seed / 100, "loss": 1.5 - config.seed / 10,
                                                  "majority_accuracy": 0.139},
                "seed": config.seed, "steps": config.steps, "wall_time_s": 1.23, "train_flops": 7}

    monkeypatch.setattr(Q, "run", fake_run)
    assert Q.main(["--benchmarks", "lra-listops-small", "--mechanisms", "rnn", "flurka-rnn", "--seeds", "0,1,2",
                   "--steps", "3"]) == 0
    assert seen == [(m, s, 3) for m in ("rnn", "flurka-rnn") for s in (0, 1, 2)]
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 6
    assert rows[1] == {"benchmark": "lra-listops-small", "attention": "rnn", "control": False, "seed": 1,
                       "status": "error: boom"}
    assert rows[2]["loss"] == pytest.approx(1.3) and rows[2]["value"] == pytest.approx(0.52)
    assert rows[2]["metric"] == "accuracy" and rows[2]["seed"] == 2 and rows[2]["chance"] == 0.139
    assert {r["attention"] for r in rows} == {"rnn", "flurka-rnn"}
    summary = Q.summarize(Q.read_runs(json.dumps(r) for r in rows))
    assert "| rnn | 51.0 (no CI) |" not in summary and "| rnn | 51.0 ±" in summary   # seeds 0 and 2
    with pytest.raises(SystemExit):
        Q.main(["--seeds", "0,x"])

    # --control: the no-attention control per seed, Linformer at d_k 1, its own row (the floor)
    dks = []
    monkeypatch.setattr(Q, "run", lambda config, progress=False: (
        dks.append((config.model.attention, dict(config.model.attention_options).get("d_k"))),
        fake_run(config.replace(seed=config.seed + 3)))[1])
    assert Q.main(["--benchmarks", "lra-listops-small", "--mechanisms", "linformer", "--seeds", "0,1", "--control",
                   "--steps", "3"]) == 0
    assert dks == [("linformer", 16)] * 2 + [("linformer", 1)] * 2
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["control"], r["d_k"]) for r in rows] == [(False, 16)] * 2 + [(True, 1)] * 2
    for r in rows[2:]:                                    # the floor: 1 point below Linformer's seeds
        r["metrics"] = {"accuracy": r["metrics"]["accuracy"] - 0.01}
    summary = Q.summarize(Q.read_runs(json.dumps(r) for r in rows))
    assert f"| {Q.CONTROL_NAME} | 52.5 ± " in summary and "| linformer | 53.5 ± " in summary
    assert "| linformer | no attention |" in summary       # every mechanism paired with the floor


def test_holm_matches_the_textbook_and_statsmodels():
    """Holm's step-down on known p-values: sorted 0.005, 0.01, 0.03, 0.04 are multiplied by 4, 3,
    2, 1 and made monotone (0.02, 0.03, 0.06, 0.06), returned in the input's order; a NaN (no
    test) stays NaN and does not enlarge the family."""
    from statsmodels.stats.multitest import multipletests

    from flurka.stats import holm

    p = [0.01, 0.04, float("nan"), 0.03, 0.005]
    got = holm(p)
    np.testing.assert_allclose([got[i] for i in (0, 1, 3, 4)], [0.03, 0.06, 0.06, 0.02])
    assert math.isnan(got[2])
    np.testing.assert_allclose([got[i] for i in (0, 1, 3, 4)],
                               multipletests([0.01, 0.04, 0.03, 0.005], method="holm")[1])
    assert holm([]) == [] and holm([0.7]) == [0.7]


def test_a_family_decides_ties_on_the_adjusted_p():
    """Alone, a difference whose CI excludes 0 wins; in a family of three tests its Holm-adjusted p
    (3 × 0.02 here) is above 0.05, and the verdict is a tie — the raw p shown beside it."""
    from flurka.stats import Estimate, Paired, in_family

    win = Paired("a", "b", Estimate(1.0, 0.2, 1.8, 3), 0.02, (0, 1, 2))
    assert win.verdict == "a" and "p_holm" not in win.format()
    others = [Paired("a", "c", Estimate(0.5, -1.0, 2.0, 3), 0.5, (0, 1, 2)),
              Paired("a", "d", Estimate(0.1, -1.0, 1.2, 3), 0.9, (0, 1, 2))]
    family = in_family([win, *others])
    assert family[0].p_adjusted == pytest.approx(0.06)
    assert family[0].verdict == "tie" and family[0].p == 0.02
    assert family[0].format() == "+1.0 ± 0.8 (n=3), p=0.02, p_holm=0.06"
    strong = Paired("a", "b", Estimate(1.0, 0.2, 1.8, 3), 0.001, (0, 1, 2))
    assert in_family([strong, *others])[0].verdict == "a"       # 3 × 0.001 < 0.05
