"""What a sweep looks like in MLflow, on a real SQLite tracking store and without Ray trials: table
columns the viewer displays (no dots), trial names that start with what differs, one name per
metric with the final value as the last eval point."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from flurka.sweeps import runner
from flurka.sweeps.branching import make_plan
from flurka.sweeps.spec import SweepSpec
from flurka.tracking import SweepTracker
from flurka.sweeps.trial_report import RESULT_KEY
from flurka.tracking.callback import MLflowTrialCallback
from flurka.tracking.mlflow_runs import (BENCHMARK_TAG, RUN_COLOR_TAG, TRIAL_TAG, metric_name, run_colors, shown,
                                         table_column, trial_run_name)


@pytest.fixture
def tracker(tmp_path):
    t = SweepTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "names", "names-sweep",
                     artifact_root=(tmp_path / "artifacts").as_uri())
    t.start_sweep("names-sweep", {"benchmarks": ["lra-listops-small"]})
    return t


def _plan(benchmarks=("lra-listops-small",), baselines=True):
    spec = SweepSpec(benchmarks=benchmarks, variants=("flurka-rnn",), alphas=(0.25, 0.5), baselines=baselines,
                     seeds=(0, 1))
    return make_plan(spec, steps={b: 8 for b in benchmarks}, d_ks={b: (16,) for b in benchmarks})


# -- (a) table columns ------------------------------------------------------------------------------

def _artifact(client, run_id, path, tmp_path):
    return client.download_artifacts(run_id, path, str(tmp_path / "dl"))


def test_table_columns_have_no_dot_and_cells_pass_through(tracker, tmp_path):
    cells = ["97.2 ± 1.7 (n=3)", "35.0 ± 0.4 (n=3)"]
    df = pd.DataFrame({"kernel": cells, "low-rank": [31.1, np.nan], "12.5%": cells, "25%": [20.0, 21.5],
                       "37.5%": ["14.1 ± 2.0 (n=3)", None], "62.5%": [1, 2], "87.5%": [3, 4],
                       "acc. (%)": [0.5, 0.6]},
                      index=pd.Index(["flurka-rnn", "flurka-performer"], name="variant"))
    multi = pd.DataFrame([[1.0, 2.0]], columns=pd.MultiIndex.from_tuples([("nmt-small", "bleu 0.5"),
                                                                          ("mean", "")]))
    tracker.log_tables({"uptraining_lra-listops-small": df, "quality": multi, "empty": df.iloc[:0]})
    tracker.log_tables({"uptraining_lra-listops-small": df})   # --resume logs again: replaced, not appended

    client, run_id = tracker.client, tracker.parent_id
    with open(_artifact(client, run_id, "tables/uptraining_lra-listops-small.json", tmp_path)) as f:
        table = json.load(f)
    assert table["columns"] == ["variant", "kernel", "low-rank", "12·5%", "25%", "37·5%", "62·5%", "87·5%",
                                "acc_ (%)"]
    assert len(table["data"]) == 2                             # once, however often logged
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert [r["kernel"] for r in rows] == cells and [r["12·5%"] for r in rows] == cells   # strings unchanged
    assert rows[0]["low-rank"] == 31.1 and rows[1]["low-rank"] == "" and rows[1]["37·5%"] == ""
    # MLflow's own table format (what MlflowClient.load_table reads) ...
    loaded = pd.read_json(_artifact(client, run_id, "tables/uptraining_lra-listops-small.json", tmp_path),
                          orient="split")
    assert len(loaded) == 2 and "12·5%" in loaded.columns
    # ... and the tag load_table and the UI find a logged table by
    found = client.search_runs([tracker.experiment_id], filter_string=(
        "tags.`mlflow.loggedArtifacts` LIKE "
        """'%"path"%:%"tables/uptraining_lra-listops-small.json",%"type"%:%"table"%'"""))
    assert [r.info.run_id for r in found] == [run_id]

    logged = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    paths = [a["path"] for a in logged if a["type"] == "table"]
    assert sorted(paths) == ["tables/quality.json", "tables/uptraining_lra-listops-small.json"]  # the viewer's cue
    columns = {}
    for path in paths:
        with open(_artifact(client, run_id, path, tmp_path)) as f:
            columns[path] = json.load(f)["columns"]
    assert not [c for cols in columns.values() for c in cols if "." in c], columns
    assert columns["tables/quality.json"] == ["nmt-small bleu 0·5", "mean"]
    csv = _artifact(client, run_id, "tables/uptraining_lra-listops-small.csv", tmp_path)
    assert list(pd.read_csv(csv).columns[3:5]) == ["12.5%", "25%"]   # the CSV keeps the table's names


def test_table_column_rule():
    assert table_column("12.5%") == "12·5%" and table_column("α = 0.875") == "α = 0·875"
    assert table_column(("lra-listops-small (accuracy, %)", "")) == "lra-listops-small (accuracy, %)"
    assert table_column("e.g.") == "e_g_" and table_column(25) == "25"


# -- (b) run names ----------------------------------------------------------------------------------

def test_trial_run_names_start_with_what_differs():
    plan = _plan()
    names = {r.key: trial_run_name(r.to_dict(), benchmark=False) for r in plan.baselines + plan.bases + plan.branches}
    assert sorted(names.values()) == sorted([
        "full s0", "full s1", "rnn s0", "rnn s1", "linformer dk=16 s0", "linformer dk=16 s1",
        "no attention (linformer dk=1) s0", "no attention (linformer dk=1) s1",
        "flurka-rnn a=0.25 dk=16 s0", "flurka-rnn a=0.5 dk=16 s0",
        "flurka-rnn a=0.25 dk=16 s1", "flurka-rnn a=0.5 dk=16 s1"])
    # without baselines a separate base run (it stops at its last fork) says so
    bases = _plan(baselines=False).bases
    assert sorted(trial_run_name(r.to_dict(), benchmark=False) for r in bases) == [
        "linformer dk=16 s0 base", "linformer dk=16 s1 base"]
    # several benchmarks: the benchmark last; names stay unique within the sweep
    plan = _plan(benchmarks=("lra-listops-small", "nmt-small"))
    runs = plan.baselines + plan.bases + plan.branches
    names = [runner._run_name({"run": r.to_dict()}, several=True) for r in runs]
    assert "flurka-rnn a=0.25 dk=16 s1 nmt-small" in names and len(set(names)) == len(runs)


def _result(run, steps=8):
    history = [{"step": s, "loss": 2.0 - 0.1 * s, "accuracy": 0.1 * s, "grad_norm": 1.0, "train_flops": 1e9 * s,
                "learning_rate": 1e-3, "attention": run["attention"]} for s in range(2, steps + 1, 2)]
    evals = [{"step": s, "loss": 2.1 - 0.1 * s, "accuracy": 0.05 * s, "train_flops": 1e9 * s,
              "attention": run["attention"]} for s in (4, steps)]
    return {"status": "ok", "steps": steps, "history": history, "eval_history": evals,
            "final_metrics": {k: v for k, v in evals[-1].items() if k not in ("step", "train_flops", "attention")},
            "compilation": {"compiles": 3, "cache_hits": 1, "compile_s": 0.5}, "config": {"seed": run["seed"]}}


def _drive(callback, trial, result, *, report_all=True):
    """What Tune hands the driver's callback for one trial, as the trainable reports it."""
    callback.on_trial_start(0, [], trial)
    entries = [("train", e) for e in result["history"]] + [("eval", e) for e in result["eval_history"]]
    for stream, entry in sorted(entries, key=lambda x: (x[1]["step"], x[0] == "eval")):
        if not report_all and entry["step"] > 4:
            break                                               # the driver died: a later --resume
        values = {k: v for k, v in entry.items() if k != "step" and isinstance(v, (int, float))}
        if stream == "eval":
            values = {f"eval_{k}": v for k, v in values.items()}
        callback.on_trial_result(0, [], trial, {**values, "step": entry["step"], "stream": stream,
                                                "device": "cpu x1", "timestamp": 1_700_000_000})
    trial.last_result = {"step": result["steps"], "stream": "final", "device": "cpu x1",
                         **{f"final_{k}": v for k, v in result["final_metrics"].items()},
                         RESULT_KEY: json.dumps(result)}
    callback.on_trial_complete(0, [], trial)


