"""A data set's extra eval splits (MNLI's mismatched dev set): the loop evaluates each beside the eval
split, over at most ``eval_batches`` batches, and records the config's metrics under
``flurka.data.core.split_metric`` (``accuracy_mismatched``: Table 2's MNLI-mm column)."""

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from training_helpers import TINY

from flurka.configs import get_config
from flurka.configs.overrides import nested
from flurka.data import Dataset, get_dataset
from flurka.data.core import EncodedExamples
from flurka.training import loop, run
from flurka.training.optimizer import make_optimizer
from flurka.training.tasks import make_task

LEN = 32


@pytest.fixture
def mnli(tmp_path):
    """glue-mnli on TFDS mock data (12 matched examples), its mismatched split made its own: 10
    examples, labels shifted (the mock's splits are otherwise identical)."""
    with tfds.testing.mock_data(num_examples=12):
        ds = get_dataset("glue-mnli", data_dir=str(tmp_path), max_len=LEN)
        src = ds.extra_evals["mismatched"]
        shifted = [dict(src.source[i], label=(int(src.source[i]["label"]) + 1) % 3) for i in range(10)]
        yield Dataset(ds.info, ds.train, ds.eval, seed=0, decode=ds.decode,
                      extra_evals={"mismatched": EncodedExamples(shifted, src.encode)})


def _config(tmp_path, **overrides):
    return get_config("glue-mnli", **nested(TINY, {"batch_size": 4, "eval_batches": 2, "max_len": LEN,
                                                   "dataset_options": {"max_len": LEN}, "data_dir": str(tmp_path)},
                                            overrides))


def _accuracy(model, examples, n):
    """The model's argmax accuracy over the first ``n`` examples, called directly (no eval step)."""
    b = examples.get(np.arange(n))
    logits = model(b["inputs"], b["mask"], segments=b["segments"], deterministic=True)
    return float(np.mean(np.argmax(np.asarray(logits), -1) == b["label"]))


def test_mismatched_accuracy_is_the_models_accuracy_on_its_first_eval_batches(mnli, tmp_path):
    config = _config(tmp_path, model=dict(attention="full"))
    task = make_task(config)
    phase = loop.make_phase(config, mnli.info, "full", task, make_optimizer(config))
    # the phase's parameters, perturbed so that the untrained model's predictions differ between examples
    keys = jax.random.split(jax.random.key(7), len(phase.params))
    phase.params = {k: v + 0.5 * jax.random.normal(key, v.shape, v.dtype)
                    for key, (k, v) in zip(keys, phase.params.items())}
    metrics = loop.evaluate(config, mnli, task, phase)
    assert set(metrics) == {"loss", "accuracy", "majority_accuracy", "accuracy_mismatched"}
    model = phase.parts.merge(phase.params, phase.other)
    n = config.eval_batches * config.batch_size     # 8 of the 12 matched and of the 10 mismatched
    assert metrics["accuracy"] == pytest.approx(_accuracy(model, mnli.eval, n), abs=1e-6)
    assert metrics["accuracy_mismatched"] == pytest.approx(_accuracy(model, mnli.extra_evals["mismatched"], n), abs=1e-6)
    # every example of both splits when eval_batches is 0
    whole = loop.evaluate(config.replace(eval_batches=0), mnli, task, phase)
    assert whole["accuracy_mismatched"] == pytest.approx(_accuracy(model, mnli.extra_evals["mismatched"], 10), abs=1e-6)
    assert whole["accuracy"] == pytest.approx(_accuracy(model, mnli.eval, 12), abs=1e-6)


def test_a_run_records_mismatched_accuracy_in_every_evaluation(mnli, tmp_path):
    result = run(_config(tmp_path, steps=2, eval_every=1, model=dict(attention="flurka-rnn")), dataset=mnli)
    assert result["status"] == "ok" and len(result["eval_history"]) == 2
    for entry in [*result["eval_history"], result["final_metrics"]]:
        assert 0.0 <= entry["accuracy_mismatched"] <= 1.0, entry
    assert result["dataset"]["num_eval_mismatched"] == 10
