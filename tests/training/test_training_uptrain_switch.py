"""Spec (paper §4.2, up-training): at the α switch the loss does not jump by more than the noise
of the base run — the blended hand-over (flurka.attention.handover) — and the hand-over layer is
exactly the base at β = 0 and exactly the variant at β = 1, from the same parameters.

The switch test uses an lra-image-small-like model (d_model 64, 1 layer, batch 32; Linformer
base for 30 of 60 steps, then flurka-performer), a config where the abrupt switch really jumps
(Linformer-compressed keys sit at a logit scale where FAVOR+ with 32 features is far off softmax;
the slow negative control checks the jump). The base run is shared (module fixture, forked from
its checkpoint at the switch, as sweeps do); each branch stops 5 steps after the switch. The
window is the spec's; it does not cover the end of the ramp, where the loss of a short hand-over
climbs towards the variant's own level (see flurka.training.uptrain): on this config the 5-step
mean peaks at 2.33 (ease-out) / 2.42 (linear) near the end of the 15-step ramp, above the bound
1.89 — the spec's intent is not met by a short hand-over, and this test does not claim it is.

Noise σ: the standard deviation of the first differences of the last 20 base-step losses, / √2.
The loss still trends down there, and the plain std of the levels counts that trend as noise
(0.25 vs 0.11 on this config, a looser bound); differencing removes a linear trend, and for
independent step noise of std σ, L_t − L_{t−1} has std σ√2.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flurka.attention import make_attention
from flurka.configs import get_config
from flurka.training import run, uptrain
from flurka.training import state as state_lib

AFTER = 5          # steps after the switch that must stay within the base run's noise
WINDOW = 20        # base steps the noise is measured on
# The paper's Gaussian E: there the switch from Linformer to FLuRKA-Performer jumps (the negative
# control below); with pooled E (the default) it barely does, and the hand-over has less to do.
SPEC = dict(base="low-rank", alpha=0.5, steps=60, batch_size=32, log_every=1, eval_every=0, eval_batches=1,
            model=dict(attention="flurka-performer", num_layers=1, attention_options={"e_init": "gaussian"}))


class Stop(Exception):
    pass


def _losses(config, stop, dataset):
    """{step: entry} of the train entries a run emits, stopping it after step ``stop``."""
    out = {}

    def callback(kind, entry):
        if kind == "train":
            out[entry["step"]] = entry
            if entry["step"] >= stop:
                raise Stop

    with pytest.raises(Stop):
        run(config, dataset=dataset, callback=callback)
    return out


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, digits):
    config = get_config("lra-image-small", **SPEC)
    s = config.switch_step
    workdir = tmp_path_factory.mktemp("uptrain_switch") / "base"
    base = config.replace(alpha=0.0, workdir=str(workdir), checkpoint_every=s, model=dict(attention="linformer"))
    entries = _losses(base, s + 1, digits)       # the checkpoint at s is written before step s+1
    losses = np.array([entries[k]["loss"] for k in range(s - WINDOW + 1, s + 1)])
    sigma = float(np.std(np.diff(losses), ddof=1) / np.sqrt(2))
    return config, str(workdir / "checkpoints"), float(losses[-10:].mean()), sigma


def _after_switch(base_run, digits, handover_steps):
    config, ckpt, _, _ = base_run
    s = config.switch_step
    entries = _losses(config.replace(base_checkpoint=ckpt, handover_steps=handover_steps),
                      s + AFTER, digits)
    return [entries[k] for k in range(s + 1, s + AFTER + 1)]


def test_handover_keeps_the_loss_within_the_base_noise(base_run, digits):
    config, _, before, sigma = base_run
    after = _after_switch(base_run, digits, config.handover_steps)
    mean = float(np.mean([e["loss"] for e in after]))
    assert mean <= before + 3 * sigma, (mean, before, sigma)
    # the hand-over steps are recorded with their β = ramp(j / (H + 1)), H capped at half the
    # variant's steps; the default ramp is ease-out, 1 − (1 − t)²
    h = min(config.handover_steps, (config.steps - config.switch_step) // 2)
    assert h == uptrain.handover_steps(config) and h >= AFTER and config.handover_shape == "ease-out"
    assert [e["handover_beta"] for e in after] == pytest.approx(
        [1 - (1 - j / (h + 1)) ** 2 for j in range(1, AFTER + 1)])
    assert {e["attention"] for e in after} == {"flurka-performer"}


@pytest.mark.slow
def test_abrupt_switch_breaks_the_same_bound(base_run, digits):
    """Negative control: on this config the abrupt switch (handover_steps=0) does jump, so the
    test above can fail."""
    _, _, before, sigma = base_run
    after = _after_switch(base_run, digits, 0)
    mean = float(np.mean([e["loss"] for e in after]))
    assert mean > before + 3 * sigma, (mean, before, sigma)
    assert all("handover_beta" not in e for e in after)


# ---------------------------------------------------------------------------------------------
# The hand-over layer itself: β = 0 is the base, β = 1 the variant, same parameters and paths
# ---------------------------------------------------------------------------------------------
PAIRS = [("flurka-performer", "linformer"), ("flurka-performer", "performer"),
         ("flurka-rnn", "linformer"), ("flurka-rnn", "rnn"),
         ("flurka-eva", "eva")]
DIMS = dict(d_model=16, num_heads=2, max_len=16, d_k=8, num_features=8)


def _layer(mechanism, seed, **extra):
    eva = dict(window_size=4, chunk_size=4) if mechanism.endswith("eva") else {}
    return make_attention(mechanism, rngs=nnx.Rngs(seed), **DIMS, **eva, **extra)


@pytest.mark.parametrize("variant,base", PAIRS)
def test_handover_layer_is_base_at_zero_and_variant_at_one(variant, base):
    x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    mask = jnp.arange(16)[None, :] < jnp.array([[16], [11]])
    base_layer = _layer(base, 1)
    if base == "eva":
        base_layer.eval()                       # the hand-over's EVA branch uses ω = μ
    plain = _layer(variant, 2)
    handover = _layer(variant, 3, handover_from=base)
    _, base_p, base_o = state_lib.split(base_layer)
    _, plain_p, plain_o = state_lib.split(plain)
    parts, p, o = state_lib.split(handover)
    assert set(p) == set(plain_p)                               # the variant's parameter paths
    assert set(o) - set(plain_o) == {"handover_beta"}           # plus β, outside the parameters
    carried, report = uptrain.switch({"params": base_p, "other": base_o, "opt_state": {}},
                                     {"params": p, "other": o, "opt_state": {}})
    p, o = carried["params"], carried["other"]
    assert set(base_p) <= set(report["copied"])                 # every base parameter is shared
    plain_parts, _, _ = state_lib.split(plain)
    base_parts, _, _ = state_lib.split(base_layer)
    call = jax.jit(lambda parts, p, o: parts.merge(p, o)(x, mask), static_argnums=0)
    at = lambda beta: call(parts, p, uptrain.set_beta(o, beta))   # noqa: E731  (β traced: one compile)
    np.testing.assert_allclose(at(0.0), call(base_parts, base_p, base_o), rtol=1e-5, atol=1e-6)
    same = call(plain_parts, p, {k: o[k] for k in plain_o})
    np.testing.assert_allclose(at(1.0), same, rtol=1e-5, atol=1e-6)
    mid = at(0.25)                                              # linear in β (W_O is affine)
    np.testing.assert_allclose(mid, 0.75 * at(0.0) + 0.25 * at(1.0), rtol=1e-4, atol=1e-5)


def test_ramp_shapes():
    config = get_config("lra-image-small", alpha=0.5, steps=100, handover_steps=4, handover_shape="linear",
                        model=dict(attention="flurka-rnn"))
    s = config.switch_step
    linear = [uptrain.handover_beta(config, k) for k in range(s - 1, s + 5)]
    assert linear == pytest.approx([1.0, 0.2, 0.4, 0.6, 0.8, 1.0])       # 1.0 outside the hand-over
    ease = [uptrain.handover_beta(config.replace(handover_shape="ease-out"), k) for k in range(s, s + 4)]
    assert ease == pytest.approx([1 - 0.8 ** 2, 1 - 0.6 ** 2, 1 - 0.4 ** 2, 1 - 0.2 ** 2])
    assert uptrain.handover_steps(config.replace(handover_steps=80)) == 25   # half the 50 variant steps
    assert uptrain.handover_steps(config.replace(alpha=0.0)) == 0            # no switch, no hand-over
    assert uptrain.handover_steps(config.replace(alpha=1.0)) == 0


def test_handover_options_are_checked():
    with pytest.raises(ValueError, match="handover_from must be one of its up-training bases"):
        _layer("flurka-performer", 0, handover_from="rnn")
    # mechanisms that are not FLuRKA variants ignore it (a T2T stem with another mechanism)
    assert type(_layer("full", 0, handover_from="linformer")).__name__ == "FullAttention"
    with pytest.raises(ValueError, match="handover_steps must be a non-negative int"):
        get_config("lra-image-small", handover_steps=-1)
    with pytest.raises(ValueError, match="unknown handover_shape 'cosine'; valid: linear, ease-out"):
        get_config("lra-image-small", handover_shape="cosine")
