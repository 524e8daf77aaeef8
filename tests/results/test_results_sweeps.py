"""A results database shared by several sweeps: a table reads one sweep unless told to pool, and a
cell never averages runs set up differently (issue: three sweeps in one PostgreSQL database, 8 and
2000 steps, made a kernel cell of mean(6.25, 50, 50) "(n=2)")."""

from __future__ import annotations

import argparse

import pytest

from flurka.results import cli, ingest_sweep, quality_tables

NMT = "nmt-small"


def _sweep(sweep_id: str, name: str, created: str, steps: int, values: dict[str, list[float]]) -> dict:
    """A sweep of ``steps``-step trials: per mechanism its BLEU per seed (FLuRKA up-trained at α 0.25)."""
    trials = []
    for mech, bleus in values.items():
        for seed, bleu in enumerate(bleus):
            up = mech.startswith("flurka-")
            trials.append({
                "trial_key": f"{mech}-{seed}", "attention": mech, "benchmark": NMT, "seed": seed, "status": "ok",
                "steps": steps, "alpha": 0.25 if up else None, "base": "low-rank" if up else None,
                "d_k": 16 if mech in ("linformer", "flurka-rnn") else None, "num_features": None,
                "metrics": {"bleu": bleu},
                "config": {"benchmark": NMT, "attention": mech, "seed": seed, "steps": steps, "d_model": 64,
                           "alpha": 0.25 if up else 0.0, "workdir": f"/runs/{sweep_id}/{mech}-{seed}",
                           "attention_options": {"d_k": 16, "num_features": 32, "e_init": "pool"}}})
    return {"sweep_id": sweep_id, "name": name, "created_at": created, "git_commit": "abc1234",
            "environment": {"device": "cpu", "host": "h", "versions": {}}, "trials": trials}


def run_cli(argv, capsys):
    parser = argparse.ArgumentParser(prog="flurka tables")
    cli.add_arguments(parser)
    code = cli.run(parser.parse_args(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _rnn_cell(md: str) -> str:
    """The "kernel" column of the flurka-rnn row: rnn trained from scratch."""
    lines = [line for line in md.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].split("|")]
    row = next(line for line in lines if "flurka-rnn" in line)
    return row.split("|")[header.index("kernel")].strip()


@pytest.fixture
def three_sweeps(engine):
    """Two short sweeps (8 steps) named "uptrain" and a long one (2000 steps) named "uptrain", oldest first."""
    short = {"rnn": [6.25], "linformer": [7.0], "flurka-rnn": [6.5]}
    ingest_sweep(engine, _sweep("uptrain-a", "uptrain", "2026-12-01T10:00:00+00:00", 8, short))
    ingest_sweep(engine, _sweep("uptrain-b", "uptrain", "2026-12-02T10:00:00+00:00", 2000,
                                {"rnn": [50.0, 50.0], "linformer": [55.0, 56.0], "flurka-rnn": [57.0, 58.0]}))
    ingest_sweep(engine, _sweep("uptrain-c", "uptrain", "2026-12-03T10:00:00+00:00", 8,
                                {"rnn": [7.25], "linformer": [8.0], "flurka-rnn": [7.5]}))
    return engine.url.render_as_string(hide_password=False)


def test_the_default_is_the_newest_sweep_and_stderr_says_so(three_sweeps, capsys):
    code, md, err = run_cli(["--db", three_sweeps, "--table", "uptraining"], capsys)
    assert code == 0 and _rnn_cell(md) == "7.2 (1 seed)"                     # uptrain-c's rnn alone
    assert "sweep uptrain-c ('uptrain', 2026-12-03 10:00), the newest of the 3 sweeps" in err
    assert "--all-sweeps to pool them" in err


def test_a_name_held_by_several_sweeps_means_its_newest(three_sweeps, capsys):
    code, md, err = run_cli(["--db", three_sweeps, "--table", "uptraining", "--sweep", "uptrain"], capsys)
    assert code == 0 and _rnn_cell(md) == "7.2 (1 seed)"
    assert "sweep uptrain-c, the newest of the 3 sweeps named 'uptrain'" in err
    code, md, err = run_cli(["--db", three_sweeps, "--table", "uptraining", "--sweep", "uptrain-b"], capsys)
    assert code == 0 and _rnn_cell(md).startswith("50.0 ± ") and "(n=2)" in _rnn_cell(md) and "newest" not in err
    code, _, err = run_cli(["--db", three_sweeps, "--table", "uptraining", "--sweep", "nope"], capsys)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("flurka tables: no sweep with id or name 'nope' holds ok trials; the database holds "
                          "uptrain-c ('uptrain'), uptrain-b ('uptrain'), uptrain-a ('uptrain')")


def test_pooling_is_explicit_and_refuses_runs_set_up_differently(three_sweeps, capsys):
    code, md, err = run_cli(["--db", three_sweeps, "--table", "uptraining", "--all-sweeps"], capsys)
    assert code == 1 and md == "" and err.count("\n") == 1
    assert "nmt-small: its trials come from 2 different setups (steps 8 vs 2000" in err
    assert "choose one sweep (flurka tables --sweep ID)" in err
    with pytest.raises(SystemExit):   # --sweep and --all-sweeps exclude each other
        run_cli(["--db", three_sweeps, "--table", "uptraining", "--all-sweeps", "--sweep", "uptrain-a"], capsys)


def test_sweeps_set_up_alike_pool_into_one_cell(engine, capsys):
    """Seeds split over two sweeps of the same experiment are one cell (n adds up) with --all-sweeps;
    the paths, seeds and d_k a trial differs by are no setup."""
    ingest_sweep(engine, _sweep("s1", "uptrain", "2026-12-01T10:00:00+00:00", 8, {"rnn": [6.0, 8.0], "flurka-rnn": [7.0, 7.5]}))
    ingest_sweep(engine, _sweep("s2", "uptrain", "2026-12-02T10:00:00+00:00", 8, {"rnn": [0, 0, 7.0]}))
    url = engine.url.render_as_string(hide_password=False)
    code, md, err = run_cli(["--db", url, "--table", "uptraining", "--all-sweeps"], capsys)
    assert code == 0 and "sweep" not in err
    # seeds 0 and 1 run in both sweeps (6, 0 and 8, 0: averaged to 3 and 4), seed 2 in s2 (7):
    # mean 14/3, sd 2.082, half-width t(.975, 2) 4.303 × 2.082 / √3 = 5.17
    assert _rnn_cell(md) == "4.7 ± 5.2 (n=3)"
    assert quality_tables.setup_of({"seed": 1, "workdir": "/a", "steps": 8, "attention_options": {"d_k": 4, "e_init": "pool"}}) \
        == {"steps": 8, "model.attention_options": {"e_init": "pool"}}   # a flat (pre-nesting) record read nested


def test_the_library_refuses_mixed_setups_too(three_sweeps, engine):
    with pytest.raises(quality_tables.MixedSetups, match=r"sweeps uptrain-a, uptrain-c vs uptrain-b"):
        quality_tables.uptraining_stats(engine, benchmark=NMT, metric="bleu")
    cells = quality_tables.uptraining_stats(engine, benchmark=NMT, metric="bleu", sweep="uptrain-b")
    assert set(cells["n"]) == {2}
