"""Pre-train then fine-tune in one sweep (issue 57, ``pretrain:``): the MLM runs first, then each
fine-tuning run from the pre-training run of its mechanism, α, d_k and seed — its encoder loaded
(E and positions cut to the shorter sequence), its lineage in MLflow and the results DB; a
fine-tuning run whose pre-training failed is not started, in one line; a chain that cannot load
is refused before any compute."""

from __future__ import annotations

import os

import numpy as np
import pytest
import sqlalchemy as sa
from offline_benchmarks import write_local_sets

from flurka.sweeps import cli
from flurka.sweeps.branching import make_plan
from flurka.sweeps.spec import SpecError, SweepSpec, validate
from flurka.training.checkpoints import Checkpointer
from flurka.training.init_from import TRUNK
from flurka.training.state import by_path

PRE_DATA = {"max_len": 64, "max_train_bytes": 20_000, "max_eval_bytes": 4_000}


def _chain(tmp_path, data_dir, **changes) -> SweepSpec:
    """mlm-small at 64 bytes, then lra-retrieval (bytes too) at 32, 1-layer d_model-16 models."""
    tiny = dict(warmup_steps=0, eval_every=0, log_every=2, batch_size=8, eval_batches=1,
                model=dict(d_model=16, d_ff=32, num_layers=1, attention_options={"d_k": 8, "num_features": 8}))
    fields = dict(benchmarks=("lra-retrieval",), variants=("flurka-rnn", "flurka-performer"), alphas=(0.0,),
                  seeds=(0,), steps=4, d_k=(8,), baselines=False, num_cpus=2, name="chain",
                  run_dir=str(tmp_path / "run"),
                  # fine-tuning at lr 1e-30: its last checkpoint holds the parameters it started from
                  overrides={**tiny, "learning_rate": 1e-30, "max_len": 32, "dataset_options": {"max_len": 32},
                             "data_dir": str(data_dir)},
                  pretrain={"benchmark": "mlm-small", "steps": 4,
                            "overrides": {"learning_rate": 1e-3, "max_len": 64, "dataset_options": PRE_DATA}})
    return SweepSpec(**{**fields, **changes})


def _params(workdir) -> dict[str, np.ndarray]:
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        state, _ = ckpt.restore_saved(ckpt.latest_step())
    return {k: np.asarray(v) for k, v in by_path(state["params"]).items() if k.startswith(TRUNK)}


@pytest.mark.slow
def test_a_chained_sweep_fine_tunes_each_run_from_its_own_pretraining(tmp_path, mlflow_runs, monkeypatch):
    """Stopped between its phases, then ``--resume``d: phase 1 is not trained again, phase 2 starts
    from it."""
    import dataclasses

    from flurka.sweeps import runner
    from flurka.sweeps.trainable import work_dir

    spec = _chain(tmp_path, write_local_sets(tmp_path / "data"))

    def stop(*args, **kwargs):   # Ctrl-C once phase 1 is done, before phase 2 is planned
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(runner, "unpretrained", stop)
        with pytest.raises(runner.SweepInterrupted):
            runner.run_sweep(spec)
    pre_dirs = sorted((tmp_path / "run" / "work").iterdir())
    assert len(pre_dirs) == 2 and all("mlm-small" in d.name for d in pre_dirs)
    written = {f: f.stat().st_mtime_ns for d in pre_dirs for f in (d / "checkpoints").rglob("*") if f.is_file()}
    out = runner.run_sweep(dataclasses.replace(spec, resume=True))
    assert {f: f.stat().st_mtime_ns for f in written} == written   # phase 1 restored, not trained again
    assert not out.failed and not out.skipped and len(out.results) == 4
    pre = {k for k in out.results if "/mlm-small/" in k}
    fine = set(out.results) - pre
    assert len(pre) == len(fine) == 2
    lineage = {k: out.results[k]["init_from"] for k in fine}
    for key in fine:
        source = next(p for p in pre if p.split("/")[2] == key.split("/")[2])   # same mechanism
        assert lineage[key]["workdir"] == str(work_dir(out.run_dir, source))
        assert (lineage[key]["benchmark"], lineage[key]["step"]) == ("mlm-small", 4)
        tuned, started = _params(work_dir(out.run_dir, key)), _params(work_dir(out.run_dir, source))
        assert set(tuned) == set(started)
        for k, v in started.items():   # the pre-trained trunk, E and positions cut from 64 to 32
            if k == "embedding/position":
                v = v[:32]
            elif k.endswith(("/seq_proj/e1", "/seq_proj/e2")):
                assert v.shape[-1] == 64
                v = v[..., :32]
            np.testing.assert_allclose(tuned[k], v, rtol=0, atol=1e-20, err_msg=f"{key}: {k}")
        other = next(p for p in pre if p != source)   # not the other mechanism's pre-training
        assert not np.allclose(tuned["encoder/layers/0/attention/query/kernel"],
                               _params(work_dir(out.run_dir, other))["encoder/layers/0/attention/query/kernel"])
    # MLflow: the fine-tuning runs' lineage tag and param; the pre-training runs have none
    client, runs = mlflow_runs(out.mlflow_uri, "chain")
    nested = {r.data.tags["flurka.trial_key"]: r for r in runs if "flurka.trial_key" in r.data.tags}
    assert set(nested) == set(out.results)
    for key, r in nested.items():
        want = next(p for p in pre if p.split("/")[2] == key.split("/")[2]) if key in fine else None
        assert r.data.tags.get("flurka.init_from") == want, key
        assert r.data.params.get("run.init_from") == str(want), key
    # the results DB: each fine-tuning trial's init_from is its pre-training run's key
    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text("SELECT trial_key, init_from FROM trials")).all())
    engine.dispose()
    assert rows == {k: (nested[k].data.tags.get("flurka.init_from")) for k in out.results}