def test_nested_runs_named_and_each_metric_under_one_name(tracker):
    plan = _plan()
    runs = plan.baselines + plan.bases + plan.branches
    callback = MLflowTrialCallback(tracker, runner.resolve, params_of=lambda cfg: {"run": cfg["run"]},
                                   name_of=lambda cfg: runner._run_name(cfg, several=False))
    results = {}
    for i, r in enumerate(runs):
        run = r.to_dict()
        results[r.key] = _result(run)
        _drive(callback, SimpleNamespace(config={"cfg": {"run": run}}, last_result={}), results[r.key],
               report_all=i % 2 == 0)

    nested = tracker.nested_runs()
    assert len(nested) == len(runs)
    assert not any(RUN_COLOR_TAG in r.data.tags for r in nested)   # no plan's colours given: MLflow's own
    by_key = {r.data.tags[TRIAL_TAG]: r for r in nested}
    assert set(by_key) == {r.key for r in runs}                 # the key stays the identifier
    assert {r.key: by_key[r.key].info.run_name for r in runs} == {
        r.key: trial_run_name(r.to_dict(), benchmark=False) for r in runs}
    assert {r.data.tags[BENCHMARK_TAG] for r in nested} == {"lra-listops-small"}

    want = {"train/loss", "train/accuracy", "train/grad_norm", "train/tflop", "train/learning_rate",
            "eval/loss", "eval/accuracy", "compilation.compiles", "compilation.cache_hits", "compilation.compile_s"}
    client = tracker.client
    for r in nested:
        assert set(r.data.metrics) == want, r.info.run_name      # no accuracy / eval_accuracy / final.accuracy
        result = results[r.data.tags[TRIAL_TAG]]
        for name in ("loss", "accuracy"):
            points = client.get_metric_history(r.info.run_id, f"eval/{name}")
            assert [m.step for m in points] == [4, 8]            # each eval once, reported or backfilled
            assert points[-1].value == pytest.approx(result["final_metrics"][name])   # final = last eval point
            assert r.data.metrics[f"eval/{name}"] == pytest.approx(result["final_metrics"][name])
        train = client.get_metric_history(r.info.run_id, "train/loss")
        assert [m.step for m in train] == [2, 4, 6, 8]
        assert math.isclose(r.data.metrics["train/tflop"], 8e9 / 1e12)       # TFLOP: the chart axis reads 0.008


