"""Side-by-side timing (``--interleave``): the round-robin schedule, grouping by configuration,
and a failing or out-of-memory point leaving the others timed."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from flurka.speed import bench, configs, runner, timing

TINY = dict(seq_len=64, d_model=32, num_heads=4, d_k=16, num_features=8, layers=2, ffn=32,
            dtype="float32", batch=2)


def test_round_robin_rotates_the_start():
    assert timing.round_robin("abc", 4) == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert timing.round_robin([], 3) == [] and timing.round_robin("ab", 0) == []


def test_side_by_side_groups_differ_only_in_mechanism():
    pts = configs.points("tiny")
    groups = runner.side_by_side(pts, range(len(pts)))
    assert len(groups) == 4                                    # forward/train × layer/model
    for g in groups:
        assert sorted(p.mechanism for _, p in g) == sorted(configs.SWEEPS["tiny"].mechanisms)
        assert len({(p.mode, p.scope) for _, p in g}) == 1
        assert all(pts[i] == p for i, p in g)


def _step(name, calls, fail_on=None):
    def fn():
        calls.append(name)
        if len([c for c in calls if c == name]) == fail_on:
            raise RuntimeError(f"{name} broke")
        return jnp.zeros(())
    return fn


def test_rounds_alternate_and_a_failure_stops_only_its_point(monkeypatch):
    calls: list[str] = []
    steps = {"rnn": _step("rnn", calls), "performer": _step("performer", calls, fail_on=3),
             "linformer": _step("linformer", calls)}

    def prepare(point, *, memory_budget_bytes=None):
        result = {**point.as_dict(), "status": None}
        if point.mechanism == "full":                          # over the budget: never run
            return bench.Prepared({**result, "status": "oom", "oom_source": "budget"})
        return bench.Prepared(result, steps[point.mechanism], ())

    monkeypatch.setattr(bench, "prepare", prepare)
    pts = [configs.Point(mechanism=m, mode="forward", scope="layer", **TINY)
           for m in ("rnn", "full", "performer", "linformer")]
    rows = bench.run_interleaved(pts, None, warmup=1, repeats=3, per_sample=1)
    assert calls[:3] == ["rnn", "performer", "linformer"]       # warm-up round
    assert calls[3:6] == ["performer", "linformer", "rnn"]      # each round starts one later
    assert calls[6:8] == ["linformer", "rnn"]                   # performer raised on its 3rd call
    assert calls.count("performer") == 3 and calls.count("rnn") == calls.count("linformer") == 4
    assert [r["status"] for r in rows] == ["ok", "oom", "error", "ok"]
    assert "broke" in rows[2]["error"] and "median_s" not in rows[2]
    assert rows[0]["repeats"] == rows[3]["repeats"] == 3 and rows[0]["interleaved"]


def test_real_points_side_by_side():
    too_big = configs.Point(mechanism="full", mode="forward", scope="layer", seq_len=512, d_model=512,
                            num_heads=4, d_k=64, dtype="float32", batch=2**22)   # x alone is 4 TiB
    pts = [configs.Point(mechanism="rnn", mode="train", scope="layer", **TINY), too_big,
           configs.Point(mechanism="flurka-rnn", mode="train", scope="layer", **TINY)]
    rows = bench.run_interleaved(pts, None, warmup=1, repeats=2)
    assert [r["status"] for r in rows] == ["ok", "oom", "ok"] and rows[1]["oom_source"] == "xla"
    for r in (rows[0], rows[2]):
        assert 0 < r["min_s"] <= r["median_s"] <= r["p90_s"] and r["repeats"] == 2 and r["flops"] > 0


def test_bad_counts_fail_before_anything_compiles(monkeypatch):
    monkeypatch.setattr(bench, "prepare", lambda *a, **k: pytest.fail("compiled before checking"))
    point = configs.Point(mechanism="rnn", mode="forward", scope="layer", **TINY)
    with pytest.raises(ValueError, match="repeats"):
        bench.run_interleaved([point], repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        bench.run_interleaved([point], warmup=-1)
