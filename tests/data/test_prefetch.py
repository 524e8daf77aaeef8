"""Prefetching (issue 57): batches built ahead on worker threads are the serial loop's batches,
after a resume too; a producer's exception reaches the consumer with its message; no thread or
process outlives the iterator, a run, an exception or a stop."""

import multiprocessing
import threading
import time

import numpy as np
import pytest

from flurka.data import get_dataset
from flurka.data.prefetch import Prefetcher

STEPS = 20


def _prefetch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("flurka-prefetch")]


def _children() -> list:
    import psutil

    return multiprocessing.active_children() + psutil.Process().children(recursive=True)


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(x[k], y[k]), f"step {i}: {k} differs"


@pytest.fixture(scope="module")
def digits():
    return get_dataset("lra-image-small", seed=0)


@pytest.fixture(scope="module")
def small_sets():
    # no per-batch randomness / BERT masking drawn per batch from (seed, step)
    return {name: get_dataset(name, seed=3) for name in ("lra-image-small", "mlm-small")}


@pytest.mark.parametrize("name", ["lra-image-small", "mlm-small"])
def test_prefetched_batches_are_the_serial_ones_and_resume_replays_them(small_sets, name):
    ds = small_sets[name]
    before = _children()
    with ds.train_batches(16, prefetch=0) as it:
        serial = [next(it) for _ in range(STEPS)]
    with ds.train_batches(16, prefetch=4) as it:      # up to 2 threads here, completing out of order
        ahead = [next(it) for _ in range(STEPS)]
    _assert_same(ahead, serial)
    if name == "mlm-small":   # the masking really differs from step to step
        assert not np.array_equal(serial[0]["weights"], serial[1]["weights"])
    k = 7                     # a resume at step k (the checkpoint's) replays the stream from k on
    with ds.train_batches(16, start_step=k, prefetch=3) as it:
        resumed = [next(it) for _ in range(STEPS - k)]
    _assert_same(resumed, serial[k:])
    assert _prefetch_threads() == [] and _children() == before


def test_order_is_the_step_order_whatever_finishes_first_and_the_end_joins_the_threads():
    def slow_early(k):
        time.sleep(0.02 * ((7 - k) % 4))   # later steps often finish first
        return k

    it = Prefetcher(slow_early, start=2, stop=12, depth=6, workers=4)
    assert list(it) == list(range(2, 12))
    assert _prefetch_threads() == []   # the stream's end joins its threads


def test_a_producer_exception_reaches_the_consumer_with_its_message():
    def build(k):
        if k == 5:
            raise ValueError(f"record 1234 of batch {k} is corrupt")
        return k

    it = Prefetcher(build, depth=3, workers=2)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]   # the steps before it arrive
    with pytest.raises(ValueError, match="record 1234 of batch 5 is corrupt"):
        next(it)
    assert _prefetch_threads() == []                          # and it has shut itself down
    with pytest.raises(StopIteration):
        next(it)


def test_close_joins_the_threads_even_mid_stream():
    it = Prefetcher(lambda k: time.sleep(0.05) or k, depth=8, workers=2)
    assert next(it) == 0 and _prefetch_threads()
    it.close()
    assert _prefetch_threads() == []
    it.close()   # idempotent


def test_the_config_bounds_prefetch_in_one_line():
    from training_helpers import tiny

    for bad in (-1, 65, 2.0, True):
        with pytest.raises(ValueError) as err:
            tiny(prefetch=bad)
        assert "prefetch" in str(err.value) and "\n" not in str(err.value)
    assert tiny(prefetch=0).prefetch == 0 and tiny().prefetch == 2


def test_a_run_with_prefetch_is_the_run_without(digits):
    """Same losses step by step (dropout on), and no thread left behind."""
    from training_helpers import tiny

    from flurka.training import run

    base = tiny(steps=4, model=dict(attention="linformer"))
    plain = run(base.replace(prefetch=0), dataset=digits)
    ahead = run(base.replace(prefetch=3), dataset=digits)
    assert [h["loss"] for h in ahead["history"]] == [h["loss"] for h in plain["history"]]
    assert ahead["final_metrics"] == plain["final_metrics"]
    assert _prefetch_threads() == []


def test_a_failing_producer_or_a_stop_ends_the_run_without_leftovers(digits, tmp_path):
    from training_helpers import tiny

    from flurka.data.core import Dataset
    from flurka.training import run
    from flurka.training.loop import Stopped

    class Broken(Dataset):
        def train_batch(self, step, batch_size):
            if step == 3:
                raise RuntimeError(f"cannot decode example 17 of step {step}")
            return super().train_batch(step, batch_size)

    broken = Broken(digits.info, digits.train, digits.eval, seed=0)
    before = _children()
    config = tiny(steps=6, prefetch=2, model=dict(attention="linformer"))
    with pytest.raises(RuntimeError, match="cannot decode example 17 of step 3"):
        run(config, dataset=broken)
    assert _prefetch_threads() == [] and _children() == before

    stop = threading.Event()

    def set_stop(kind, entry):
        if kind == "train" and entry["step"] == 2:
            stop.set()

    with pytest.raises(Stopped):
        run(config.replace(workdir=str(tmp_path / "w"), checkpoint_every=6), dataset=digits,
            callback=set_stop, stop=stop)
    assert _prefetch_threads() == [] and _children() == before
