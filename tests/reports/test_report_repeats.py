"""Repeated runs of one speed point (two GPU leases) reach the report as one point; its padded
twin (pad_to) stays another point; a ratio of two mechanisms is taken within a run."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flurka.reports.sources import PROFILE_KINDS, SPEED_CONFIG
from flurka.results.speed_tables import combine_repeats
from flurka.reports.sections import _filters, profile_section, speed_groups


def _row(mechanism, n, median, status="ok", host_run=0, pad_to=1):
    config = dict(device="NVIDIA H200", mode="forward", scope="layer", dtype="bfloat16", batch=1, N=n,
                  d_model=2600, heads=8, d_k=1500, m=325, layers=None, ffn=None, align=1, fused=False, fused_projections=False,
                  fused_ffn=False,
                  pad_to=pad_to, xla="")
    return {"mechanism": mechanism, **config, "status": status, "median_s": median, "spread_s": None,
            "flops": 1e12, "sweep": "n-sweep", "run": host_run}


def test_repeats_become_the_median_and_the_n_sweep_stays_a_group():
    rows = pd.DataFrame([
        _row("linformer", 7050, 0.0027), _row("linformer", 55500, 0.0164), _row("linformer", 55500, 0.0166, host_run=1),
        _row("linformer", 55500, 0.0200, host_run=2),
        _row("full", 7050, 0.0073), _row("full", 55500, None, "oom"), _row("full", 55500, None, "oom", host_run=1),
        _row("rnn", 7050, None, "oom"), _row("rnn", 7050, 0.0018, host_run=1)])
    out = combine_repeats(rows, ["mechanism", *SPEED_CONFIG])
    point = out.set_index(["mechanism", "N"])
    assert len(out) == 5 and not out.duplicated(["mechanism", *SPEED_CONFIG]).any()
    assert point.at[("linformer", 55500), "median_s"] == pytest.approx(0.0166)   # median of three
    assert point.at[("full", 55500), "status"] == "oom"                          # OOM twice: OOM
    assert point.at[("rnn", 7050), "status"] == "ok"                             # one run fitted
    # before combining, the duplicated 55500 points made the whole N-sweep group unplottable
    assert speed_groups(rows, "N") == []
    assert [len(g) for g in speed_groups(out, "N")] == [5]


def test_padded_runs_are_their_own_group_and_label():
    """A sweep pads every mechanism's batch alike: its padded runs form a group of their own (never
    beside unpadded baselines), the library's table is pinned to it, and a profile says "pad to"."""
    plain = [_row(m, n, t) for m, n, t in (("linformer", 7050, 0.0027), ("linformer", 55500, 0.0164),
                                            ("rnn", 7050, 0.0018), ("rnn", 55500, 0.0120))]
    padded = [{**r, "pad_to": 128, "median_s": r["median_s"] * 0.9} for r in plain]
    groups = speed_groups(pd.DataFrame(plain + padded), "N")
    assert sorted(g["pad_to"].unique().tolist() for g in groups) == [[1], [128]]
    assert sorted(_filters(g)["pad_to"] for g in groups) == [1, 128]
    profiled = pd.DataFrame([{**r, "traced_s": r["median_s"], "top_op": "gemm",
                              **{f"share_{k}": float(k == "gemm") for k in PROFILE_KINDS}}
                             for r in (plain[1], padded[1])])
    plot, table = profile_section(profiled).items
    assert [t.get_text() for t in plot.fig.axes[0].get_yticklabels()] == [
        "linformer forward layer N=55500", "linformer forward layer N=55500, pad_to 128"]
    assert table.df.index.get_level_values("pad_to").tolist() == [1, 128]


