"""Mixed-precision training (``compute_dtype="bfloat16"``): bf16 products, float32 masters."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from training_helpers import tiny

from flurka.hlo import dot_flops_by_type
from flurka.configs.base import validate
from flurka.training import run
from flurka.training.loop import _device_batch, load_dataset, make_phase
from flurka.training.optimizer import make_optimizer
from flurka.training.tasks import make_task


def _train_step_dots(config) -> tuple[dict[str, int], dict]:
    """Dot FLOPs by operand type of the compiled train step's HLO, and the step's output."""
    dataset = load_dataset(config)
    task, tx = make_task(config), make_optimizer(config)
    phase = make_phase(config, dataset.info, config.model.attention, task, tx, mesh=None)
    batch = _device_batch(dataset.train_batch(0, config.batch_size))
    args = (phase.params, phase.other, phase.opt_state, batch, jax.random.key(0))
    hlo = phase.train_step.lower(*args).as_text(dialect="hlo")
    return dot_flops_by_type(hlo), phase.train_step(*args)


@pytest.mark.parametrize("benchmark,attention", [
    ("lra-listops-small", "flurka-performer"),   # classifier
    ("mlm-small", "performer"),                  # MLM, tied output projection
    ("lra-image-small", "linformer"),            # ViT: float pixels cast too
    ("nmt-small", "flurka-rnn"),                 # encoder-decoder
])
def test_bf16_step_runs_its_products_in_bf16(benchmark, attention):
    """No product of the bf16 step (forward, backward) takes two float32 operands; the only mixed
    ones are inside jax.nn.dot_product_attention's XLA softmax (the decoder's attention), whose
    weights it keeps in float32. The parameters and their update stay float32, and the first loss
    matches the float32 step's to bf16 rounding."""
    exact, f32_out = _train_step_dots(tiny(benchmark, model=dict(attention=attention)))
    dots, out = _train_step_dots(tiny(benchmark, compute_dtype="bfloat16", model=dict(attention=attention)))
    assert set(exact) == {"f32"}
    assert "f32" not in dots and dots["bf16"] > 0, dots
    if benchmark != "nmt-small":
        assert set(dots) == {"bf16"}, dots
    else:
        assert dots.get("bf16×f32", 0) < 0.2 * sum(dots.values()), dots
    params = out[0]
    assert {str(v.dtype) for v in params.values()} == {"float32"}
    assert float(out[3]["loss"]) == pytest.approx(float(f32_out[3]["loss"]), rel=1e-2)


def test_bf16_training_tracks_float32():
    """30 steps on ListOps: the bf16 run's loss curve within 2 % of the float32 run's (measured:
    0.3 %), same final eval to 1 %."""
    results = {dt: run(tiny("lra-listops-small", compute_dtype=dt, steps=30, model=dict(attention="flurka-rnn")))
               for dt in ("float32", "bfloat16")}
    assert all(r["status"] == "ok" for r in results.values())
    a, b = (np.array([h["loss"] for h in results[dt]["history"]]) for dt in ("float32", "bfloat16"))
    assert a.shape == b.shape and np.all(np.isfinite(b))
    assert np.max(np.abs(b - a) / a) < 2e-2
    assert results["bfloat16"]["final_metrics"]["loss"] == pytest.approx(
        results["float32"]["final_metrics"]["loss"], rel=1e-2)
    assert results["bfloat16"]["config"]["compute_dtype"] == "bfloat16"


def test_unknown_compute_dtype_is_one_line():
    with pytest.raises(ValueError, match="unknown compute_dtype 'float16'; valid: float32, bfloat16"):
        validate(tiny("lra-listops-small", compute_dtype="float16"))
