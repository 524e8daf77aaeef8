"""The paper's tables from a hand-built sweep (conftest.paper_sweep); every expected number
below is worked out by hand from that data, on SQLite and PostgreSQL."""

from __future__ import annotations

import argparse
import math

import pandas as pd
import pytest

from flurka.results import tables

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


def test_uptraining_table_mean_and_best(seeded):
    # performer: nf=64 seeds (27.0, 28.0) -> 27.5, nf=128 -> 27.9: best config 27.9; best trial 28.0.
    # linformer d_k=64 seeds (28.0, 27.0) -> 27.5 | 28.0. flurka-performer alpha=12.5%: (27.98, 27.0) -> 27.49 |
    # 27.98; its diverged 25% trial (99.0) and from-scratch trial (50.0) are not in the alpha columns.
    cols = ["kernel constituent", "kernel", "low-rank", "12.5%", "25%", "37.5%"]
    index = ["flurka-performer", "flurka-rnn", "flurka-eva"]
    assert_frame(tables.uptraining_table(seeded), index, cols, [
        ["performer", 27.9, 27.5, 27.49, nan, 28.0],
        ["rnn", 23.41, 27.5, nan, 24.57, nan],
        ["eva", nan, 27.5, nan, nan, 28.87],
    ])
    assert_frame(tables.uptraining_table(seeded, agg="best"), index, cols, [
        ["performer", 28.0, 28.0, 27.98, nan, 28.0],
        ["rnn", 23.41, 28.0, nan, 24.57, nan],
        ["eva", nan, 28.0, nan, nan, 28.87],
    ])
    with pytest.raises(tables.NoResults, match="no ok FLuRKA trials with 'bleu' on nmt-wmt14-enfr"):
        tables.uptraining_table(seeded, benchmark="nmt-wmt14-enfr")
    with pytest.raises(ValueError, match="agg 'median' is not one of mean, best"):
        tables.uptraining_table(seeded, agg="median")


def test_collective_table(seeded):
    # En-De: flurka-performer's configs are alpha 12.5% (27.49), 37.5% (28.0), scratch (50.0) -> 50.0.
    # WikiText-103 perplexity is lower-is-better: full seeds (5.533, 5.633) -> 5.583; linformer min(7.696, 7.5).
    # No En-Fr results: that column is left out. ImageNet fractions are shown in percent.
    cols = ["En-De (BLEU)", "ImageNet top-1", "ImageNet top-5", "WikiText-103 (ppl)"]
    assert_frame(tables.collective_table(seeded),
                 ["full", "linformer", "performer", "rnn", "flurka-performer", "flurka-rnn", "flurka-eva"], cols, [
                     [24.65, 71.662, 90.982, 5.583],
                     [27.5, nan, nan, 7.5],
                     [27.9, nan, nan, nan],
                     [23.41, nan, nan, nan],
                     [50.0, nan, nan, nan],
                     [24.57, nan, nan, nan],
                     [28.87, nan, nan, nan],
                 ])
    best = tables.collective_table(seeded, agg="best")
    assert best.at["full", "WikiText-103 (ppl)"] == pytest.approx(5.533)
    assert best.at["linformer", "En-De (BLEU)"] == pytest.approx(28.0)


def test_glue_table_average_matches_the_paper(seeded):
    df = tables.glue_table(seeded)
    assert list(df.index) == ["full", "linformer"]
    assert list(df.columns) == [label for label, _, _ in tables.GLUE_COLUMNS] + ["Average"]
    assert df.loc["full"].tolist()[:-1] == pytest.approx(
        [48.9, 90.7, 89.1, 84.8, 85.5, 85.6, 86.4, 90.0, 81.3, 81.8, 88.2, 65.7])
    assert df.at["full", "Average"] == pytest.approx(81.5)  # the paper's Table 2 value
    assert df.at["linformer", "CoLA (mcc)"] == pytest.approx(29.2)
    assert math.isnan(df.at["linformer", "Average"])  # missing tasks: no average, never a partial one


def test_lra_table(seeded):
    cols = ["ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Average"]
    assert_frame(tables.lra_table(seeded), ["full", "eva"], cols, [
        [37.95, 60.18, 80.45, 37.39, 70.19, 57.232],  # paper Table 3: 57.23
        [38.61, 65.16, 81.00, 41.60, 69.27, 59.128],  # paper Table 3: 59.13
    ])
    assert_frame(tables.lra_table(seeded, small=True), ["flurka-eva"], ["ListOps", "Average"], [[55.0, 55.0]])
    assert_frame(tables.lra_table(seeded, small=True, agg="best"), ["flurka-eva"], ["ListOps", "Average"],
                 [[60.0, 60.0]])


def test_sweep_filter(seeded, sweep_dict, make_trial):
    from flurka.results import ingest_sweep

    ingest_sweep(seeded, {**sweep_dict, "sweep_id": "later", "name": "later run",
                          "trials": [make_trial("x", "rnn", "lra-listops-small", {"accuracy": 0.25})]})
    assert list(tables.lra_table(seeded, small=True).index) == ["rnn", "flurka-eva"]
    assert_frame(tables.lra_table(seeded, small=True, sweep="later run"), ["rnn"], ["ListOps", "Average"],
                 [[25.0, 25.0]])
    assert list(tables.lra_table(seeded, small=True, sweep="paper-2024-05-01").index) == ["flurka-eva"]