def test_best_execution_table_compares_fused_padded_flurka_with_plain_flash(tmp_path):
    """The flash comparison's headline — FLuRKA fused and padded, flash as cuDNN runs it — at one
    N is in no N-sweep group (one execution each); the report's best-execution table shows it.
    A configuration measured in one execution only gets no such table (it would repeat one)."""
    from flurka.reports.sections import best_execution_tables
    from flurka.reports.sources import combine_runs, speed_runs
    from flurka.results import ingest_speed, open_results

    def speed(mechanism, median, config=None, d_model=512):
        return {"device": "NVIDIA H200", "host": "node", "versions": {"jax": "0.11.2"}, "mechanism": mechanism,
                "mode": "forward", "N": 52500, "d_model": d_model, "heads": 4, "d_k": 1024, "m": 128,
                "status": "ok", "median_s": median, "config": config}

    engine = open_results(f"sqlite:///{tmp_path / 'r.db'}")
    ingest_speed(engine, [speed("flash", 0.0656), speed("flurka-rnn", 0.0061),
                          speed("flurka-rnn", 0.0045, {"fused": True, "pad_to": 128}),
                          speed("flash", 0.0300, d_model=256), speed("flurka-rnn", 0.003, d_model=256)])
    (table,) = best_execution_tables(engine, combine_runs(speed_runs(engine)))
    engine.dispose()
    assert "d_model=512" in table.caption and "fastest" in table.title
    row = table.df.loc[("flurka-rnn", 52500)]
    assert row["vs flash"] == pytest.approx(0.0656 / 0.0045)
    assert row["executions"] == "flurka-rnn: fused, pad_to 128; flash: plain"


def test_repeats_take_the_median_of_each_runs_measurements():
    """Step time, spread and floor of a point run three times: each the median over its runs (a
    run without a spread or floor counts for neither); a point run once keeps its own."""
    runs = [(0.0164, 0.0010, 0.0100), (0.0166, 0.0017, 0.0110), (0.0200, None, None)]
    rows = [{**_row("linformer", 55500, t, host_run=i), "spread_s": w, "floor_s": f}
            for i, (t, w, f) in enumerate(runs)]
    rows.append({**_row("linformer", 7050, 0.0027), "spread_s": 0.0003, "floor_s": 0.002})
    point = combine_repeats(pd.DataFrame(rows), ["mechanism", *SPEED_CONFIG]).set_index("N")
    assert point.at[55500, "runs"] == 3 and point.at[55500, "median_s"] == pytest.approx(0.0166)
    assert point.at[55500, "spread_s"] == pytest.approx(0.00135)
    assert point.at[55500, "floor_s"] == pytest.approx(0.0105)
    assert point.loc[7050, ["median_s", "spread_s", "floor_s", "runs"]].tolist() == [0.0027, 0.0003, 0.002, 1]


def test_drift_between_leases_is_not_noise_in_a_ratio(tmp_path):
    """Through the database: lease b ran 1.5× slower than lease a throughout (another card's
    clocks, another day), each lease tight (2 % spreads) and flurka-rnn 1.3× rnn in both. The
    combined point keeps the 1.3× and a 2 % spread, so the claims read a win, not a tie that
    the two leases' 1.5× apart would make."""
    from flurka.reports.sections import claims_table, flop_pairs
    from flurka.reports.sources import combine_runs, speed_runs
    from flurka.results import ingest_speed, open_results

    def speed(mechanism, median, host):
        return {"device": "NVIDIA H200", "host": host, "versions": {"jax": "0.11.2"}, "mechanism": mechanism,
                "mode": "forward", "scope": "layer", "N": 55500, "d_model": 2600, "heads": 8, "d_k": 1500,
                "m": 325, "status": "ok", "median_s": median, "flops": 1e12, "spread_s": 0.02 * median}

    engine = open_results(f"sqlite:///{tmp_path / 'r.db'}")
    ingest_speed(engine, [speed("rnn", 0.013, "a"), speed("flurka-rnn", 0.010, "a"),
                          speed("rnn", 0.0195, "b"), speed("flurka-rnn", 0.015, "b")])
    rows = combine_runs(speed_runs(engine))
    engine.dispose()
    rnn = rows[rows["mechanism"] == "rnn"].iloc[0]
    assert rnn["runs"] == 2 and rnn["median_s"] == pytest.approx(0.01625)
    assert rnn["spread_s"] == pytest.approx(0.02 * 0.01625)
    (pair,) = flop_pairs(rows).query("baseline == 'rnn'").to_dict("records")
    assert pair["measured_speedup"] == pytest.approx(1.3) and pair["ratio_spread"] == pytest.approx(0.02)
    claim3 = claims_table(flop_pairs(rows)).xs("claim 3: N > d_k(H+2), d_m > d_k", level="claim")
    assert claim3[["measured faster", "within spread", "measured slower"]].values.tolist() == [[1, 0, 0]]


