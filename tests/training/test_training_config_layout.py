"""The model's settings nested in the training config (``TrainConfig.model``, a ``ModelConfig``):
set by dotted keys or mappings merged into the benchmark's, stored nested, and a run recorded
before they were nested (flat ``d_model``, ``attention``, ...) read the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flurka.configs import get_config
from flurka.configs.base import as_dict, from_dict, model_of
from flurka.configs.model import ModelConfig
from flurka.configs.overrides import nested, parse_assignments
from flurka.results.quality_tables import setup_of
from flurka.training import loop

ROOT = Path(__file__).resolve().parents[2]
# trials a sweep recorded on 2026-12-06, before the nesting: their configs are the flat layout
RECORDED = ROOT / "benchmarks/results/cpu/2026-12-06-nmt-list/uptrain-full.json"


def _recorded() -> list[dict]:
    return [t["config"] for t in json.loads(RECORDED.read_text())["trials"] if t.get("config")]


def test_dotted_keys_and_mappings_merge_into_the_benchmarks_model():
    base = get_config("nmt-list-small")
    dotted = get_config("nmt-list-small", **parse_assignments(["model.d_model=32", "model.attention=linformer",
                                                                "model.attention_options.d_k=8", "steps=4"]))
    mapped = get_config("nmt-list-small", steps=4, model={"d_model": 32, "attention": "linformer",
                                                          "attention_options": {"d_k": 8}})
    assert dotted == mapped
    assert dotted.model == base.model.replace(d_model=32, attention="linformer",
                                              attention_options={**base.model.attention_options, "d_k": 8})
    assert dotted.model.attention_options["num_features"] == 32   # the benchmark's, kept
    assert get_config("nmt-list-small", **{"model.attention_options.num_features": None}).model.attention_options == {"d_k": 16}
    whole = ModelConfig("rnn", d_model=16, num_heads=2, num_layers=1, d_ff=32)
    assert get_config("nmt-list-small", model=whole).model is whole


def test_nested_merges_layers_key_by_key_at_every_depth():
    assert nested({"model": {"d_ff": 3, "attention_options": {"d_k": 1}}, "steps": 2},
                  {"model.attention_options.e_init": "pool", "model": {"d_model": 8}}) == \
        {"model": {"d_ff": 3, "d_model": 8, "attention_options": {"d_k": 1, "e_init": "pool"}}, "steps": 2}


@pytest.mark.parametrize("overrides,needle", [
    ({"d_model": 32}, "unknown config field(s) ['d_model']; a model setting goes under model (model.d_model)"),
    ({"model.width": 32}, "unknown model field(s) ['width']"),
    ({"model": 3}, "model must be a mapping of model fields"),
    ({"model.num_heads": 3}, "num_heads=3 must divide d_model=64"),
])
def test_a_wrong_model_setting_is_one_line(overrides, needle):
    with pytest.raises(ValueError) as err:
        get_config("nmt-list-small", **overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["nmt-list-small", "glue-cola", "imagenet", "nmt-ablation-ende"])
def test_a_config_round_trips_through_its_record(name):
    config = get_config(name, **{"model.attention": "flurka-performer", "model.remat": True})
    stored = json.loads(json.dumps(as_dict(config)))
    assert from_dict(stored) == config and stored["model"]["d_model"] == config.model.d_model


def test_a_run_recorded_before_the_nesting_reads_the_same():
    """Each recorded trial's flat config reads as the config it ran: the benchmark's with its
    mechanism, attention options and length; it forks, as a base checkpoint, a branch of today's
    config, and pools with today's record of the same trial (one setup)."""
    old = _recorded()
    assert len(old) >= 3 and all("d_model" in c and c["model"] == "seq2seq" for c in old)
    for flat in old:
        config = from_dict(flat)
        today = get_config(flat["benchmark"], steps=flat["steps"], warmup_steps=flat["warmup_steps"],
                           **{"model.attention": flat["attention"]})
        assert config.model == today.model.replace(attention_options=flat["attention_options"])
        assert config.model.num_decoder_layers == flat["num_decoder_layers"] == 2
        assert model_of(flat)["d_model"] == flat["d_model"] == config.model.d_model
        assert setup_of(flat) == setup_of(as_dict(config))
        base = config.replace(model={"attention": "linformer"})
        loop._check_fork(config, {"attention": "linformer", "config": flat}, "linformer", "old")   # no error
        with pytest.raises(ValueError, match=r"was trained with different model\.d_model$"):
            loop._check_fork(base.replace(model={"d_model": 32}), {"attention": "linformer", "config": flat},
                             "linformer", "old")


def test_a_sweep_stored_before_the_nesting_resumes_with_todays_keys(tmp_path):
    """Its sweep.json holds flat overrides (``remat``, ``d_model``): the same sweep given again
    with today's keys (``model.remat``) is the same sweep; another value is still refused."""
    from flurka.sweeps.runner import _check_same_spec
    from flurka.sweeps.spec import SpecError, from_args, stored_dict, validate

    def spec(*sets):
        return validate(from_args({"config": "uptrain-small", "steps": 8, "run_dir": str(tmp_path),
                                   "overrides": list(sets)}))

    today = spec("model.d_model=32", "model.remat=true", "batch_size=8")
    stored = json.loads(json.dumps(stored_dict(today)))
    assert stored["overrides"] == {"model": {"d_model": 32, "remat": True}, "batch_size": 8}
    flat = {**stored, "overrides": {"d_model": 32, "remat": True, "batch_size": 8}}
    _check_same_spec(today, {"spec": flat, "sweep_id": "old"})                 # no error
    with pytest.raises(SpecError, match="^--resume: overrides is "):
        _check_same_spec(spec("model.d_model=64", "model.remat=true", "batch_size=8"), {"spec": flat, "sweep_id": "old"})
