"""Gradient accumulation and rematerialisation (issue 57): config fields that trade time for
memory and change nothing else — the same step, to float tolerance — and the memory floor that
sees a slice, not the whole batch."""

import numpy as np
import pytest
from training_helpers import tiny

from flurka.training import run
from flurka.training.memory import step_floor_bytes


@pytest.mark.parametrize("changes", [dict(grad_accumulation=4), {"model.remat": True},
                                     {"grad_accumulation": 2, "model.remat": True}])
def test_a_step_is_the_same_step(changes, digits):
    """Dropout off (each slice draws its own dropout key), a mean loss over examples: the mean of
    four quarter-batch gradients is the batch's gradient."""
    base = {"steps": 3, "model.dropout_rate": 0.0, "model.attention": "linformer"}
    plain = run(tiny(**base), dataset=digits)
    other = run(tiny(**base, **changes), dataset=digits)
    for metric in ("loss", "grad_norm"):   # the gradient's norm: the gradient itself, to AdamW's eye
        np.testing.assert_allclose([h[metric] for h in other["history"]], [h[metric] for h in plain["history"]],
                                   rtol=5e-5, err_msg=metric)

def test_accumulation_must_cut_the_batch_evenly():
    with pytest.raises(ValueError, match="grad_accumulation=3 must divide batch_size=8"):
        from flurka.configs.base import validate
        validate(tiny(grad_accumulation=3))


def test_the_memory_floor_holds_one_slice():
    whole, sliced = (step_floor_bytes(tiny(batch_size=64, grad_accumulation=k))["device"] for k in (1, 4))
    assert sliced * 4 == whole


def test_remat_checkpoints_each_encoder_block(digits):
    """remat=True puts each block of the compiled training step under jax.checkpoint (``remat``
    in its jaxpr: the backward pass recomputes the block); without it there is none."""
    import jax

    from flurka.training import loop
    from flurka.training.optimizer import make_optimizer
    from flurka.training.tasks import make_task

    def checkpoints(remat: bool) -> int:
        config = tiny(model=dict(attention="linformer", remat=remat, num_layers=3))
        phase = loop.make_phase(config, digits.info, "linformer", make_task(config), make_optimizer(config))
        batch = loop._device_batch(next(digits.train_batches(8, start_step=0)))
        step = jax.make_jaxpr(phase.train_step)(phase.params, phase.other, phase.opt_state, batch,
                                                jax.random.key(0))
        return str(step).count("remat")

    assert (checkpoints(False), checkpoints(True)) == (0, 3)