def test_isoflops_table(seeded):
    # Target = full's final loss averaged over seeds: (0.2 + 0.3) / 2 = 0.25.
    # full: seed 0 first reaches <= 0.25 at step 3 (0.2, 3 EFLOPs), seed 1 at step 2 (0.25, 2 EFLOPs).
    # linformer ends at 0.5: never. flurka-eva reaches 0.24 at step 2 after 1 EFLOP.
    df = tables.isoflops_table(seeded)
    assert df.attrs["target_loss"] == pytest.approx(0.25)
    assert_frame(df, ["full", "linformer", "flurka-eva"], ["Loss", "EFLOPs"],
                 [[0.225, 2.5], [nan, nan], [0.24, 1.0]])
    # An explicit target of 0.5: everyone's step 2.
    assert_frame(tables.isoflops_table(seeded, target_loss=0.5), ["full", "linformer", "flurka-eva"],
                 ["Loss", "EFLOPs"], [[0.375, 2.0], [0.5, 2.0], [0.24, 1.0]])
    with pytest.raises(tables.NoResults, match="no 'rnn' trials"):
        tables.isoflops_table(seeded, reference="rnn")


def test_speed_and_speedup_tables(seeded):
    with pytest.raises(ValueError, match=r"several speed measurements per mechanism and N \(device in "
                                         r"\['NVIDIA H100 80GB HBM3', 'cpu'\]\): filter by device"):
        tables.speed_table(seeded)
    df = tables.speed_table(seeded, device="H100")
    assert_frame(df, [1024, 4096], ["full", "flash", "linformer", "performer", "flurka-performer"], [
        [10.0, 4.0, 6.0, 5.0, 2.0],
        ["OOM", 40.0, 30.0, 20.0, 10.0],
    ])
    # 1024: linformer 6/2, performer 5/2, flash 4/2, full 10/2; 4096: 30/10, 20/10, 40/10, full OOM.
    up = tables.speedup_table(seeded, device="H100")
    assert_frame(up, [("flurka-performer", 1024), ("flurka-performer", 4096)],
                 ["vs low-rank", "vs kernel", "vs flash", "vs full"],
                 [[3.0, 2.5, 2.0, 5.0], [3.0, 2.0, 4.0, nan]])
    with pytest.raises(tables.NoResults, match="no 'forward' speed measurements"):
        tables.speed_table(seeded, mode="forward")
    with pytest.raises(ValueError, match="unknown speed filter seq"):
        tables.speed_table(seeded, seq=3)


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
    df = tables.speed_table(engine)
    assert_frame(df, [1024], ["full", "linformer", "flurka-performer"], [["OOM", 7.0, 3.0]])
    up = tables.speedup_table(engine)
    assert up.loc[("flurka-performer", 1024), "vs low-rank"] == pytest.approx(7.0 / 3.0)


def test_empty_database_says_so(engine):
    with pytest.raises(tables.NoResults, match="no ok trials with metrics for glue-cola"):
        tables.glue_table(engine)
    with pytest.raises(tables.NoResults, match="no ok trials with 'loss' and 'train_flops' curves on nmt-small"):
        tables.isoflops_table(engine, benchmark="nmt-small")
    with pytest.raises(tables.NoResults, match="no 'train' speed measurements"):
        tables.speedup_table(engine)


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
        tables.speed_table(engine, mode="forward")
    assert_frame(tables.speed_table(engine, mode="forward", align=1), [55500], ["linformer", "flurka-rnn"],
                 [[16.0, 10.0]])
    assert_frame(tables.speed_table(engine, mode="forward", align=128), [55500], ["linformer", "flurka-rnn"],
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
        tables.speed_table(engine, mode="forward")
    assert_frame(tables.speed_table(engine, mode="forward", fused=False), [52500], ["flurka-rnn"], [[6.35]])
    assert_frame(tables.speed_table(engine, mode="forward", fused=True), [52500], ["flurka-rnn"], [[5.0]])
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
        tables.speed_table(engine, mode="forward")
    assert_frame(tables.speed_table(engine, mode="forward", pad_to=1), [52500], ["flurka-rnn"], [[6.35]])
    assert_frame(tables.speed_table(engine, mode="forward", pad_to=128), [52500], ["flurka-rnn"], [[5.2]])
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
        tables.speed_table(engine, mode="forward")
    assert_frame(tables.speed_table(engine, mode="forward", xla=""), [52500], ["flurka-rnn"], [[5.1]])
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
        tables.speedup_table(engine, mode="forward")                 # several executions
    up = tables.speedup_table(engine, mode="forward", best=True)
    row = up.loc[("flurka-rnn", 52500)]
    assert row["vs flash"] == pytest.approx(0.0656 / 0.0045)
    assert row["vs kernel"] == pytest.approx(0.0072 / 0.0045)
    assert row["executions"] == "flurka-rnn: fused, pad_to 128; rnn: align 128, pad_to 128; flash: plain"
    assert_frame(tables.speed_table(engine, mode="forward", best=True), [52500],
                 ["flash", "rnn", "flurka-rnn"], [[65.6, 7.2, 4.5]])
    from flurka.results import cli   # the same from the command line
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--table", "speedup", "--mode", "forward", "--best"])
    assert cli.build(engine, args).loc[("flurka-rnn", 52500), "vs flash"] == pytest.approx(0.0656 / 0.0045)
