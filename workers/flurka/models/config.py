"""``ModelConfig``: the architecture's hyperparameters, one frozen object passed whole to every
module that builds a part of the model (as Flax's ``examples/wmt`` passes its
``TransformerConfig``), so each is named once instead of re-passed through every constructor.

What the data decides — vocabulary sizes, sequence lengths, classes, the image's shape, whether
examples are pairs — stays a constructor argument of the model that needs it. A module that
builds a differently shaped part (the T2T stem's blocks, the decoder's depth) passes
``config.replace(...)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from flurka.catalogue.mechanisms import MECHANISMS
from flurka.models.checks import check_choice, check_positive_int

POOLINGS = ("cls", "mean")
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
        check_choice("attention mechanism", self.attention, MECHANISMS)
        for name in ("d_model", "num_heads", "num_layers", "d_ff"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        if self.pooling is not None:
            check_choice("pooling", self.pooling, POOLINGS)
        object.__setattr__(self, "attention_options", dict(self.attention_options or {}))

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)
