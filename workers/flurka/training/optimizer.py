"""optax AdamW with the config's schedule, optional global-norm clipping, and weight decay on
matrices only (biases, LayerNorm scales and other vectors are not decayed, as in BERT/flax
examples). Parameters are a flat ``{path: array}`` dict (see :mod:`flurka.training.state`), so the
optimizer state's ``mu``/``nu`` are flat dicts with the same keys — what up-training copies."""

from __future__ import annotations

import jax
import optax

from flurka.training import schedules


def decay_mask(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config) -> optax.GradientTransformation:
    schedule = schedules.from_config(config)
    adamw = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay, mask=decay_mask)
    if config.grad_clip:
        return optax.chain(optax.clip_by_global_norm(config.grad_clip), adamw)
    return adamw
