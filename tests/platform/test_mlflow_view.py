"""What a fresh browser sees of a sweep in MLflow's UI (issue 59, "MLflow UI"): the runs table opens
on the result — the benchmark's metrics as columns, every trial's value without expanding its
parent, best first, the names whole — and no empty "Default" experiment is listed.

A real SQLite store written the way a sweep writes it (``SweepTracker`` and its Tune callback), the
saved view the tracker leaves at the sweep's end read back as MLflow 3.17's UI reads it, and (slow)
``flurka ui`` opened in a new user's headless Chromium at the URL it prints."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType

import browser
from testsupport import free_ports, pids_naming

from flurka.sweeps.trial_report import RESULT_KEY
from flurka.tracking.callback import MLflowTrialCallback
from flurka.tracking.cli import landing_url
from flurka.tracking.mlflow_runs import SweepTracker, artifact_root_for, run_colors, trial_run_name
from flurka.tracking.view import RUN_NAME_COLUMN, VIEW_KEY, VIEW_TAG, name_width, read_envelope

EXPERIMENT = "uptrain-small"
SWEEP = "uptrain-small-20261201-120000-abcdef"
BEST = 31.5          # the best branch's BLEU: a nested run's value the table must show
# (attention, α, d_k, seed, BLEU): Linformer baselines, the FLuRKA branches forked from them
TRIALS = [("linformer", None, 16, 0, 21.25), ("linformer", None, 16, 1, 22.75),
          ("flurka-performer", 0.25, 16, 0, 27.5), ("flurka-performer", 0.25, 16, 1, BEST)]


def _run(attention, alpha, d_k, seed, bleu) -> dict:
    """A planned run of :data:`TRIALS`, as the runner's plan has it."""
    kind = "branch" if alpha else "baseline"
    return {"kind": kind, "benchmark": "nmt-small", "attention": attention, "seed": seed, "d_k": d_k,
            "alpha": alpha, "steps": 20, "key": f"{kind}/nmt-small/{attention}/s{seed}/a{alpha}"}


def _sweep(run_dir: Path) -> SweepTracker:
    """A finished sweep's store in ``run_dir``, written as the runner writes one: the parent run, a
    nested run per trial through the callback's hooks (train and eval reports, the final result),
    the description, then the end of the sweep."""
    uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    tracker = SweepTracker(uri, EXPERIMENT, SWEEP, artifact_root=artifact_root_for(uri, run_dir))
    tracker.start_sweep(SWEEP, {"benchmarks": ["nmt-small"]})
    tracker.color_runs([_run(*t) for t in TRIALS])
    for attention, alpha, d_k, seed, bleu in TRIALS:
        run = _run(attention, alpha, d_k, seed, bleu)
        callback = MLflowTrialCallback(
            tracker, params_of=lambda c: {"run": c["run"], "config": {"metrics": ["bleu", "exact_match"], "steps": 20}},
            name_of=lambda c: trial_run_name(c["run"], benchmark=False))
        trial = SimpleNamespace(config={"run": run}, last_result={})
        callback.on_trial_start(0, [], trial)
        for step in (10, 20):
            callback.on_trial_result(0, [], trial, {"step": step, "stream": "train", "loss": 4.0 - step / 10})
            callback.on_trial_result(0, [], trial, {"step": step, "stream": "eval", "eval_loss": 4.1 - step / 10,
                                                    "eval_bleu": bleu - (20 - step) / 4, "eval_exact_match": bleu / 200})
        trial.last_result = {RESULT_KEY: json.dumps({"steps": 20, "status": "ok"})}
        callback.on_trial_complete(0, [], trial)
    tracker.describe([f"**Sweep {SWEEP}**: BLEU {BEST}"])
    tracker.end_sweep("FINISHED")
    return tracker


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("view") / "runs" / EXPERIMENT
    run_dir.mkdir(parents=True)
    _sweep(run_dir)
    return run_dir