def test_metric_name_rule():
    assert metric_name("train", "loss") == "train/loss" and metric_name("eval", "bleu") == "eval/bleu"
    assert metric_name("train", "train_flops") == "train/tflop"
    assert metric_name("eval", "train_flops") is None and metric_name("eval", "handover_beta") is None
    with pytest.raises(ValueError):
        metric_name("final", "loss")


def test_values_are_logged_as_a_reader_reads_them():
    assert shown("train_flops", 2_100_000_000_000.0) == 2.1                  # TFLOP
    assert shown("bleu", 67.61068837534667) == 67.611 and shown("loss", 0.2918663909156933) == 0.29187
    assert shown("learning_rate", 5.5555105973326135e-06) == 5.5555e-06      # significant digits, not decimals
    assert shown("time/other_s", 0.00035115998616674915) == 0.0 and shown("compile_s", 49.68743266) == 49.687


def test_each_configuration_one_colour_its_seeds_lighter(tracker):
    plan = _plan(benchmarks=("lra-listops-small", "nmt-small"))
    runs = [r.to_dict() for r in plan.baselines + plan.bases + plan.branches]
    colors = run_colors(runs)
    assert set(colors) == {r["key"] for r in runs}
    config = {r["key"]: (r["benchmark"], r["attention"], r["alpha"], r["d_k"]) for r in runs}
    by_config: dict = {}
    for r in runs:
        by_config.setdefault(config[r["key"]], {})[r["seed"]] = colors[r["key"]]
    firsts = [seeds[0] for c, seeds in by_config.items() if c[1:] != ("linformer", None, 1)]
    assert len(set(firsts)) == len(firsts) == 10        # 5 configurations x 2 benchmarks: no hue twice
    for c, seeds in by_config.items():
        assert seeds[0] != seeds[1]                     # the second seed lighter ...
        dark, light = (sum(int(seeds[s][i:i + 2], 16) for i in (1, 3, 5)) for s in (0, 1))
        assert light > dark
        if c[1:] == ("linformer", None, 1):             # ... and the no-attention control grey
            assert seeds[0] == "#7f7f7f"
    # the tracker sets them as it creates the runs
    tracker.color_runs(runs)
    run_id = tracker.trial_run(runs[0]["key"], runs[0]["kind"], {}, name="x")
    assert tracker.client.get_run(run_id).data.tags[RUN_COLOR_TAG] == colors[runs[0]["key"]]


