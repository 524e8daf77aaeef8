"""The tables a sweep prints at its end: the speed table only where its database holds speed
measurements, and then without a line of complaint about the others."""

from __future__ import annotations

import dataclasses
import re

from flurka.results import ingest_file, open_results
from flurka.sweeps.runner import _tables
from flurka.sweeps.spec import SweepSpec, validate
from testsupport import RECORDED


def test_speed_table_only_where_speed_was_measured(tmp_path, capsys):
    spec = validate(SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.5,),
                              steps=8, run_dir=str(tmp_path / "run")))
    engine = open_results(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        assert "speed" not in _tables(engine, spec, "no-such-sweep")
        assert "speed table" not in capsys.readouterr().err        # a sweep's own database: not a fault
        ingest_file(engine, RECORDED / "h100" / "2026-11-28" / "n-sweep.json")
        speed = _tables(engine, spec, "no-such-sweep")["speed"]
    finally:
        engine.dispose()
    assert {"flurka-rnn", "linformer", "performer"} <= set(speed.columns) and 55_500 in speed.index


def _trials() -> list[dict]:
    """nmt-small, 3 seeds: rnn, Linformer at d_k 8 and 16, flurka-rnn up-trained at α 25 % and 50 %."""
    out = []

    def add(key, mech, bleu, loss, alpha=None, d_k=None):
        for s, (b, l) in enumerate(zip(bleu, loss)):
            out.append({"trial_key": f"{key}-s{s}", "attention": mech, "benchmark": "nmt-small", "seed": s,
                        "status": "ok", "steps": 600, "alpha": alpha, "base": "low-rank" if alpha else None,
                        "d_k": d_k, "num_features": None, "train_flops": 1e15, "wall_time_s": 76.0,
                        "metrics": {"bleu": b, "loss": l, "accuracy": 0.5}, "curve": []})

    add("rnn", "rnn", (70.0, 71.0, 72.0), (1.0, 1.1, 0.9))
    add("lin8", "linformer", (80.0, 82.0, 81.0), (0.5, 0.6, 0.4), d_k=8)
    add("lin16", "linformer", (84.0, 86.0, 85.0), (0.3, 0.4, 0.2), d_k=16)
    add("fr8-25", "flurka-rnn", (82.5, 83.5, 83.0), (0.55, 0.65, 0.45), alpha=0.25, d_k=8)
    add("fr8-50", "flurka-rnn", (76.0, 77.0, 78.0), (0.45, 0.52, 0.38), alpha=0.5, d_k=8)
    add("fr16-25", "flurka-rnn", (85.5, 84.5, 86.0), (0.35, 0.45, 0.25), alpha=0.25, d_k=16)
    add("fr16-50", "flurka-rnn", (80.0, 81.0, 79.0), (0.32, 0.41, 0.26), alpha=0.5, d_k=16)
    return out


def test_summary_prints_metric_and_loss_tables_and_the_observations(tmp_path):
    from flurka.results import ingest_sweep
    from flurka.sweeps.runner import SweepOutcome, summary

    spec = validate(SweepSpec(benchmarks=("nmt-small",), variants=("flurka-rnn",), alphas=(0.25, 0.5),
                              steps=8, run_dir=str(tmp_path / "run")))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = open_results(url)
    try:
        ingest_sweep(engine, {"sweep_id": "nmt", "name": "nmt", "created_at": "2026-12-01T12:00:00+00:00",
                              "environment": {"device": "cpu", "host": "h", "versions": {}}, "trials": _trials()})
        tables = _tables(engine, spec, "nmt")
    finally:
        engine.dispose()
    assert set(tables) == {"uptraining_nmt-small", "uptraining_nmt-small_loss", "observations_nmt-small",
                           "observations_nmt-small_loss", "quality"}
    assert tables["uptraining_nmt-small"].at[("flurka-rnn", "low-rank", 8), "25%"] == "83.0 ± 1.2 (n=3) *"
    assert tables["uptraining_nmt-small_loss"].at[("flurka-rnn", "low-rank", 8), "50%"] == "0.450 ± 0.174 (n=3) *"
    assert list(tables["quality"].columns) == ["nmt-small: BLEU (char, 0–100)"]
    assert tables["quality"].at["linformer", "nmt-small: BLEU (char, 0–100)"] == "85.0 ± 2.5 (n=3)"   # d_k 16
    text = summary(SweepOutcome("nmt", tmp_path / "run", "sqlite:///mlflow.db", url,
                                {"uptrain_steps_executed": 10, "uptrain_steps_independent": 16,
                                 "uptrain_compute_ratio": 10 / 16}, {}, [], tables))
    order = ["Up-training α, nmt-small: BLEU (char, 0–100), higher is better",
             "| flurka-rnn | low-rank |     8 | rnn                  | 71.0 ± 2.5 (n=3) | 81.0 ± 2.5 (n=3) | 83.0 ± 1.2 (n=3) * |",
             "Up-training α, nmt-small: eval loss, lower is better",
             "Table 5's observations, nmt-small, BLEU (char, 0–100):",
             "(1) most α cells lie between their constituents (kernel, low-rank): no (2 of 4)",
             "(2) best variant beats both: no (flurka-rnn d_k=16 at α=25%",
             "(3) best α in [25 %, 37.5 %]: yes (2 of 2 rows",
             "Table 5's observations, nmt-small, eval loss:",
             "(1) most α cells lie between their constituents (kernel, low-rank): yes (3 of 4)",
             "(3) best α in [25 %, 37.5 %]: no (0 of 2 rows",
             "Quality (mean ± 95 % CI over seeds, n):"]
    at = [text.find(line) for line in order]
    assert -1 not in at, [line for line, i in zip(order, at) if i < 0]
    assert at == sorted(at)
    assert not re.search(r"\|\s*between\s*\|", text)    # the observations' per-row table: flurka tables


def test_summary_ends_with_the_time_split(tmp_path):
    from flurka.sweeps.runner import SweepOutcome, _log_time_split, summary, time_split

    def trial(steps, extra=0.0, **parts):
        split = {"data": 0.5, "setup": 1.0, "train_steps": steps, "eval": 2.0, "checkpoints": 1.5,
                 "report": 0.25, **parts}
        return {"wall_time_s": sum(split.values()) + extra, "time_split": split}

    results = {"base": trial(30.0, extra=0.75, **{"compile/rnn": 4.0}),     # a stopped base run's trainable
               "a50": trial(40.0, **{"compile/rnn-to-flurka-rnn": 3.0, "compile/flurka-rnn": 2.0}),
               "old": {"wall_time_s": 5.0}}                                   # a result from before the split
    split = time_split(results, {"ray_start": 6.0, "mlflow": 4.5, "results_db": 1.5, "wall": 120.0})
    wall = 2 * (0.5 + 1.0 + 2.0 + 1.5 + 0.25) + 30 + 40 + 4 + 3 + 2 + 0.75 + 5.0
    assert split["trials_wall_s"] == wall and split["parts"]["other"] == 5.75
    assert list(split["parts"]) == ["data", "setup", "compile/flurka-rnn", "compile/rnn",
                                    "compile/rnn-to-flurka-rnn", "train_steps", "eval", "checkpoints", "report",
                                    "other"]
    outcome = SweepOutcome("s", tmp_path / "run", "sqlite:///mlflow.db", "sqlite:///r.db",
                           {"uptrain_steps_executed": 10, "uptrain_steps_independent": 16,
                            "uptrain_compute_ratio": 10 / 16}, results, [], {}, time_split=split)
    assert "Time split" not in summary(outcome)                                    # --verbose only
    text = summary(outcome, verbose=True)
    block = text[text.index("Time split"):text.index("Sweep s, run dir")].rstrip("\n")
    # the last lines: where the results are and the commands that show them
    assert text.splitlines()[-5:] == [
        f"Sweep s, run dir {tmp_path / 'run'}:",
        "  MLflow runs:    flurka ui --backend-store-uri sqlite:///mlflow.db",
        "  paper tables:   flurka tables --db sqlite:///r.db --table uptraining",
        f"  HTML report:    flurka report --db sqlite:///r.db --out {tmp_path / 'run' / 'report'}",
        f"  results record: {tmp_path / 'run' / 'sweep-record.json'} (flurka ingest --db URL FILE)"]
    own = dataclasses.replace(outcome, mlflow_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    assert f"  MLflow runs:    flurka ui --run-dir {tmp_path / 'run'}" in summary(own).splitlines()
    served = dataclasses.replace(outcome, mlflow_uri="http://127.0.0.1:5000")
    assert "  MLflow runs:    http://127.0.0.1:5000 (a tracking server: open it in a browser)" in summary(served)
    assert f"3 trials, % of their {wall:.1f} s wall time" in block and "driver's 120.0 s" in block
    rows = {line[:36].strip(): line[36:] for line in block.splitlines()[1:-1]}
    assert list(rows) == [*split["parts"], "driver: ray_start", "driver: mlflow", "driver: results_db"]
    for part, seconds in split["parts"].items():                                   # every part, its share
        assert rows[part] == f" {seconds:9.1f} s  {100 * seconds / wall:5.1f} %", rows[part]
    assert rows["driver: ray_start"] == "       6.0 s    5.0 %"                    # of the driver's wall
    assert block.splitlines()[-1] == (f"Training steps: {100 * 70 / wall:.1f} % of the trials' wall time "
                                      "(target ≥ 80 %: not met).")

    class Tracker:
        def log_sweep_metrics(self, metrics):
            self.metrics = metrics

        def log_sweep_dict(self, d, name):
            self.dict = (d, name)

    tracker = Tracker()
    _log_time_split(tracker, split)
    assert tracker.metrics["time/compile/rnn-to-flurka-rnn_s"] == 3.0 and tracker.metrics["time/other_s"] == 5.75
    assert tracker.metrics["time/driver_ray_start_s"] == 6.0 and tracker.dict == (split, "time_split.json")
    assert tracker.metrics["time/train_steps_share"] == 70 / wall


def test_a_classification_sweep_prints_its_chance_line(tmp_path):
    """ListOps up-trained: Table 5 ends with the majority class's column, the quality table with its
    row, each followed by what it means; a cell whose CI reaches it says "at chance"."""
    from flurka.results import ingest_sweep
    from flurka.stats import CHANCE_NOTE
    from flurka.sweeps.runner import SweepOutcome, summary

    def trials(key, mech, accuracy, alpha=None, d_k=None):
        return [{"trial_key": f"{key}-s{s}", "attention": mech, "benchmark": "lra-listops-small", "seed": s,
                 "status": "ok", "steps": 600, "alpha": alpha, "base": "low-rank" if alpha else None, "d_k": d_k,
                 "num_features": None, "train_flops": 1e15, "wall_time_s": 60.0, "curve": [],
                 "metrics": {"accuracy": a, "loss": 2.0 - a, "majority_accuracy": 0.139}} for s, a in enumerate(accuracy)]

    spec = validate(SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.5,),
                              steps=8, run_dir=str(tmp_path / "run")))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = open_results(url)
    try:
        ingest_sweep(engine, {"sweep_id": "lo", "name": "lo", "created_at": "2026-12-05T12:00:00+00:00",
                              "environment": {"device": "cpu", "host": "h", "versions": {}},
                              "trials": [*trials("rnn", "rnn", (0.44, 0.46, 0.48)),
                                         *trials("lin", "linformer", (0.50, 0.52, 0.54), d_k=16),
                                         *trials("fr", "flurka-rnn", (0.13, 0.15, 0.17), alpha=0.5, d_k=16)]})
        tables = _tables(engine, spec, "lo")
    finally:
        engine.dispose()
    up = tables["uptraining_lra-listops-small"]
    assert up.columns[-1] == "chance" and up.at[("flurka-rnn", "low-rank", 16), "chance"] == "13.9"
    assert up.at[("flurka-rnn", "low-rank", 16), "50%"].endswith("(n=3), at chance *")
    assert "chance" not in tables["uptraining_lra-listops-small_loss"].columns      # a loss has no chance line
    assert tables["quality"].index[-1] == "chance"
    text = summary(SweepOutcome("lo", tmp_path / "run", "sqlite:///mlflow.db", url,
                                {"uptrain_steps_executed": 10, "uptrain_steps_independent": 16,
                                 "uptrain_compute_ratio": 10 / 16}, {}, [], tables))
    assert text.count(CHANCE_NOTE) == 2
    row = next(line for line in text.splitlines() if line.startswith("| flurka-rnn |") and "at chance" in line)
    assert row.rstrip(" |").endswith("| 13.9")          # as the table wrote it, not re-read as 13.90
    assert text.index("| flurka-rnn |") < text.index(CHANCE_NOTE) < text.index("Up-training α, lra-listops-small: eval")
