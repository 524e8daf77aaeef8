"""Learning-rate schedules of the paper's Table 6, each with a linear warm-up (optax).

``count`` is optax's step counter: the number of updates already applied (0 for the first).

* ``linear``: 0 → lr over ``warmup`` steps, then linearly to 0 at ``steps`` (LRA, MLM, GLUE);
* ``cosine``: 0 → lr over ``warmup`` steps, then half a cosine to 0 at ``steps`` (ImageNet);
* ``inverse_sqrt``: the Transformer's "noam" rate lr · d_model^-0.5 · min(t^-0.5, t · w^-1.5)
  with t = count + 1 (NMT and the ablations; Table 6's "lr 1" is the factor in front);
* ``constant``: lr after the warm-up (tests and quick experiments).
"""

from __future__ import annotations

import jax.numpy as jnp
import optax


def linear(lr: float, warmup: int, steps: int) -> optax.Schedule:
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup), optax.linear_schedule(lr, 0.0, max(steps - warmup, 1))],
        [warmup])


def cosine(lr: float, warmup: int, steps: int) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), end_value=0.0)


def inverse_sqrt(lr: float, warmup: int, d_model: int) -> optax.Schedule:
    scale = lr * d_model ** -0.5

    def schedule(count):
        t = jnp.asarray(count, jnp.float32) + 1.0
        return scale * jnp.minimum(t ** -0.5, t * warmup ** -1.5)

    return schedule


def constant(lr: float, warmup: int) -> optax.Schedule:
    if warmup == 0:
        return optax.constant_schedule(lr)
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)],
                                [warmup])


def make_schedule(name: str, *, lr: float, warmup: int, steps: int, d_model: int) -> optax.Schedule:
    if name == "linear":
        return linear(lr, warmup, steps)
    if name == "cosine":
        return cosine(lr, warmup, steps)
    if name == "inverse_sqrt":
        return inverse_sqrt(lr, warmup, d_model)
    if name == "constant":
        return constant(lr, warmup)
    raise ValueError(f"unknown schedule {name!r}; valid: linear, cosine, inverse_sqrt, constant")


def from_config(config) -> optax.Schedule:
    return make_schedule(config.schedule, lr=config.learning_rate, warmup=config.warmup_steps,
                         steps=config.steps, d_model=config.model.d_model)
