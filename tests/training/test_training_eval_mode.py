"""Evaluation runs the model in evaluation mode: EVA's random ε (a fixed draw, ``redraw=False``)
shapes training, never an evaluation."""

import jax
import numpy as np
from training_helpers import tiny

from flurka.training import loop
from flurka.training.optimizer import make_optimizer
from flurka.training.tasks import make_task


def _noise_paths(other):
    return [k for k in other if k.endswith("noise")]


def test_eva_noise_is_not_used_at_evaluation(digits):
    for mech in ("eva", "flurka-eva"):
        config = tiny(model=dict(attention=mech))
        task = make_task(config)
        phase = loop.make_phase(config, digits.info, mech, task, make_optimizer(config))
        paths = _noise_paths(phase.other)
        assert paths, f"{mech}: no noise variable among {sorted(phase.other)}"
        batch = loop._device_batch(next(iter(digits.eval_batches(config.batch_size))))
        louder = {k: (v * 100.0 + 3.0 if k in paths else v) for k, v in phase.other.items()}
        evaluated = [jax.device_get(phase.eval_step(phase.params, other, batch))
                     for other in (phase.other, louder)]
        for k in evaluated[0]:
            np.testing.assert_array_equal(evaluated[0][k], evaluated[1][k])
        # ...while the training loss does depend on it (the noise is real where it belongs)
        key = jax.random.key(0)
        losses = [float(phase.train_step(phase.params, other, phase.opt_state, batch, key)[3]["loss"])
                  for other in (phase.other, louder)]
        assert losses[0] != losses[1]