def _document(created, results):
    """A flurka.speed document of forward layer points at d_model 2600, 8 heads, d_k 1500."""
    point = {"mode": "forward", "scope": "layer", "d_model": 2600, "num_heads": 8, "d_k": 1500, "num_features": 325,
             "dtype": "bfloat16", "status": "ok", "flops": 1e12}
    return {"schema": "flurka.speed/1", "created": created, "device": {"name": "NVIDIA H200", "host": "vm"},
            "versions": {"jax": "0.11.2"},
            "results": [{**point, "mechanism": m, "seq_len": n, "median_s": t, "p10_s": 0.99 * t, "p90_s": 1.01 * t}
                        for m, n, t in results]}


def test_ratios_are_taken_within_a_run(tmp_path):
    """Lease a times flurka-rnn and rnn at 7050 (0.88×) and both at 55500 (1.2×); lease b times
    flurka-rnn alone at 7050, faster, and both at 55500 (1.4×); rnn alone at 20000 in a, flurka-rnn
    alone there in b. The 7050 ratio is lease a's (b has no rnn to pair with), 55500's the median
    of the two leases' ratios, and 20000's the only cross-lease one, marked unpaired; the
    report's pairs and `flurka tables`' speedups alike. Combining the times first would have put
    7050 at (0.0207 + 0.0158) / 2 / 0.0182 ≈ 1.0."""
    from flurka.reports.sections import flop_pairs
    from flurka.reports.sources import combine_runs, speed_runs
    from flurka.results import ingest_file, open_results
    from flurka.results.speed_tables import speedup_table

    docs = {"a": _document("2026-11-26T00:42:07+00:00", [("flurka-rnn", 7050, 0.0207), ("rnn", 7050, 0.0182),
                                                          ("flurka-rnn", 55500, 0.100), ("rnn", 55500, 0.120),
                                                          ("rnn", 20000, 0.050)]),
            "b": _document("2026-11-27T04:09:24+00:00", [("flurka-rnn", 7050, 0.0158), ("flurka-rnn", 55500, 0.090),
                                                          ("rnn", 55500, 0.126), ("flurka-rnn", 20000, 0.040)])}
    engine = open_results(f"sqlite:///{tmp_path / 'r.db'}")
    for name, doc in docs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
        ingest_file(engine, tmp_path / f"{name}.json")
    runs = speed_runs(engine)
    speedups = speedup_table(engine, mode="forward")
    table = speedups.loc["flurka-rnn", "vs kernel"]   # `flurka tables` alike
    engine.dispose()
    # every time's p10-p90 is 2 % of its median: each ratio's spread w = (2 % + 2 %) / 2
    assert speedups.attrs["spread"].loc["flurka-rnn", "vs kernel"].to_dict() == pytest.approx(
        {7050: 0.02, 20000: 0.02, 55500: 0.02})
    assert table.to_dict() == pytest.approx({7050: 0.0182 / 0.0207, 20000: 0.050 / 0.040,
                                             55500: (0.120 / 0.100 + 0.126 / 0.090) / 2})
    assert sorted(runs["run"].unique()) == [docs["a"]["created"], docs["b"]["created"]]
    pairs = flop_pairs(runs).query("baseline == 'rnn'").set_index("N")
    assert pairs.at[7050, "measured_speedup"] == pytest.approx(0.0182 / 0.0207)
    assert pairs.at[55500, "measured_speedup"] == pytest.approx((0.120 / 0.100 + 0.126 / 0.090) / 2)
    assert pairs.at[20000, "measured_speedup"] == pytest.approx(0.050 / 0.040)
    assert pairs["runs"].to_dict() == {7050: 1, 55500: 2, 20000: 1}
    assert pairs["paired"].to_dict() == {7050: True, 55500: True, 20000: False}
    assert pairs["ratio_spread"].tolist() == pytest.approx([0.02] * 3)
    combined = flop_pairs(combine_runs(runs)).query("baseline == 'rnn'").set_index("N")
    assert combined.at[7050, "measured_speedup"] == pytest.approx(0.0182 / ((0.0207 + 0.0158) / 2))
