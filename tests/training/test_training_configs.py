"""Benchmark configs carry the paper's Table 6; validation fails early with one clear line."""

import dataclasses

import pytest

from flurka.configs import BENCHMARKS, TrainConfig, get_config, validate

NAMED = (["mlm-wikitext103"] + [f"glue-{t}" for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")]
         + [f"lra-{t}" for t in ("listops", "text", "retrieval", "image", "pathfinder")]
         + ["nmt-wmt14-ende", "nmt-wmt14-enfr", "imagenet",
            "lra-listops-small", "lra-image-small", "mlm-small", "nmt-small"])


def test_every_named_benchmark_is_registered_and_valid():
    assert set(NAMED) <= set(BENCHMARKS)
    for name in BENCHMARKS:
        c = get_config(name)
        assert c.benchmark == name and validate(c) is c


def _row(c):
    return (c.batch_size, c.learning_rate, c.schedule, c.model.num_layers, c.model.num_heads, c.model.head_dim, c.model.d_ff)


# Table 6 of the paper: batch, lr, schedule, layers, heads, head dim, FFN
TABLE6 = {
    "mlm-wikitext103": (1024, 1e-4, "linear", 12, 12, 64, 3072),
    "glue-cola": (1024, 1e-4, "linear", 12, 12, 64, 3072),
    "glue-mnli": (1024, 1e-4, "linear", 12, 12, 64, 3072),
    "lra-listops": (32, 1e-4, "linear", 2, 2, 64, 128),
    "lra-text": (32, 1e-4, "linear", 2, 2, 64, 128),
    "lra-retrieval": (16, 2e-4, "linear", 2, 2, 64, 128),
    "lra-image": (256, 1e-4, "linear", 2, 2, 64, 128),
    "lra-pathfinder": (128, 2e-4, "linear", 2, 2, 64, 128),
    "nmt-wmt14-ende": (128, 1.0, "inverse_sqrt", 12, 12, 64, 3072),
    "nmt-wmt14-enfr": (128, 1.0, "inverse_sqrt", 12, 12, 64, 3072),
    "imagenet": (128, 1e-3, "cosine", 7, 4, 64, 512),
    "nmt-ablation-ende": (128, 1.0, "inverse_sqrt", 6, 8, 64, 2048),
}


@pytest.mark.parametrize("name", sorted(TABLE6))
def test_table6_settings(name):
    assert _row(get_config(name)) == TABLE6[name]


@pytest.mark.parametrize("name", ["nmt-wmt14-ende", "nmt-wmt14-enfr", "nmt-ablation-ende"])
def test_paper_nmt_scores_bleu_on_every_newstest_sentence(name):
    c = get_config(name)
    assert c.eval_batches == 0 and c.bleu_batches * c.batch_size >= 3_003     # newstest2014, whole
    assert 0 < c.curve_batches < c.bleu_batches                               # the curve's cheap evaluations


def test_steps_and_metrics():
    assert get_config("mlm-wikitext103").steps == 120_000
    assert get_config("nmt-wmt14-ende").steps == 128_000
    assert get_config("glue-cola").metrics[0] == "matthews"
    assert get_config("glue-stsb").metrics == ("pearson", "spearman")
    assert get_config("glue-stsb").task == "regression"
    assert get_config("glue-mrpc").metrics[0] == "f1"
    assert get_config("imagenet").metrics == ("accuracy", "top5")
    assert get_config("nmt-small").metrics[0] == "bleu"
    for c in map(get_config, BENCHMARKS):
        assert c.notes, f"{c.benchmark} does not say where its settings come from"


def test_overrides_merge_options_and_scale_warmup():
    c = get_config("lra-listops", model=dict(attention="flurka-rnn", attention_options={"d_k": 64}))
    assert c.model.attention == "flurka-rnn" and c.model.attention_options == {"d_k": 64, "num_features": 128}
    short = get_config("lra-listops", steps=5000)
    assert short.warmup_steps == 100                  # 1000/50000 of the run, kept
    assert get_config("lra-listops", steps=5000, warmup_steps=7).warmup_steps == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.steps = 3


@pytest.mark.parametrize("overrides,message", [
    ({"model.attention": "softmax"}, r"unknown attention mechanism 'softmax'; valid: full, flash, linformer"),
    ({"alpha": 1.5, "model.attention": "flurka-rnn"}, r"alpha must be in \[0, 1\]"),
    ({"alpha": -0.1, "model.attention": "flurka-rnn"}, r"alpha must be in \[0, 1\]"),
    ({"alpha": 0.5, "model.attention": "performer"}, r"alpha > 0 \(up-training\) needs a FLuRKA attention; valid: flurka-performer"),
    ({"model.attention_options": {"d_k": 41}}, r"d_k=41 exceeds the benchmark's max_len=40"),
    ({"model.num_heads": 3}, r"num_heads=3 must divide d_model=64"),
    (dict(base="sparse"), r"unknown up-training base 'sparse'; valid: low-rank, kernel"),
    (dict(schedule="step"), r"unknown schedule 'step'; valid: linear"),
    (dict(steps=0), r"steps must be a positive int"),
    ({"model.attention_options": "foo"}, r"attention_options must be a mapping such as \{'d_k': 16\}, got 'foo'$"),
    (dict(dataset_options=[1]), r"dataset_options must be a mapping"),
    (dict(steps=10**20), r"steps must be a positive int of at most 2147483647, got 100000000000000000000$"),
    (dict(batch_size=2**31), r"batch_size must be a positive int of at most 2147483647"),
    (dict(eval_every=-1), r"eval_every must be a non-negative int"),
    ({"model.attention_options": {"rank": 3}}, r"unknown attention option\(s\) \['rank'\]"),
    (dict(bogus=1), r"unknown config field\(s\) \['bogus'\]; valid: benchmark"),
    (dict(d_model=32), r"unknown config field\(s\) \['d_model'\]; a model setting goes under model \(model.d_model\)"),
    ({"model.width": 32}, r"unknown model field\(s\) \['width'\]; valid: attention, attention_options, d_model"),
])
def test_validation_errors_are_one_line(overrides, message):
    with pytest.raises(ValueError, match=message) as err:
        get_config("lra-listops-small", **overrides)
    assert "\n" not in str(err.value)


def test_unknown_benchmark_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown benchmark 'lra-foo'; valid: .*lra-listops-small"):
        get_config("lra-foo")


def test_switch_step_is_alpha_times_steps():
    c = get_config("lra-image-small", alpha=0.25, steps=200, model=dict(attention="flurka-performer"))
    assert c.switch_step == 50 and isinstance(c, TrainConfig)


@pytest.mark.parametrize("name", ["lra-listops-small", "lra-image-small", "mlm-small", "nmt-small"])
def test_small_configs_match_their_shipped_data(name):
    """The small benchmarks run offline, so their config must agree with the data that ships
    (nmt-small once asked for max_len 32 of a 64-token set and could not start)."""
    from flurka.training.loop import check_against_data, load_dataset
    config = get_config(name)
    check_against_data(config, load_dataset(config).info)
