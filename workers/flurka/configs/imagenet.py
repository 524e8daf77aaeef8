"""ImageNet with a T2T-ViT (paper §5 and Table 6, "Image Classification" row).

Table 6: batch 128, lr 1e-3, cosine annealing, 7 layers, 4 heads, head dim 64 (d_model 256),
FFN 512 — T2T-ViT-7's encoder. §5: 350 epochs over ImageNet-1k's 1,281,167 images, i.e.
ceil(350 · 1281167 / 128) steps. From the T2T-ViT recipe: 5 warm-up epochs, weight decay 0.05,
224×224 inputs (14×14 = 196 tokens + [CLS] after the T2T stem).
"""

from __future__ import annotations

import math

from flurka.configs.base import TrainConfig, register
from flurka.configs.model import ModelConfig

TRAIN_IMAGES = 1_281_167
BATCH = 128
EPOCH = math.ceil(TRAIN_IMAGES / BATCH)


@register("imagenet", table="collective",
          columns=(("ImageNet top-1 (%)", "accuracy"), ("ImageNet top-5 (%)", "top5")))
def imagenet() -> TrainConfig:
    return TrainConfig(
        benchmark="imagenet", dataset="imagenet", task="image", metrics=("accuracy", "top5"),
        model=ModelConfig("full", attention_options={"d_k": 64, "num_features": 64}, d_model=256, num_heads=4,
                          num_layers=7, d_ff=512, patch_size=16, t2t=True, dropout_rate=0.0, pooling="cls"),
        max_len=197,
        learning_rate=1e-3, schedule="cosine", warmup_steps=5 * EPOCH, weight_decay=0.05,
        batch_size=BATCH, steps=math.ceil(350 * TRAIN_IMAGES / BATCH), eval_every=10 * EPOCH,
        log_every=500, checkpoint_every=EPOCH,
        notes="Table 6 (batch 128, lr 1e-3, cosine, 7L/4H/64/512), §5 (350 epochs); T2T-ViT warm-up/decay",
    )
