"""Models for every benchmark in the paper; each takes the attention mechanism by name.

- ``EncoderClassifier``: LRA and GLUE (CLS or mean pooling; single, "concat" or "two-tower" pairs)
- ``MLMEncoder``: BERT-style masked LM (WikiText-103)
- ``Seq2Seq``: translation, mechanism in the encoder only, greedy and beam decoding
- ``ViT``: image classification, patch or tokens-to-token (T2T-ViT) stem
- ``build_model(info, model_config)``: the factory the training loop calls
- ``ModelConfig``: the architecture's hyperparameters, passed whole to every module

All share ``Encoder`` whose blocks hold the mechanism at ``layers[i].attention``, so parameter
paths match across mechanisms and up-training can copy by path.
"""

from flurka.models.classifier import EncoderClassifier
from flurka.configs.model import ModelConfig
from flurka.models.decoder import Decoder
from flurka.models.embedding import Embedding
from flurka.models.encoder import Encoder, EncoderBlock, masked_mean
from flurka.models.factory import MODEL_CONFIG_KEYS, TASKS, build_model
from flurka.models.mlm import MLMEncoder
from flurka.models.seq2seq import Seq2Seq
from flurka.models.vit import ViT, soft_split

__all__ = [
    "Embedding", "Encoder", "EncoderBlock", "masked_mean", "EncoderClassifier", "MLMEncoder",
    "Decoder", "Seq2Seq", "ViT", "soft_split", "build_model", "MODEL_CONFIG_KEYS", "TASKS",
    "ModelConfig",
]
