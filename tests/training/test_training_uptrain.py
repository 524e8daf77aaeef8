"""Up-training (paper §4.2): the α switch carries every shared parameter and its optimizer state;
α = 0 / 1 are plain FLuRKA / plain base; forking from a base checkpoint ≡ uninterrupted."""

import jax
import numpy as np
import pytest
from training_helpers import tiny

from flurka.training import flops as flops_lib
from flurka.training import loop, run, uptrain
from flurka.training.optimizer import make_optimizer
from flurka.training.tasks import make_task


def _train_phase(config, info, attention, batches, steps):
    phase = loop.make_phase(config, info, attention, make_task(config), make_optimizer(config))
    for i in range(steps):
        phase.params, phase.other, phase.opt_state, _ = phase.train_step(
            phase.params, phase.other, phase.opt_state, loop._device_batch(next(batches)), jax.random.key(i))
    return phase


@pytest.mark.parametrize("variant,base,new_prefix", [
    ("flurka-performer", "low-rank", None),          # Linformer -> FLuRKA: E1/E2 carried too
    ("flurka-performer", "kernel", "seq_proj"),      # Performer -> FLuRKA: only E1/E2 are new
])
def test_switch_carries_shared_parameters_and_optimizer_state(digits, variant, base, new_prefix):
    config = tiny(base=base, alpha=0.5, model=dict(attention=variant))
    base_mech = uptrain.phases(config)[0][0]
    assert base_mech == ("linformer" if base == "low-rank" else "performer")
    src = _train_phase(config, digits.info, base_mech, digits.train_batches(8), 3)
    fresh = loop.make_phase(config, digits.info, variant, make_task(config), make_optimizer(config))
    carried, report = uptrain.switch(src.state(), fresh.state())

    shared = set(src.params) & set(fresh.params)
    assert set(report["copied"]) == shared and shared
    for name in shared:                               # identical across the switch, bit for bit
        np.testing.assert_array_equal(carried["params"][name], src.params[name])
    for name in report["new"]:                        # only parameters new to the variant are fresh
        assert new_prefix is not None and f"/{new_prefix}/" in f"/{name}/", name
        np.testing.assert_array_equal(carried["params"][name], fresh.params[name])
    if new_prefix is None:
        assert report["new"] == []
    for name in set(src.other) & set(fresh.other):     # e.g. the kernel's random features
        if src.other[name].shape == fresh.other[name].shape:
            np.testing.assert_array_equal(carried["other"][name], src.other[name])
    # AdamW moments and the step counter carry over; new parameters start with zero moments
    flat_src = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(src.opt_state)[0]}
    flat_new = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(carried["opt_state"])[0]}
    counts = [k for k in flat_new if k.endswith(".count")]
    assert counts and all(int(flat_new[k]) == 3 for k in counts)
    for key, value in flat_new.items():
        if any(f"'{n}'" in key for n in shared):
            np.testing.assert_array_equal(value, flat_src[key])
        elif any(f"'{n}'" in key for n in report["new"]):
            assert not np.any(np.asarray(value)), key


def test_alpha_zero_and_one_are_plain_runs(digits):
    config = tiny(base="kernel", steps=6, eval_every=3, model=dict(attention="flurka-rnn"))
    plain_variant = run(config, dataset=digits)
    plain_base = run(config.replace(model=dict(attention="rnn")), dataset=digits)
    a0 = run(config.replace(alpha=0.0), dataset=digits)
    a1 = run(config.replace(alpha=1.0), dataset=digits)
    for got, want in ((a0, plain_variant), (a1, plain_base)):
        assert got["history"] == want["history"]
        assert got["eval_history"] == want["eval_history"] and got["switches"] == []
    assert a1["history"][0]["attention"] == "rnn" and a0["history"][0]["attention"] == "flurka-rnn"


def test_fork_from_base_checkpoint_equals_uninterrupted(tmp_path, digits):
    config = tiny(alpha=0.5, steps=8, eval_every=4, model=dict(attention="flurka-performer"))
    uninterrupted = run(config, dataset=digits)
    assert [s["step"] for s in uninterrupted["switches"]] == [4]
    assert {h["attention"] for h in uninterrupted["history"][:4]} == {"linformer"}
    assert {h["attention"] for h in uninterrupted["history"][4:]} == {"flurka-performer"}

    base_run = config.replace(alpha=0.0, workdir=str(tmp_path / "base"), checkpoint_every=4, model=dict(attention="linformer"))
    run(base_run, dataset=digits)
    forked = run(config.replace(base_checkpoint=str(tmp_path / "base" / "checkpoints")), dataset=digits)
    for key in ("status", "history", "eval_history", "final_metrics", "train_flops", "switches", "steps"):
        assert forked[key] == uninterrupted[key], key

    with pytest.raises(ValueError, match="trained with different learning_rate"):
        run(config.replace(learning_rate=5e-3, base_checkpoint=str(tmp_path / "base" / "checkpoints")),
            dataset=digits)
    with pytest.raises(ValueError, match=r"no checkpoint for step 2 .* available: \[4, 8\]"):
        run(config.replace(alpha=0.25, base_checkpoint=str(tmp_path / "base" / "checkpoints")), dataset=digits)


class _Stop(Exception):
    pass


def test_resume_inside_the_handover_equals_uninterrupted(tmp_path, digits):
    # same program as the fork test above (compiled steps are shared when run together)
    config = tiny(alpha=0.5, steps=8, eval_every=4, model=dict(attention="flurka-performer"))
    h = uptrain.handover_steps(config)                # capped at half of the 4 variant steps
    assert h == 2 and [s.handover_from for s in uptrain.stages(config)] == [None, "linformer", None]
    uninterrupted = run(config, dataset=digits)
    assert uninterrupted["switches"][0]["handover"] == {
        "steps": 2, "first_step": 5, "last_step": 6, "from": "linformer", "shape": "ease-out",
        "beta_first": pytest.approx(5 / 9), "beta_last": pytest.approx(8 / 9)}   # 1 − (1 − j/3)²
    betas = [h.get("handover_beta") for h in uninterrupted["history"]]
    assert betas == [None] * 4 + [pytest.approx(5 / 9), pytest.approx(8 / 9), None, None]
    # FLOPs: a hand-over step counts both attention mechanisms (an upper bound)
    flops = [h["train_flops"] for h in uninterrupted["history"]]
    per_step = np.diff([0] + flops)
    batch = next(digits.train_batches(config.batch_size))
    shapes = {k: v.shape for k, v in batch.items()}
    lin, var, both = (flops_lib.train_step_flops(config, digits.info, shapes, attention=a, handover_from=f)
                      for a, f in (("linformer", None), ("flurka-performer", None),
                                   ("flurka-performer", "linformer")))
    assert per_step.tolist() == [lin] * 4 + [both] * 2 + [var] * 2 and both > max(lin, var)

    def stop_at_6(kind, entry):
        if kind == "train" and entry["step"] == 6:
            raise _Stop

    ckpt = config.replace(workdir=str(tmp_path / "run"), checkpoint_every=5)   # step 5: mid-hand-over
    with pytest.raises(_Stop):
        run(ckpt, dataset=digits, callback=stop_at_6)
    resumed = run(ckpt, dataset=digits)
    for key in ("history", "eval_history", "final_metrics", "train_flops", "switches"):
        assert resumed[key] == uninterrupted[key], key
