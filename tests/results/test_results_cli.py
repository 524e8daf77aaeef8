"""`flurka tables`: formats, and one-line errors with exit code 2 for a database it cannot use."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from flurka.results import cli
from testsupport import RECORDED


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="flurka tables")
    cli.add_arguments(parser)
    code = cli.run(parser.parse_args(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def seeded_url(seeded):
    return seeded.url.render_as_string(hide_password=False)


def test_markdown_latex_csv(seeded_url, capsys):
    code, md, _ = run_cli(["--db", seeded_url, "--table", "lra"], capsys)
    assert code == 0
    lines = md.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == \
        ["mechanism", "ListOps (acc, %)", "Text (acc, %)", "Retrieval (acc, %)", "Image (acc, %)",
         "Pathfinder (acc, %)", "Average (%)"]
    assert set(lines[1]) <= set("|-: ") and lines[2].split("|")[1].strip() == "full"
    assert "57.2 (1 seed)" in lines[2] and "59.1 (1 seed)" in lines[3]     # paper Table 3: 57.23, 59.13

    code, tex, _ = run_cli(["--db", seeded_url, "--table", "uptraining", "--format", "latex"], capsys)
    assert code == 0
    assert r"\begin{tabular}" in tex and r"\end{tabular}" in tex
    assert r"12.5\%" in tex and "flurka-performer" in tex and "27.5 ± 6.2 (n=2)" in tex   # seeds 27.98, 27.0
    assert "% (2) best variant beats both: no" in tex                   # the observations, as LaTeX comments

    code, md, _ = run_cli(["--db", seeded_url, "--table", "uptraining"], capsys)
    assert code == 0 and md.startswith("Up-training α, nmt-wmt14-ende: BLEU (0–100), higher is better")
    assert "| 28.0 (1 seed) * |" in md and "\n(1) most α cells lie between their constituents (kernel, low-rank): no (1 of 3)" in md
    assert "\n\n(2) best variant beats both: " in md and "\n\n(3) best α in " in md   # each its own paragraph

    code, csv, _ = run_cli(["--db", seeded_url, "--table", "speed", "--device", "H100", "--format", "csv"], capsys)
    assert code == 0
    back = pd.read_csv(io.StringIO(csv))
    assert list(back.columns) == ["N", "full", "flash", "linformer", "performer", "flurka-performer"]
    assert back["N"].tolist() == [1024, 4096]
    assert back["full"].tolist() == ["10.0", "OOM"] and back["flash"].tolist() == [4.0, 40.0]


def test_a_chance_line_is_printed_with_what_it_means(engine, sweep_dict, make_trial, capsys):
    from flurka.results import ingest_sweep

    ingest_sweep(engine, {**sweep_dict, "trials": [
        make_trial(f"r{s}", "rnn", "lra-listops-small", {"accuracy": a, "majority_accuracy": 0.139}, seed=s)
        for s, a in enumerate((0.13, 0.15, 0.17))]})
    url = engine.url.render_as_string(hide_password=False)
    code, md, _ = run_cli(["--db", url, "--table", "lra", "--small"], capsys)
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("|")}
    assert code == 0 and "15.0 ± 5.0 (n=3), at chance" in rows["rnn"] and "| 13.9 " in rows["chance"]
    assert md.rstrip().endswith("at chance: a cell whose 95 % CI (one seed: whose mean) does not clear it")
    code, tex, _ = run_cli(["--db", url, "--table", "lra", "--small", "--format", "latex"], capsys)
    assert "\n% chance: the accuracy of always answering the eval set's majority class" in tex
    code, csv, _ = run_cli(["--db", url, "--table", "lra", "--small", "--format", "csv"], capsys)
    assert "majority" not in csv and pd.read_csv(io.StringIO(csv))["mechanism"].tolist() == ["rnn", "chance"]


def test_options_reach_the_table(seeded_url, capsys):
    code, out, _ = run_cli(["--db", seeded_url, "--table", "uptraining", "--agg", "best", "--format", "csv"], capsys)
    assert code == 0
    back = pd.read_csv(io.StringIO(out))       # long (issue 59): one row per cell, α a number column
    cell = back[(back["variant"] == "flurka-performer") & (back["alpha"] == 0.125)].iloc[0]
    assert cell["mean"] == 28.0 and cell["column"] == "12.5%"             # the best trial, 27.98, to 0.1
    assert cell["n"] == 1 and pd.isna(cell["ci_low"])
    assert not any("%" in c for c in back.columns)
    code, out, _ = run_cli(["--db", seeded_url, "--table", "collective", "--format", "csv"], capsys)
    back = pd.read_csv(io.StringIO(out)).set_index("mechanism")
    assert back.at["full", "WikiText-103 (perplexity) mean"] == 5.58         # 3 significant digits
    assert "5.583" not in out and "21.146" not in out
    code, out, err = run_cli(["--db", seeded_url, "--table", "speedup"], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1 and "filter by device" in err


def test_uptraining_defaults_to_the_benchmark_the_sweep_ran(engine, sweep_dict, make_trial, capsys):
    """After a one-benchmark sweep (`make sweep`: lra-listops-small) the table needs no --benchmark,
    and the metric defaults to that benchmark's (accuracy); two up-trained benchmarks need a choice."""
    from flurka.results import ingest_sweep

    url = engine.url.render_as_string(hide_password=False)
    small = {**sweep_dict, "sweep_id": "small", "name": "small", "trials": [
        make_trial("l", "linformer", "lra-listops-small", {"accuracy": 0.45}),
        make_trial("r", "rnn", "lra-listops-small", {"accuracy": 0.46}),
        make_trial("b", "flurka-rnn", "lra-listops-small", {"accuracy": 0.47}, alpha=0.5, base="low-rank")]}
    ingest_sweep(engine, small)
    code, out, err = run_cli(["--db", url, "--table", "uptraining", "--format", "csv"], capsys)
    assert code == 0, err
    back = pd.read_csv(io.StringIO(out)).set_index(["variant", "column"])
    assert back.at[("flurka-rnn", "50%"), "mean"] == 47.0 and back.at[("flurka-rnn", "50%"), "alpha"] == 0.5
    assert back.at[("flurka-rnn", "low-rank"), "mean"] == 45.0 and pd.isna(back.at[("flurka-rnn", "low-rank"), "alpha"])
    ingest_sweep(engine, sweep_dict)  # the paper sweep: up-training on nmt-wmt14-ende too
    code, out, err = run_cli(["--db", url, "--table", "uptraining"], capsys)   # the newest sweep's
    assert code == 0 and "nmt-wmt14-ende" in out and "the newest of the 2 sweeps" in err
    code, out, err = run_cli(["--db", url, "--table", "uptraining", "--all-sweeps"], capsys)
    assert code == 1 and "several benchmarks (lra-listops-small, nmt-wmt14-ende): pass --benchmark" in err
    code, out, err = run_cli(["--db", url, "--table", "uptraining", "--sweep", "small"], capsys)
    assert code == 0 and "flurka-rnn" in out


