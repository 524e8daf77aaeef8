"""Repeated runs of one speed point (two GPU leases) reach the report as one point."""

from __future__ import annotations

import pandas as pd
import pytest

from flurka.reports.sources import SPEED_CONFIG
from flurka.results.tables import combine_repeats
from flurka.reports.sections import speed_groups


def _row(mechanism, n, median, status="ok", host_run=0):
    config = dict(device="NVIDIA H200", mode="forward", scope="layer", dtype="bfloat16", batch=1, N=n,
                  d_model=2600, heads=8, d_k=1500, m=325, layers=None, ffn=None, align=1, fused=False)
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
