"""The bare Flax loop ``flurka train`` is timed against (``flurka.speed.bare_loop``) trains the same
model on the same loss — else its steps/s would be a different computation's."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from flurka.configs import get_config
from flurka.speed import bare_loop
from flurka.training.loop import build_model, load_dataset
from flurka.training.tasks import make_task


@pytest.mark.parametrize("benchmark", bare_loop.SMALL)
def test_the_bare_loss_is_the_tasks_loss(benchmark):
    config = get_config(benchmark)
    dataset = load_dataset(config)
    model = build_model(config, dataset.info, config.model.attention)
    batch = {k: jax.numpy.asarray(v) for k, v in next(dataset.train_batches(8)).items()
             if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
    ours, _ = make_task(config).loss(model, batch, deterministic=True)
    bare = bare_loop.bare_loss(config, model, batch, deterministic=True)
    assert float(bare) == pytest.approx(float(ours), rel=1e-6)
    assert float(bare) > 0


@pytest.mark.slow
def test_the_benchmark_writes_both_rates_and_their_ratio(tmp_path):
    out = tmp_path / "loop.json"
    assert bare_loop.main(["--benchmarks", "lra-image-small", "--steps", "3", "--repeats", "1",
                           "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["benchmark"] == "lra-image-small" and row["steps"] == 3
    assert row["flurka_median_steps_per_s"] > 0 and row["bare_median_steps_per_s"] > 0
    assert row["ratio"] == pytest.approx(row["bare_median_steps_per_s"]
                                         / row["flurka_median_steps_per_s"])


def test_an_unknown_benchmark_is_one_line_before_any_compute(capsys):
    with pytest.raises(SystemExit) as err:
        bare_loop.main(["--benchmarks", "nmt-wmt14-ende"])
    assert err.value.code == 2
    assert "unknown benchmark(s) ['nmt-wmt14-ende']" in capsys.readouterr().err.splitlines()[-1]
