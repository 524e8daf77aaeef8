"""A batch that cannot fit is refused from the config's shapes, before data or compile (issue 40):
the floor is below what XLA's own plan of the real training step needs (so a refusal is never
wrong), and ``flurka train`` says so in one line, exit 2, creating nothing."""

from __future__ import annotations

import jax
import pytest

from flurka.configs import get_config
from flurka.training.loop import _device_batch, load_dataset, make_phase
from flurka.training.memory import check_fits, step_floor_bytes
from flurka.training.optimizer import make_optimizer
from flurka.training.tasks import make_task
from testsupport import flurka

GIB = 2**30


@pytest.mark.parametrize("benchmark, attention, batch", [
    ("lra-listops-small", "full", 64),
    ("nmt-small", "linformer", 32),
    ("mlm-small", "performer", 16),
])
def test_floor_is_below_the_compiled_steps_memory(benchmark, attention, batch):
    config = get_config(benchmark, batch_size=batch, model=dict(attention=attention))
    data = load_dataset(config)
    phase = make_phase(config, data.info, attention, make_task(config), make_optimizer(config))
    inputs = _device_batch(next(data.train_batches(batch)))
    mem = phase.train_step.lower(phase.params, phase.other, phase.opt_state, inputs,
                                 jax.random.key(0)).compile().memory_analysis()
    floor = step_floor_bytes(config)
    assert 0 < floor["device"] <= mem.temp_size_in_bytes
    assert 0 < floor["host"] <= sum(v.nbytes for v in inputs.values()) * 2


def test_floor_scales_with_the_batch_and_splits_over_devices():
    small, big = (step_floor_bytes(get_config("nmt-small", batch_size=b)) for b in (64, 6400))
    assert big["device"] == 100 * small["device"] and big["host"] == 100 * small["host"]
    split = step_floor_bytes(get_config("nmt-small", batch_size=6400), devices=4)
    assert split["device"] == big["device"] // 4 and split["host"] == big["host"]


def test_the_prefetched_batches_count_on_the_device():
    ahead, none = (step_floor_bytes(get_config("nmt-small", batch_size=6400, prefetch=p)) for p in (4, 0))
    assert none["prefetched"] == 0 and ahead["prefetched"] == 4 * ahead["host"]
    assert step_floor_bytes(get_config("nmt-small", batch_size=6400, prefetch=4), devices=4)["prefetched"] == \
        ahead["host"]                                            # each device holds its share
    config = get_config("lra-listops-small", batch_size=1_000_000, prefetch=8)
    floor = step_floor_bytes(config)
    card = floor["device"] + floor["prefetched"] // 2            # the step fits, its prefetched batches do not
    check_fits(config.replace(prefetch=0), host=64 * GIB, device=card)
    with pytest.raises(ValueError, match=r"and 8 batches prefetched\), the accelerator's memory"):
        check_fits(config, host=64 * GIB, device=card)


def test_check_fits_counts_activations_where_the_step_runs():
    config = get_config("lra-listops-small", batch_size=1_000_000)   # ~20 GiB of activations
    floor = step_floor_bytes(config)
    assert 16 * GIB < floor["device"] < 64 * GIB and floor["host"] < GIB
    with pytest.raises(ValueError, match=r"^batch_size=1000000 cannot fit: .* this machine's memory is 8\.0 GiB"):
        check_fits(config, host=8 * GIB, device=None)          # a CPU step: all on the host
    check_fits(config, host=8 * GIB, device=80 * GIB)          # an 80 GiB card holds it
    with pytest.raises(ValueError, match="the accelerator's memory is 16.0 GiB"):
        check_fits(config, host=8 * GIB, device=16 * GIB)
    check_fits(get_config("lra-listops-small"), host=8 * GIB, device=None)


def test_flurka_train_refuses_a_batch_that_cannot_fit(tmp_path):
    code, out, err = flurka(["train", "--benchmark", "lra-listops-small", "--set", "batch_size=100000000",
                             "--workdir", str(tmp_path / "run")], tmp_path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(
        "flurka train: error: batch_size=100000000 cannot fit: one lra-listops-small training step "
        "needs at least "), err
    assert list(tmp_path.iterdir()) == []
