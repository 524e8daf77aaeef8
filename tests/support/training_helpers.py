"""Tiny models on the small offline benchmarks, so loop tests take seconds on a CPU."""

from flurka.configs import get_config
from flurka.configs.overrides import nested

TINY = dict(batch_size=8, steps=8, warmup_steps=2, log_every=1, eval_every=0, eval_batches=2,
            model=dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout_rate=0.1,
                       attention_options={"d_k": 8, "num_features": 8}))


def tiny(benchmark: str = "lra-image-small", **overrides):
    """A small benchmark's config shrunk to a 1-layer, d_model 16 model and 8 steps (``model``
    overrides merged into the tiny model's)."""
    return get_config(benchmark, **nested(TINY, overrides))
