"""Schedules against their formulas, written independently in float64 NumPy."""

import numpy as np
import pytest

from flurka.training import schedules


def _eval(schedule, steps):
    return np.array([float(schedule(c)) for c in steps])


def ref_linear(c, lr, w, t):
    c = np.asarray(c, np.float64)
    up = lr * c / w if w else np.full_like(c, lr)
    down = lr * np.clip(1 - (c - w) / (t - w), 0, 1)
    return np.where(c < w, up, down)


def ref_cosine(c, lr, w, t):
    c = np.asarray(c, np.float64)
    up = lr * c / w
    frac = np.clip((c - w) / (t - w), 0, 1)
    return np.where(c < w, up, 0.5 * lr * (1 + np.cos(np.pi * frac)))


def ref_inverse_sqrt(c, lr, w, d):
    t = np.asarray(c, np.float64) + 1
    return lr * d ** -0.5 * np.minimum(t ** -0.5, t * w ** -1.5)


@pytest.mark.parametrize("lr,w,t", [(1e-4, 1000, 50_000), (2e-4, 80, 1000), (1e-3, 0, 300)])
def test_linear_decay_with_warmup(lr, w, t):
    steps = np.unique(np.r_[0, 1, w // 2, max(w - 1, 0), w, w + 1, (w + t) // 2, t - 1, t, t + 10])
    got = _eval(schedules.linear(lr, w, t), steps)
    np.testing.assert_allclose(got, ref_linear(steps, lr, w, t), rtol=1e-5, atol=lr * 1e-6)  # float32 counts
    assert got[-1] == 0.0                                    # decays to exactly zero and stays


def test_linear_peak_is_lr_at_end_of_warmup():
    s = schedules.linear(3e-4, 100, 1000)
    assert float(s(100)) == pytest.approx(3e-4, rel=1e-6)
    assert float(s(0)) == 0.0


@pytest.mark.parametrize("lr,w,t", [(1e-3, 500, 10_000), (1e-3, 5, 50)])
def test_cosine_with_warmup(lr, w, t):
    steps = np.unique(np.r_[0, 1, w - 1, w, w + 1, (w + t) // 2, t - 1, t])
    got = _eval(schedules.cosine(lr, w, t), steps)
    np.testing.assert_allclose(got, ref_cosine(steps, lr, w, t), rtol=1e-5, atol=lr * 1e-6)
    if (t - w) % 2 == 0:                                     # half-way through the decay: lr / 2
        assert float(schedules.cosine(lr, w, t)(w + (t - w) // 2)) == pytest.approx(lr / 2, rel=1e-4)


@pytest.mark.parametrize("lr,w,d", [(1.0, 4000, 768), (1.0, 4000, 512), (2.0, 10, 64)])
def test_inverse_sqrt_is_noam(lr, w, d):
    steps = np.array([0, 1, w // 2, w - 2, w - 1, w, 2 * w, 10 * w, 128_000])
    got = _eval(schedules.inverse_sqrt(lr, w, d), steps)
    np.testing.assert_allclose(got, ref_inverse_sqrt(steps, lr, w, d), rtol=1e-5)
    # peak at t = warmup (count = warmup - 1): lr · d^-0.5 · w^-0.5
    assert got.max() == pytest.approx(lr * d ** -0.5 * w ** -0.5, rel=1e-5)
    assert np.argmax(got) == list(steps).index(w - 1)


def test_make_schedule_dispatch_and_unknown():
    s = schedules.make_schedule("constant", lr=0.1, warmup=10, steps=100, d_model=8)
    np.testing.assert_allclose(_eval(s, [0, 5, 10, 99]), [0.0, 0.05, 0.1, 0.1], rtol=1e-6)
    with pytest.raises(ValueError, match="valid: linear, cosine, inverse_sqrt, constant"):
        schedules.make_schedule("step", lr=1.0, warmup=0, steps=10, d_model=8)
