"""Timing: sane positive numbers, medians over repeats, random inputs, OOM and errors as results."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flurka.speed import bench, ceilings, timing
from flurka.speed.configs import Point

TINY = dict(seq_len=64, d_model=32, num_heads=4, d_k=16, num_features=8, layers=2, ffn=32,
            dtype="float32", batch=2)


def test_time_fn_jitted_positive_and_ordered():
    a = jnp.ones((64, 64))
    t = timing.time_fn(jax.jit(lambda x: x @ x), (a,), warmup=1, repeats=7)
    assert t["repeats"] == 7 and t["compile_s"] > 0
    assert 0 < t["min_s"] <= t["p10_s"] <= t["median_s"] <= t["p90_s"] < 5


def test_time_fn_reports_the_median_not_the_mean():
    # Every 4th call sleeps 60 ms, the rest 3 ms: the mean is ~17 ms, the median ~3 ms.
    calls = []

    def fn():
        calls.append(None)
        time.sleep(0.060 if len(calls) % 4 == 0 else 0.003)
        return jnp.zeros(())

    t = timing.time_fn(fn, (), warmup=0, repeats=12, per_sample=1)
    assert len(calls) == 12 and t["compile_s"] is None and t["calls_per_sample"] == 1
    assert 0.003 <= t["median_s"] < 0.012
    assert t["p90_s"] >= 0.055  # the slow calls are in the spread, not in the median


def test_time_interleaved_rotates_the_calls_and_survives_a_failure():
    """Side by side: every call once per round, each round starting one place later (none is
    always first); one that fails leaves the others timed; a jitted one is compiled first."""
    order = []

    def call(name, seconds):
        def fn():
            order.append(name)
            time.sleep(seconds)
            return jnp.zeros(())
        return fn

    def broken():
        order.append("broken")
        raise RuntimeError("no kernel for this launch")

    calls = {"a": (call("a", 0.001), ()), "b": (call("b", 0.020), ()), "broken": (broken, ()),
             "jit": (jax.jit(lambda x: x + 1), (jnp.ones(3),))}
    out = timing.time_interleaved(calls, warmup=1, repeats=4, per_sample=1)
    assert order[:3] == ["a", "b", "broken"]                         # round 0 as given
    assert order[3:7] == ["b", "a", "a", "b"]             # rounds 1, 2 start one place later
    assert order.count("broken") == 1 and order.count("a") == order.count("b") == 5
    assert out["broken"]["status"] == "error" and "no kernel" in out["broken"]["error"]
    assert all(out[k]["status"] == "ok" and out[k]["repeats"] == 4 for k in ("a", "b", "jit"))
    assert out["a"]["median_s"] < 0.015 <= out["b"]["median_s"]
    assert out["jit"]["compile_s"] > 0 and out["a"]["compile_s"] is None
    with pytest.raises(ValueError, match="repeats"):
        timing.time_interleaved(calls, warmup=0, repeats=0)


def test_chained_runs_every_step_and_returns_the_last():
    """A chain of a kernel with several results and a None argument (an elu query side's ω):
    the last step's results, worked out in float64 on args[0] with its first element set to
    chain - 1."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))

    def kernel(q, weight, omega, scale):
        assert omega is None
        return q @ weight * scale, jnp.sum(q, axis=0)

    got = timing.chained(kernel, 4)(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32), None, 2.0)
    last = x.copy()
    last[0, 0] = 3.0
    np.testing.assert_allclose(got[0], last @ w * 2.0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], last.sum(axis=0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="chain must be an int >= 1"):
        timing.chained(kernel, 0)


def test_time_fn_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats"):
        timing.time_fn(lambda: jnp.ones(()), (), repeats=0)
    with pytest.raises(ValueError, match="per_sample"):
        timing.time_fn(lambda: jnp.ones(()), (), per_sample=0)
    with pytest.raises(ValueError, match="per_sample"):
        timing.time_interleaved({"a": (lambda: jnp.ones(()), ())}, per_sample=2.5)


class Stream:
    """A device stream as JAX sees one: a call costs the host ``dispatch`` seconds and returns at
    once; its kernel takes ``kernel`` seconds of the device, run in order after the last one;
    blocking on its output waits for that kernel's end."""

    def __init__(self, dispatch: float, kernel: float):
        self.dispatch, self.kernel, self.free_at, self.calls = dispatch, kernel, 0.0, 0

    def __call__(self):
        self.calls += 1
        time.sleep(self.dispatch)
        self.free_at = max(time.perf_counter(), self.free_at) + self.kernel
        return Pending(self.free_at)


class Pending:
    def __init__(self, done_at: float):
        self.done_at = done_at

    def block_until_ready(self):
        time.sleep(max(0.0, self.done_at - time.perf_counter()))
        return self


def test_calls_for_makes_a_sample_last_sample_s():
    s = timing.SAMPLE_S
    assert timing.calls_for(s) == timing.calls_for(10 * s) == 1
    assert timing.calls_for(s / 2.5) == 3 and timing.calls_for(s / 3) == 3
    assert timing.calls_for(1e-9) == timing.calls_for(0.0) == timing.MAX_CALLS


