"""The main job's sweep file (``make sweep``: ``--config uptrain-small``) end to end at tiny size
on an embedded local Ray: one Linformer base per (benchmark, d_k, seed) in the first experiment,
which every branch forks from, with the no-attention control that fits beside them on two
workers; the Performer baselines and the rest of the control beside the branches in the second;
the up-training tables, their floor and the three observations judged, then the next commands."""

from __future__ import annotations

import json

import pytest

from flurka.configs.overrides import nested
from flurka.sweeps.branching import make_plan
from flurka.sweeps.runner import run_sweep, summary
from flurka.sweeps.spec import from_args, validate


@pytest.mark.slow
def test_main_job_config_at_tiny_size(tmp_path, tiny_overrides, capfd):
    tiny = nested(tiny_overrides, {"bleu_batches": 1, "model.attention_options": {"num_features": 8}})
    spec = validate(from_args({"config": "uptrain-small", "steps": 8, "overrides": tiny, "num_cpus": 2,
                               "run_dir": str(tmp_path / "run")}))
    assert len(spec.seeds) == 3 and len(spec.d_k) == 1 and len(spec.all_alphas) == 3   # make sweep's, at 8 steps
    plan = make_plan(spec)
    out = run_sweep(spec)
    assert not out.failed and not out.stopped and not out.skipped
    printed = capfd.readouterr()
    assert "mlflow.store.db.utils" not in printed.out + printed.err    # issue 59: a new store's INFO lines
    assert set(out.results) == {r.key for r in plan.baselines + plan.branches}

    def trials(phase):   # the planned runs each Tune experiment trained, from its trials' results
        keys = []
        for result in (out.run_dir / "tune").glob(f"*-{phase}/*/result.json"):
            last = json.loads(result.read_text().splitlines()[-1])
            keys.append(last["config"]["cfg"]["run"]["key"])
        return sorted(keys)

    linformer = sorted(r.key for r in plan.baselines if r.attention == "linformer" and r.d_k != 1)
    control = sorted(r.key for r in plan.baselines if r.d_k == 1)
    assert len(linformer) == len(spec.d_k) * len(spec.seeds) and len(control) == len(spec.seeds)
    assert trials("first") == sorted(linformer + control[:1])    # three bases, two workers: one control fits
    beside = sorted(r.key for r in plan.baselines if r.attention == "performer")
    assert trials("branches") == sorted(beside + control[1:] + [r.key for r in plan.branches])
    for branch in plan.branches:                                 # each forked from its own base
        base = out.results[branch.base_key]
        assert branch.base_key in linformer and base["config"]["model"]["attention_options"]["d_k"] == branch.d_k
        assert out.results[branch.key]["config"]["base_checkpoint"]

    text = summary(out)
    for d_k in spec.d_k:
        assert f"| flurka-performer | low-rank |    {d_k:2d} | performer " in text
    for metric in ("BLEU (char, 0–100)", "exact match (%)"):
        assert f"Table 5's observations, nmt-list-small, {metric}:" in text
    assert "(1) most α cells lie between their constituents (kernel, low-rank): " in text
    assert "(2) best variant beats both: " in text
    assert "(3) best α in [25 %, 37.5 %]: yes" in text or "(3) best α in [25 %, 37.5 %]: no" in text
    assert "| no attention " in text                            # the floor: a column and a row
    assert text.splitlines()[-4].startswith("  MLflow runs:    flurka ui --run-dir ")

    # issue 59: the MLflow UI opens on the result: the parent run's and the experiment's
    # description hold the terminal's tables and observations, as Markdown it renders
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    client = MlflowClient(tracking_uri=spec.mlflow_tracking_uri)
    note = client.get_run(out.parent_run_id).data.tags[MLFLOW_RUN_NOTE]
    assert client.get_experiment_by_name(spec.name).tags[MLFLOW_RUN_NOTE] == note
    shown = [line for line in text.splitlines() if line.startswith(("| ", "(1)", "(2)", "(3)"))]
    assert shown and all(line in note.splitlines() for line in shown)
    assert "\n\n| variant " in note and "\n\n(3) best α" in note     # each table and line a block of its own
