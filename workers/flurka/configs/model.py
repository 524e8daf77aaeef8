"""``ModelConfig``: the architecture's hyperparameters, one frozen object nested in the training
config (``TrainConfig.model``) and passed whole to every module that builds a part of the model
(as Flax's ``examples/wmt`` passes its ``TransformerConfig``), so each is named once instead of
re-passed through every constructor. Plain Python: the sweep driver reads it without JAX.

What the data decides — vocabulary sizes, sequence lengths, classes, the image's shape, whether
examples are pairs — stays a constructor argument of the model that needs it. A module that
builds a differently shaped part (the T2T stem's blocks, the decoder's depth) passes
``config.replace(...)``.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping, Sequence

from flurka.catalogue.mechanisms import MECHANISMS
from flurka.configs.checks import choice, positive

POOLINGS = ("cls", "mean")
POSITIONS = ("learned", "sinusoidal")
T2T_SPLITS = ((7, 4, 2), (3, 2, 1), (3, 2, 1))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    attention: str                              # a name in flurka.catalogue.mechanisms.MECHANISMS
    attention_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # make_attention's
    d_model: int = 256
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 512
    dropout_rate: float = 0.1
    positions: str = "learned"                  # text models: "learned" | "sinusoidal"
    pooling: str | None = None                  # classifier, ViT: "cls" | "mean" (None: "cls")
    fused_ffn: Any = False                      # True or a fused_ffn.FfnTiling: the FFN as kernels
    remat: bool = False                         # recompute each encoder block in the backward pass
    tie_embeddings: bool = True                 # mlm
    tie_output: bool = True                     # translation
    num_decoder_layers: int | None = None       # translation: defaults to num_layers
    patch_size: int = 16                        # image
    t2t: bool = False                           # image: tokens-to-token stem
    t2t_splits: Sequence[Sequence[int]] = T2T_SPLITS
    t2t_dim: int = 64
    t2t_attention: str | None = None            # the T2T blocks' mechanism (default: attention)

    def __post_init__(self):
        choice("attention mechanism", self.attention, MECHANISMS)
        for name in ("d_model", "num_heads", "num_layers", "d_ff", "patch_size", "t2t_dim"):
            positive(name, getattr(self, name))
        if self.num_decoder_layers is not None:
            positive("num_decoder_layers", self.num_decoder_layers)
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if not (isinstance(self.dropout_rate, numbers.Real) and 0.0 <= self.dropout_rate < 1.0):
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        choice("positions", self.positions, POSITIONS)
        if self.pooling is not None:
            choice("pooling", self.pooling, POOLINGS)
        if self.t2t_attention is not None:
            choice("t2t attention mechanism", self.t2t_attention, MECHANISMS)
        if not isinstance(self.attention_options or {}, Mapping):
            raise ValueError("attention_options must be a mapping such as {'d_k': 16}, "
                             f"got {repr(self.attention_options)[:80]}")
        object.__setattr__(self, "attention_options", dict(self.attention_options or {}))
        # stored as JSON (lists) and read back: one value, one form
        object.__setattr__(self, "t2t_splits", tuple(tuple(s) for s in self.t2t_splits))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig))
