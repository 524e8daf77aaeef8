"""Long Range Arena (paper Table 6, "LRA" rows).

Table 6 fixes batch, lr, linear decay, 2 layers, 2 heads, head dim 64 (d_model 128), FFN 128.
The paper follows Skyformer's LRA setup, so what Table 6 leaves open comes from Skyformer's
``code/config.py`` (pkuzengqi/Skyformer): warm-up steps, 50k training steps, sequence lengths
(ListOps 2000, Text/Retrieval 4000 bytes, Image/Pathfinder 1024 pixels), mean pooling, no
weight decay, dropout 0.1, and 128 for the Linformer length / Performer features.
"""

from __future__ import annotations

from flurka.configs.base import TrainConfig, register
from flurka.configs.model import ModelConfig

_NOTES = ("Table 6 (batch, lr, linear decay, 2 layers, 2 heads, head dim 64, FFN 128); "
          "warm-up, steps, lengths, d_k/features from Skyformer code/config.py")


def _lra(name: str, *, dataset: str, batch: int, lr: float, warmup: int, max_len: int,
         eval_every: int, eval_batches: int) -> TrainConfig:
    return TrainConfig(
        benchmark=name, dataset=dataset, task="classification", metrics=("accuracy",),
        model=ModelConfig("full", attention_options={"d_k": 128, "num_features": 128},
                          d_model=128, num_heads=2, num_layers=2, d_ff=128, dropout_rate=0.1, pooling="mean"),
        max_len=max_len,
        learning_rate=lr, schedule="linear", warmup_steps=warmup, weight_decay=0.0,
        batch_size=batch, steps=50_000, eval_every=eval_every, eval_batches=eval_batches,
        log_every=100, notes=_NOTES,
    )


@register("lra-listops", table="lra", columns=(("ListOps (acc, %)", "accuracy"),))
def listops() -> TrainConfig:
    return _lra("lra-listops", dataset="lra-listops", batch=32, lr=1e-4, warmup=1000,
                max_len=2000, eval_every=500, eval_batches=62)


@register("lra-text", table="lra", columns=(("Text (acc, %)", "accuracy"),))
def text() -> TrainConfig:
    return _lra("lra-text", dataset="lra-text", batch=32, lr=1e-4, warmup=80,
                max_len=4000, eval_every=500, eval_batches=200)


@register("lra-retrieval", table="lra", columns=(("Retrieval (acc, %)", "accuracy"),))
def retrieval() -> TrainConfig:
    return _lra("lra-retrieval", dataset="lra-retrieval", batch=16, lr=2e-4, warmup=800,
                max_len=4000, eval_every=1000, eval_batches=300)


@register("lra-image", table="lra", columns=(("Image (acc, %)", "accuracy"),))
def image() -> TrainConfig:
    return _lra("lra-image", dataset="lra-image", batch=256, lr=1e-4, warmup=175,
                max_len=1024, eval_every=500, eval_batches=20)


@register("lra-pathfinder", table="lra", columns=(("Pathfinder (acc, %)", "accuracy"),))
def pathfinder() -> TrainConfig:
    return _lra("lra-pathfinder", dataset="lra-pathfinder", batch=128, lr=2e-4, warmup=312,
                max_len=1024, eval_every=500, eval_batches=156)