def test_back_to_back_calls_time_the_kernel_not_the_dispatch():
    """A 6 ms kernel behind 3 ms of dispatch: one blocked call a sample reads both (9 ms); eight
    back to back read the kernel (each dispatch hidden behind the last kernel, (3 + 8·6) / 8 ≈
    6.4 ms), as a training loop, which does not block each step, sees it."""
    one = timing.time_fn(Stream(0.003, 0.006), (), warmup=1, repeats=5, per_sample=1)
    stream = Stream(0.003, 0.006)
    eight = timing.time_fn(stream, (), warmup=1, repeats=5, per_sample=8)
    assert one["calls_per_sample"] == 1 and eight["calls_per_sample"] == 8
    assert stream.calls == 1 + 5 * 8
    assert one["median_s"] >= 0.0088
    assert 0.006 <= eight["median_s"] < 0.0075


def test_the_sample_size_follows_the_call(monkeypatch):
    """By default a fast call is timed many to a sample and a slow one alone, each sized from
    its own fastest warm-up call when side by side. A jitted op of microseconds, with a sample
    of a second, gets MAX_CALLS."""
    sized = []

    def calls_for(call_s):
        sized.append(call_s)
        return real(call_s)

    real = timing.calls_for
    monkeypatch.setattr(timing, "calls_for", calls_for)
    monkeypatch.setattr(timing, "SAMPLE_S", 0.2)
    fast, slow = Stream(0.001, 0.002), Stream(0.001, 0.21)
    out = timing.time_interleaved({"fast": (fast, ()), "slow": (slow, ())}, warmup=0, repeats=3)
    assert out["slow"]["calls_per_sample"] == 1 and slow.calls == 1 + 3
    n = out["fast"]["calls_per_sample"]
    assert n == real(min(t for t in sized if t < 0.2)) >= 2 and fast.calls == 1 + 3 * n
    assert out["fast"]["warmup"] == 0 and out["fast"]["repeats"] == 3
    monkeypatch.setattr(timing, "SAMPLE_S", 1.0)
    t = timing.time_fn(jax.jit(lambda x: x + 1), (jnp.ones(4),), warmup=1, repeats=2)
    assert t["calls_per_sample"] == timing.MAX_CALLS


def test_benchmark_inputs_are_random_not_zeros():
    point = Point(mechanism="full", mode="train", scope="layer", **TINY)
    _, args, _, _ = bench.make_step(point, bench.build(point))
    x, y = np.asarray(args[-2]), np.asarray(args[-1])
    for a in (x, y):
        assert a.shape == (2, 64, 32) and np.count_nonzero(a) == a.size
        assert abs(a.mean()) < 0.1 and 0.9 < a.std() < 1.1
    assert not np.allclose(x, y)


def test_xla_resource_exhausted_is_an_oom_result():
    def allocate():  # 4 TiB: XLA's allocator refuses it (RESOURCE_EXHAUSTED), on CPU too
        return {"n": int(jnp.ones((2**40,), jnp.float32).block_until_ready().size)}

    out = timing.time_interleaved({"big": (allocate, ())}, warmup=0, repeats=1)["big"]
    assert out["status"] == "oom" and "RESOURCE_EXHAUSTED" in out["error"]


def test_raised_runtime_error_types():
    oom = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes")
    other = jax.errors.JaxRuntimeError("INVALID_ARGUMENT: bad")
    assert timing.is_oom(oom) and timing.is_oom(MemoryError()) and not timing.is_oom(other)
    assert timing.failure(other)["status"] == "error"
    out = timing.time_interleaved({"z": (lambda: 1 / 0, ())}, warmup=0, repeats=1)["z"]
    assert out["status"] == "error" and out["error_type"] == "ZeroDivisionError"


def test_point_too_large_is_reported_as_oom_not_raised():
    point = Point(mechanism="full", mode="forward", scope="layer", seq_len=512, d_model=512,
                  num_heads=4, d_k=64, dtype="float32", batch=2**22)  # x alone is 4 TiB
    r = bench.run_point(point, None, repeats=1)
    assert r["status"] == "oom" and r["oom_source"] == "xla"
    assert r["mechanism"] == "full" and r["batch"] == 2**22 and r.get("median_s") is None


def test_memory_budget_uses_xla_memory_analysis():
    point = Point(mechanism="rnn", mode="forward", scope="layer", **TINY)
    r = bench.run_point(point, None, repeats=1, memory_budget_bytes=1024)
    assert r["status"] == "oom" and r["oom_source"] == "budget"
    assert r["xla_memory_bytes"] > 1024 and "budget" in r["error"]


def test_ceiling_probes_and_floor():
    c = ceilings.measure(jnp.float32, matmul_n=128, copy_bytes=1 << 20, repeats=3)
    # each timed call chains 10 dependent kernels (amortising dispatch), and counts all of them
    assert c["matmul"]["chain"] == c["copy"]["chain"] == 10
    assert c["matmul"]["flops"] == 10 * 2 * 128**3 and c["matmul_flops_per_s"] > 1e6
    assert c["copy"]["bytes"] == 10 * 2 * (1 << 20) and c["copy_bytes_per_s"] > 1e6
    f = ceilings.floor(2e9, 1e3, c)
    assert f["bound"] == "compute" and f["floor_s"] == pytest.approx(2e9 / c["matmul_flops_per_s"])
    f = ceilings.floor(1.0, 1e9, c)
    assert f["bound"] == "memory" and f["floor_s"] == pytest.approx(1e9 / c["copy_bytes_per_s"])
    assert ceilings.min_bytes(mode="train", param_bytes=10, other_bytes=1, input_bytes=2,
                              output_bytes=0) == 63
