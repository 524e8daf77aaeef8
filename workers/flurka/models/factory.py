"""``build_model(info, model_config)``: the one place a data set's task picks the architecture.

``info`` is a ``flurka.data.DatasetInfo`` (or anything with the same attributes); ``model_config``
a mapping or attribute object (dict, dataclass, ConfigDict) holding the keys in
``MODEL_CONFIG_KEYS``: the fields of :class:`~flurka.configs.model.ModelConfig` and ``seed``;
or a ``ModelConfig`` itself, used as it is (seed 0 where ``rngs`` is not given).
Only ``attention`` is required. Unknown keys are an error (typos would otherwise silently fall
back to defaults).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flax import nnx

from flurka.models.checks import check_choice
from flurka.models.classifier import EncoderClassifier
from flurka.configs.model import ModelConfig
from flurka.models.mlm import MLMEncoder
from flurka.models.seq2seq import Seq2Seq
from flurka.models.vit import ViT

TASKS = ("classification", "regression", "mlm", "translation", "image")

# key -> default: ModelConfig's fields ("attention" required; "pooling" None: for a classifier
# "cls" if the data has a [CLS] id, else "mean"), and the seed of the parameter init (and of the
# dropout stream) when rngs is not given.
MODEL_CONFIG_KEYS: dict[str, Any] = {**dataclasses.asdict(ModelConfig("full")), "attention": None, "seed": 0}


def config_dict(model_config: Any) -> dict[str, Any]:
    if isinstance(model_config, Mapping):
        cfg = dict(model_config)
    elif dataclasses.is_dataclass(model_config):
        cfg = dataclasses.asdict(model_config)
    elif hasattr(model_config, "to_dict"):
        cfg = dict(model_config.to_dict())
    else:
        cfg = dict(vars(model_config))
    unknown = sorted(set(cfg) - set(MODEL_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown model_config key(s) {unknown}; valid: {sorted(MODEL_CONFIG_KEYS)}")
    if cfg.get("attention") is None:
        raise ValueError("model_config needs 'attention' (a name in flurka.attention.MECHANISMS)")
    return {**MODEL_CONFIG_KEYS, **cfg}


def build_model(info: Any, model_config: Any, *, rngs: nnx.Rngs | None = None) -> nnx.Module:
    """The model for ``info.task`` with the configured attention mechanism."""
    if isinstance(model_config, ModelConfig):
        config, seed = model_config, MODEL_CONFIG_KEYS["seed"]
    else:
        c = config_dict(model_config)
        config, seed = ModelConfig(**{k: v for k, v in c.items() if k != "seed"}), c["seed"]
    task = check_choice("task", getattr(info, "task", None), TASKS)
    if rngs is None:
        rngs = nnx.Rngs(params=seed, dropout=seed + 1)
    if task in ("classification", "regression"):
        if config.pooling is None:
            config = config.replace(pooling="cls" if getattr(info, "cls_id", None) is not None else "mean")
        return EncoderClassifier(config, vocab_size=info.vocab_size,
                                 num_classes=1 if task == "regression" else info.num_classes,
                                 max_len=info.max_len, pair=getattr(info, "pair", None), rngs=rngs)
    if task == "mlm":
        return MLMEncoder(config, vocab_size=info.vocab_size, max_len=info.max_len, rngs=rngs)
    if task == "translation":
        return Seq2Seq(config, vocab_size=info.vocab_size, target_vocab_size=info.target_vocab_size,
                       max_len=info.max_len, target_max_len=info.target_max_len, rngs=rngs)
    return ViT(config, image_shape=tuple(info.image_shape), num_classes=info.num_classes, rngs=rngs)
