"""``build_model(info, model_config)``: the one place a data set's task picks the architecture.

``info`` is a ``flurka.data.DatasetInfo`` (or anything with the same attributes); ``model_config``
a mapping or attribute object (dict, dataclass, ConfigDict) holding the keys in
``MODEL_CONFIG_KEYS``. Only ``attention`` is required. Unknown keys are an error (typos would
otherwise silently fall back to defaults).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flax import nnx

from flurka.models.checks import check_choice
from flurka.models.classifier import EncoderClassifier
from flurka.models.mlm import MLMEncoder
from flurka.models.seq2seq import Seq2Seq
from flurka.models.vit import T2T_SPLITS, ViT

TASKS = ("classification", "regression", "mlm", "translation", "image")

# key -> default (None: chosen from the data set where noted).
MODEL_CONFIG_KEYS: dict[str, Any] = {
    "attention": None,             # required: a name in flurka.attention.MECHANISMS
    "attention_options": {},       # d_k, num_features, ... -> make_attention
    "d_model": 256,
    "num_heads": 4,
    "num_layers": 2,
    "d_ff": 512,
    "dropout_rate": 0.1,
    "positions": "learned",        # text models: "learned" | "sinusoidal"
    "pooling": None,               # classifier: "cls" if the data has a [CLS] id, else "mean"; ViT: "cls"
    "tie_embeddings": True,        # mlm
    "tie_output": True,            # translation
    "num_decoder_layers": None,    # translation: defaults to num_layers
    "patch_size": 16,              # image
    "t2t": False,                  # image: tokens-to-token stem
    "t2t_splits": T2T_SPLITS,
    "t2t_dim": 64,
    "t2t_attention": None,
    "seed": 0,                     # parameter init (and dropout stream) when rngs is not given
}


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
    c = config_dict(model_config)
    task = check_choice("task", getattr(info, "task", None), TASKS)
    if rngs is None:
        rngs = nnx.Rngs(params=c["seed"], dropout=c["seed"] + 1)
    common = dict(d_model=c["d_model"], num_heads=c["num_heads"], num_layers=c["num_layers"],
                  d_ff=c["d_ff"], attention=c["attention"],
                  attention_options=dict(c["attention_options"] or {}),
                  dropout_rate=c["dropout_rate"], rngs=rngs)
    if task in ("classification", "regression"):
        pooling = c["pooling"] or ("cls" if getattr(info, "cls_id", None) is not None else "mean")
        return EncoderClassifier(vocab_size=info.vocab_size,
                                 num_classes=1 if task == "regression" else info.num_classes,
                                 max_len=info.max_len, pooling=pooling,
                                 pair=getattr(info, "pair", None), positions=c["positions"],
                                 **common)
    if task == "mlm":
        return MLMEncoder(vocab_size=info.vocab_size, max_len=info.max_len,
                          tie_embeddings=c["tie_embeddings"], positions=c["positions"], **common)
    if task == "translation":
        return Seq2Seq(vocab_size=info.vocab_size, target_vocab_size=info.target_vocab_size,
                       max_len=info.max_len, target_max_len=info.target_max_len,
                       num_decoder_layers=c["num_decoder_layers"], tie_output=c["tie_output"],
                       positions=c["positions"], **common)
    return ViT(image_shape=tuple(info.image_shape), num_classes=info.num_classes,
               patch_size=c["patch_size"], t2t=c["t2t"], t2t_splits=c["t2t_splits"],
               t2t_dim=c["t2t_dim"], t2t_attention=c["t2t_attention"],
               pooling=c["pooling"] or "cls", **common)