def test_fine_tuning_runs_whose_pretraining_failed_are_not_started_in_one_line(tmp_path, capsys):
    from flurka.sweeps.runner import _report_unpretrained, unpretrained

    plan = make_plan(validate(_chain(tmp_path, tmp_path, seeds=(0, 1))))
    assert len(plan.pretrain.runs) == 4 and len(plan.runs) == 8
    by_source = {r.init_from: r.key for r in plan.branches}
    assert set(by_source) == {r.key for r in plan.pretrain.runs}   # one each, its own
    failed_key, *done = sorted(by_source)
    not_started = unpretrained(plan, {k: {"status": "ok"} for k in done}, [failed_key], [])
    assert not_started == {by_source[failed_key]: f"its pre-training run {failed_key} failed"}
    _report_unpretrained(not_started, plan)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"[flurka] not started: 1 fine-tuning run(s) (lra-retrieval): its pre-training run {failed_key} failed"]


@pytest.mark.parametrize("pretrain,needle", [
    ({"benchmark": "lra-listops-small"},
     "pretrain: lra-listops-small is not masked language modelling (its task is classification); pre-train on one of: "),
    ({"benchmark": "mlm-small", "overrides": {"model.d_model": 32}},
     "pretrain: lra-retrieval has model.d_model=16 but mlm-small pre-trains model.d_model=32, so no encoder of it fits"),
    ({"benchmark": "mlm-small", "overrides": {"max_len": 16, "dataset_options": {"max_len": 16}}},
     "pretrain: lra-retrieval is 32 tokens long but mlm-small pre-trains 16: no position past 16 was trained"),
    ({"benchmark": "lra-retrieval"}, "pretrain: lra-retrieval is also a fine-tuning benchmark"),
    ({"benchmark": "mlm-small", "colour": 3}, "pretrain: unknown key 'colour'"),
])
def test_a_chain_that_cannot_load_is_refused_in_one_line_before_any_compute(tmp_path, capsys, pretrain, needle):
    import argparse
    import yaml

    spec = _chain(tmp_path, tmp_path)
    path = tmp_path / "chain.yaml"
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in spec.to_dict().items()
              if k in ("benchmarks", "variants", "alphas", "seeds", "steps", "d_k", "baselines", "overrides",
                       "run_dir", "name")}
    pre = {**pretrain}
    if "overrides" in pre:
        pre["overrides"] = {"max_len": 64, "dataset_options": PRE_DATA, **pre["overrides"]}
    elif pre["benchmark"] == "mlm-small":
        pre["overrides"] = {"max_len": 64, "dataset_options": PRE_DATA}
    path.write_text(yaml.safe_dump({**fields, "pretrain": pre}))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    code = cli.run(parser.parse_args(["--config", str(path)]))
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith("flurka sweep: error: "), err
    assert needle in err, err
    assert not (tmp_path / "run").exists()      # nothing created, nothing started


def test_flurka_eva_at_a_shorter_length_is_refused_unless_fine_tuned_at_the_pretraining_length(tmp_path):
    spec = _chain(tmp_path, tmp_path, variants=("flurka-eva",))
    with pytest.raises(SpecError, match=r"^pretrain: flurka-eva cannot fine-tune lra-retrieval at N=32 from "
                                        r"pre-training at N=64: .*add it to pretrain's full_length"):
        validate(spec)
    plan = make_plan(validate(_chain(tmp_path, tmp_path, variants=("flurka-eva",),
                                     pretrain={**spec.pretrain, "full_length": ["flurka-eva"]})))
    assert [r.max_len for r in plan.branches] == [64] and plan.branches[0].init_from == plan.pretrain.runs[0].key
