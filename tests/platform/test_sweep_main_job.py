"""The main job's sweep file (``make sweep``: ``--config uptrain-small``) end to end at tiny size
on an embedded local Ray: one Linformer base per (benchmark, d_k, seed) in the first experiment,
which every branch forks from; the Performer baselines beside the branches in the second; the
up-training table and the observations block printed."""

from __future__ import annotations

import json

import pytest

from flurka.sweeps.branching import make_plan
from flurka.sweeps.runner import run_sweep, summary
from flurka.sweeps.spec import from_args, validate


@pytest.mark.slow
def test_main_job_config_at_tiny_size(tmp_path, tiny_overrides):
    tiny = {**tiny_overrides, "num_decoder_layers": 1, "bleu_batches": 1, "max_len": 16,
            "dataset_options": {"max_len": 16}, "attention_options": {"num_features": 8}}
    spec = validate(from_args({"config": "uptrain-small", "steps": 8, "overrides": tiny, "num_cpus": 2,
                               "run_dir": str(tmp_path / "run")}))
    assert len(spec.seeds) == 3 and len(spec.d_k) == 2          # what make sweep trains, at 8 steps
    plan = make_plan(spec)
    out = run_sweep(spec)
    assert not out.failed and not out.stopped and not out.skipped
    assert set(out.results) == {r.key for r in plan.baselines + plan.branches}

    def trials(phase):   # the planned runs each Tune experiment trained, from its trials' results
        keys = []
        for result in (out.run_dir / "tune").glob(f"*-{phase}/*/result.json"):
            last = json.loads(result.read_text().splitlines()[-1])
            keys.append(last["config"]["cfg"]["run"]["key"])
        return sorted(keys)

    linformer = sorted(r.key for r in plan.baselines if r.attention == "linformer")
    assert len(linformer) == len(spec.d_k) * len(spec.seeds) and trials("first") == linformer
    beside = sorted(r.key for r in plan.baselines if r.attention == "performer")
    assert trials("branches") == sorted(beside + [r.key for r in plan.branches])
    for branch in plan.branches:                                 # each forked from its own base
        base = out.results[branch.base_key]
        assert branch.base_key in linformer and base["config"]["attention_options"]["d_k"] == branch.d_k
        assert out.results[branch.key]["config"]["base_checkpoint"]

    text = summary(out)
    for d_k in spec.d_k:
        assert f"| flurka-performer | {d_k:5d} | performer " in text
    assert "Table 5's observations, nmt-small, BLEU (char, 0–100):" in text
    assert "(1) " in text and "(2) best variant beats both: " in text
    assert "(3) best α in [25 %, 37.5 %]: not judged (one α per row" in text