def test_unmigrated_database_exit_2_then_upgrade(db_url, capsys):
    if db_url.startswith("sqlite:///"):   # an empty database (a missing file is refused: never created)
        Path(db_url.removeprefix("sqlite:///")).touch()
    code, out, err = run_cli(["--db", db_url, "--table", "glue"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "schema revision none" in err and "--upgrade" in err
    code, out, err = run_cli(["--db", db_url, "--table", "glue", "--upgrade"], capsys)
    assert code == 1 and err.strip() == "flurka tables: no ok trials on a GLUE task (" + ", ".join(
        sorted(f"glue-{t}" for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"))) + \
        "); the database holds no ok trials"


def test_unreachable_database_is_one_line_exit_2(capsys, tmp_path):
    start = time.monotonic()
    code, out, err = run_cli(["--db", "postgresql://u:secret@127.0.0.1:1/x", "--table", "glue"], capsys)
    assert time.monotonic() - start < 6
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("flurka tables: cannot reach postgresql://u@127.0.0.1:1/x: ") and "secret" not in err
    code, _, err = run_cli(["--db", f"sqlite:///{tmp_path}/missing/r.db", "--table", "lra"], capsys)
    assert code == 2 and f"directory {tmp_path}/missing does not exist" in err


def test_module_entry_in_a_fresh_process():
    """No traceback from a real process either: the whole stderr is the one line."""
    code = ("import argparse, sys; from flurka.results import cli; p = argparse.ArgumentParser(); "
            "cli.add_arguments(p); sys.exit(cli.run(p.parse_args(sys.argv[1:])))")
    proc = subprocess.run([sys.executable, "-c", code, "--db", "postgresql://u:secret@127.0.0.1:1/x",
                           "--table", "lra"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "secret" not in proc.stderr


def test_floor_table_of_the_recorded_leases(engine, capsys):
    """The GPU targets' table from the recorded H100 and H200 leases (SQLite and PostgreSQL):
    one card and scope at a time; left ambiguous, one line naming the configurations, exit 1."""
    from flurka.results import ingest_file

    for doc in ("h100/2026-11-28/n-sweep.json", "h100/2026-11-28/flash-compare.json",
                "h200/2026-11-27/run2/n-sweep.json"):
        ingest_file(engine, RECORDED / doc)
    url = engine.url.render_as_string(hide_password=False)
    code, _, err = run_cli(["--db", url, "--table", "floor"], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "NVIDIA H100 80GB HBM3, n-sweep, layer scope" in err and "NVIDIA H200, n-sweep" in err

    code, csv, _ = run_cli(["--db", url, "--table", "floor", "--device", "H100", "--scope", "layer",
                            "--format", "csv"], capsys)
    assert code == 0
    table = pd.read_csv(io.StringIO(csv))
    aligned = table[(table["mode"] == "forward") & (table["execution"] == "align 128, pad_to 128")]
    ratio = dict(zip(aligned["mechanism"], aligned["× floor"].round(2)))
    met = dict(zip(aligned["mechanism"], aligned["met"]))
    # the lease's notes: flurka-rnn 1.46× (met 1.5×), flurka-performer 1.71× (missed), eva 3.51× (missed 2×)
    assert ratio["flurka-rnn"] == 1.46 and ratio["flurka-performer"] == 1.71 and ratio["eva"] == 3.51
    assert (met["flurka-rnn"], met["flurka-performer"], met["eva"], met["rnn"]) == ("yes", "no", "no", "yes")

    # where each GPU target stands, per card (both cards at once): the H100's from its two
    # documents, the H200's N-sweep targets only (its flash comparison not ingested here)
    code, csv, _ = run_cli(["--db", url, "--table", "targets", "--format", "csv"], capsys)
    assert code == 0
    targets = pd.read_csv(io.StringIO(csv)).set_index(["device", "target", "mode"])
    h100, h200 = targets.loc["NVIDIA H100 80GB HBM3"], targets.loc["NVIDIA H200"]
    assert (h100.loc[("every layer ≤ 2× its floor", "forward"), ["worst", "met"]].tolist() == ["eva", "no"])
    assert round(h100.loc[("every layer ≤ 2× its floor", "forward"), "value"], 2) == 3.51
    assert h100.loc[("every FLuRKA variant ≥ 20× cuDNN flash", "forward"), "met"] == "no"
    assert "every FLuRKA variant ≥ 20× cuDNN flash" not in h200.index.get_level_values("target")
    assert set(h200.index.get_level_values("target")) == {
        "every layer ≤ 2× its floor", "every FLuRKA layer ≤ 1.5× its floor",
        "FLuRKA-Performer, -RNN faster than Linformer and their kernels"}
    code, out, err = run_cli(["--db", url, "--table", "targets", "--device", "A100"], capsys)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1 and "A100" in err


def test_an_unrecorded_metric_names_the_recorded_ones(seeded_url, capsys):
    """Issue 59: ``--metric eval_loss`` failed without saying what the trials do record."""
    code, out, err = run_cli(["--db", seeded_url, "--table", "uptraining", "--metric", "eval_loss"], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert "no ok FLuRKA trials with 'eval_loss'" in err and "; its FLuRKA trials record: " in err
    named = err.strip().rsplit(": ", 1)[1].split(", ")
    assert named == sorted(named) and "eval_loss" not in named and named
    code, out, _ = run_cli(["--db", seeded_url, "--table", "uptraining", "--metric", named[0]], capsys)
    assert code == 0 and out