def test_resume_finds_the_run_by_key_and_skips_logged_steps(tracker):
    (branch, *_) = _plan().branches
    run = branch.to_dict()
    cb = MLflowTrialCallback(tracker, runner.resolve, params_of=lambda cfg: {"run": cfg["run"]})
    trial = SimpleNamespace(config={"cfg": {"run": run}}, last_result={})
    result = _result(run)
    cb.on_trial_start(0, [], trial)
    for e in result["history"][:2]:
        cb.on_trial_result(0, [], trial, {"loss": e["loss"], "step": e["step"], "stream": "train"})
    again = SweepTracker(tracker.uri, "names", "names-sweep")      # a --resume'd driver
    again.start_sweep("names-sweep", {})
    cb2 = MLflowTrialCallback(again, runner.resolve, params_of=lambda cfg: {"run": cfg["run"]})
    _drive(cb2, trial, result)
    (nested,) = again.nested_runs()
    assert nested.info.run_name == trial_run_name(run)          # default: with the benchmark
    steps = [m.step for m in again.client.get_metric_history(nested.info.run_id, "train/loss")]
    assert sorted(steps) == [2, 4, 6, 8]                       # steps 2, 4 not logged again


def test_a_trial_logs_its_data_set_as_an_mlflow_input(tracker):
    """The run page's Datasets: what the trial trained on, by name and digest, in the training
    context, with the splits' sizes as its profile."""
    from flurka.data import get_dataset
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    described = get_dataset("nmt-small").describe()
    run_id = tracker.trial_run("t-data", "baseline", {})
    tracker.finish_trial(run_id, {"status": "ok", "steps": 0, "dataset": described})
    (given,) = tracker.client.get_run(run_id).inputs.dataset_inputs
    assert (given.dataset.name, given.dataset.digest) == ("nmt-small", described["digest"])
    assert {t.key: t.value for t in given.tags} == {MLFLOW_DATASET_CONTEXT: "training"}
    assert json.loads(given.dataset.profile) == {k: described[k] for k in ("task", "num_train", "num_eval")}
    assert json.loads(given.dataset.source) == {"get_dataset": "nmt-small"}


def test_a_description_keeps_whole_blocks_within_mlflows_limit():
    """A big sweep's result outgrows a run tag's 8000 characters: whole blocks are kept, then a
    line that says where the rest is; a small one is kept whole."""
    from flurka.tracking.mlflow_runs import note

    blocks = [f"block {i} " + "x" * 2990 for i in range(5)]
    cut = note(blocks, 8000)
    assert len(cut) <= 8000
    kept = cut.split("\n\n")
    assert kept[:2] == blocks[:2] and "`flurka tables`" in kept[2] and len(kept) == 3
    assert note(blocks[:2], 8000) == "\n\n".join(blocks[:2]) + "\n"
    assert note(blocks, 20000) == "\n\n".join(blocks) + "\n"
