"""The eval curve (issue 59): evaluations before the last on ``curve_batches`` batches without
decoding, so MLflow draws a curve for little; they never change training, and never stand in for a
run's final metrics."""

from __future__ import annotations

import numpy as np
from training_helpers import tiny

from flurka.configs.base import CURVE_POINT
from flurka.configs.overrides import nested
from flurka.training import run


def _run(**overrides):
    config = tiny("nmt-small", **nested(dict(steps=6, eval_batches=3, bleu_batches=1, log_every=2, prefetch=0,
                                             model=dict(attention="linformer", num_decoder_layers=1, dropout_rate=0.0)),
                                        overrides))
    return run(config)


def test_curve_points_are_cheap_and_leave_the_run_as_it_was():
    plain = _run(eval_every=0)
    curve = _run(eval_every=2, curve_batches=1)
    # training is the same: evaluating reads the model, it does not draw from training's keys
    assert [h["loss"] for h in curve["history"]] == [h["loss"] for h in plain["history"]]
    points = [e for e in curve["eval_history"] if e.get(CURVE_POINT)]
    assert [e["step"] for e in points] == [2, 4]
    assert all("bleu" not in e and "exact_match" not in e and np.isfinite(e["loss"]) for e in points)
    (last,) = [e for e in curve["eval_history"] if not e.get(CURVE_POINT)]
    assert last["step"] == 6 and "bleu" in last
    # the final metrics are the last full evaluation's, equal to the run without a curve
    assert curve["final_metrics"] == plain["final_metrics"]
    assert CURVE_POINT not in curve["final_metrics"]


def test_a_curve_point_evaluates_its_first_batches():
    """A point on 1 batch is not the 3-batch evaluation: without curve_batches every evaluation
    before the last is the whole evaluation, BLEU included (as before)."""
    full = _run(eval_every=2)
    cheap = _run(eval_every=2, curve_batches=1)
    at2 = {e["step"]: e for e in full["eval_history"]}[2]
    assert "bleu" in at2 and not at2.get(CURVE_POINT)
    cheap2 = {e["step"]: e for e in cheap["eval_history"]}[2]
    assert cheap2["loss"] != at2["loss"]