def _client(run_dir: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")


def test_the_sweep_leaves_a_saved_view_of_its_result(sweep_dir):
    """The experiment tag the UI's "Save view" writes: an envelope around the deflated state, whose
    columns are the benchmark's metrics (its config's, in order, then eval/loss) and the α, d_k,
    seed params, sorted by BLEU (higher is better: descending), every run on the charts, the name
    column as wide as the longest name needs; ``flurka ui`` names it in the URL it prints."""
    client = _client(sweep_dir)
    exp = client.get_experiment_by_name(EXPERIMENT)
    views = [k for k in exp.tags if k.startswith("mlflow.sharedViewState.")]
    assert views == [VIEW_TAG]
    outer, state = read_envelope(exp.tags[VIEW_TAG])
    assert outer["name"] == "Result: eval/bleu, best first" and outer["state"].startswith("deflate;")
    assert state["selectedColumns"] == ["metrics.`eval/bleu`", "metrics.`eval/exact_match`", "metrics.`eval/loss`",
                                        "params.`run.alpha`", "params.`run.d_k`", "params.`run.seed`"]
    assert (state["orderByKey"], state["orderByAsc"], state["searchFilter"]) == ("metrics.`eval/bleu`", False, "")
    assert state["runsHiddenMode"] == "SHOW_ALL" and "runsExpanded" not in state   # the UI drops it anyway
    names = [r.info.run_name for r in client.search_runs([exp.experiment_id])]
    assert "flurka-performer a=0.25 dk=16 s1" in names
    assert state["columnOrder"] == [RUN_NAME_COLUMN]
    assert state["columnWidths"] == {RUN_NAME_COLUMN: name_width(names)} and name_width(names) > 190
    assert landing_url(f"sqlite:///{sweep_dir / 'mlflow.db'}", 5000) == (
        f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs?viewStateShareKey={VIEW_KEY}"
        "&workflowType=machine_learning")


def test_a_resumed_sweep_replaces_its_view_and_default_stays_hidden(sweep_dir, tmp_path):
    """--resume (a new tracker on the same store, the sweep ending again) writes the same key once
    more: one tag, its creation time kept. MLflow's Default experiment of the sweep's own store is
    deleted (not listed) and points into the run dir, not at the cwd's ./mlruns/0."""
    client = _client(sweep_dir)
    exp_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    before = read_envelope(client.get_experiment(exp_id).tags[VIEW_TAG])[0]
    uri = f"sqlite:///{sweep_dir / 'mlflow.db'}"
    again = SweepTracker(uri, EXPERIMENT, SWEEP, artifact_root=artifact_root_for(uri, sweep_dir))
    again.start_sweep(SWEEP, {"benchmarks": ["nmt-small"]})
    time.sleep(0.01)
    again.end_sweep("FINISHED")
    tags = client.get_experiment(exp_id).tags
    assert [k for k in tags if k.startswith("mlflow.sharedViewState.")] == [VIEW_TAG]
    after = read_envelope(tags[VIEW_TAG])[0]
    assert after["createdAt"] == before["createdAt"] and after["updatedAt"] > before["updatedAt"]
    assert [e.name for e in client.search_experiments()] == [EXPERIMENT]
    default = client.get_experiment("0")
    assert (default.name, default.lifecycle_stage) == ("Default", "deleted")
    assert default.artifact_location == (sweep_dir / "mlartifacts").resolve().as_uri() + "/0"
    # a store that is not the sweep's own (elsewhere than its artifacts) keeps its Default
    other = f"sqlite:///{tmp_path / 'shared.db'}"
    SweepTracker(other, "other", "s", artifact_root=(tmp_path / "elsewhere" / "mlartifacts").as_uri())
    assert MlflowClient(other).get_experiment("0").lifecycle_stage == "active"


# -- in a browser ------------------------------------------------------------------------------------

def _stop(ui: subprocess.Popen, marker: str) -> None:
    """SIGTERM to flurka ui (it stops the MLflow server it started); SIGKILL what is left of ours."""
    if ui.poll() is None:
        os.kill(ui.pid, signal.SIGTERM)
        try:
            ui.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait(10)
    for pid in pids_naming(marker):   # this test's own store path
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _header(dom: str, col_id: str) -> str:
    """The runs table's header cell of ``col_id`` (AG Grid's ``col-id`` attribute)."""
    match = re.search(r'<div[^>]*class="ag-header-cell[^"]*"[^>]*col-id="' + re.escape(col_id) + r'"[^>]*>', dom)
    assert match, f"no header cell {col_id!r} in the runs table"
    return match.group(0)


@pytest.mark.slow
def test_a_fresh_browser_opens_on_the_result(sweep_dir, tmp_path, chromium_binary):
    """``flurka ui --run-dir`` prints the URL; a new user's Chromium opened there shows the runs
    table with the eval/bleu column, the best nested run's name and value (flat: sorted by BLEU, no
    parent to expand), the name column at the view's width; the experiment list has no Default."""
    (port,) = free_ports(1)
    store = str(sweep_dir / "mlflow.db")
    ui = subprocess.Popen([str(Path(sys.executable).parent / "flurka"), "ui", "--run-dir", str(sweep_dir), "--port", str(port)],
                          env={**os.environ, "MLFLOW_WORKERS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)
    try:
        url = next(line for line in iter(ui.stdout.readline, "") if line.startswith("MLflow UI on ")).split()[3]
        assert f"/runs?viewStateShareKey={VIEW_KEY}&workflowType=machine_learning" in url
        deadline = time.monotonic() + 240
        while True:     # the server answers
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3).close()
                break
            except OSError:
                assert ui.poll() is None and time.monotonic() < deadline, "the MLflow UI did not start"
                time.sleep(1)
        dom = browser.chromium(chromium_binary, tmp_path, "--virtual-time-budget=30000", "--window-size=1600,1000",
                               "--dump-dom", url, timeout=180).stdout
        assert "<title>Runs - " in dom, dom[:500]
        _header(dom, "metrics.`eval/bleu`")                       # the result's column
        _header(dom, "params.`run.alpha`")
        assert "flurka-performer a=0.25 dk=16 s1" in dom        # the best trial: a nested run, listed
        assert f">{BEST}<" in dom                                # its BLEU in the table
        assert "linformer dk=16 s0" in dom                       # the worst, listed too
        names = [trial_run_name({"attention": a, "alpha": al, "d_k": d, "seed": s}, benchmark=False)
                 for a, al, d, s, _ in TRIALS]
        width = f"width: {name_width([*names, SWEEP])}px"
        assert width in _header(dom, RUN_NAME_COLUMN), _header(dom, RUN_NAME_COLUMN)
        assert "Error loading shared view state" not in dom
        # each run's swatch in the sweep's colour for it: the best trial's configuration, its second seed lighter
        colors = run_colors([_run(*t) for t in TRIALS])
        swatches = set(re.findall(r"background(?:-color)?:\s*(#[0-9a-f]{6}|rgb\([^)]*\))", dom))
        for color in colors.values():
            rgb = "rgb({}, {}, {})".format(*(int(color[i:i + 2], 16) for i in (1, 3, 5)))
            assert color in swatches or rgb in swatches, (color, sorted(swatches))
        listing = browser.chromium(chromium_binary, tmp_path, "--virtual-time-budget=20000", "--window-size=1600,1000",
                                   "--dump-dom", url.split("#")[0] + "#/experiments?workflowType=machine_learning",
                                   timeout=180).stdout
        assert f">{EXPERIMENT}<" in listing and ">Default<" not in listing
        assert not MlflowClient(f"sqlite:///{store}").search_experiments(view_type=ViewType.ACTIVE_ONLY,
                                                                          filter_string="name = 'Default'")
    finally:
        _stop(ui, store)
