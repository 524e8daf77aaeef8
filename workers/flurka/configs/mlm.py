"""Masked language modelling on WikiText-103 (paper §5 and Table 6, "MLM" row).

Table 6: batch 1024, lr 1e-4 (the table lists 1e-4 and 1.2e-4; 1e-4 here), linear decay,
12 layers, 12 heads, head dim 64 (d_model 768), FFN 3072; §5: 120k steps. Not in the paper,
taken from BERT/RoBERTa: 512-token sequences, 10k warm-up steps, weight decay 0.01, dropout 0.1,
grad clip 1.0; Linformer's k = 256 at n = 512 (Linformer paper) for d_k, 256 random features.

Tokens are SentencePiece subwords: one 32k unigram vocabulary trained once on WikiText-103's train
file and cached under the data dir (:mod:`flurka.data.subword`), shared with GLUE fine-tuning
(:data:`SHARED_VOCAB`), so a pre-trained run's embedding is the fine-tuned model's
(``flurka train --init-from``). ``dataset_options={"vocab": "bytes"}`` is the byte level of before.
"""

from __future__ import annotations

from flurka.configs.base import TrainConfig, register
from flurka.configs.model import ModelConfig

# MLM pre-training's vocabulary, which GLUE fine-tuning reuses (flurka.data.local_sets.wikitext103_tokenizer)
SHARED_VOCAB = {"vocab": "sentencepiece"}
MAX_LEN = 512   # subword tokens


def bert_base(**overrides) -> ModelConfig:
    """The 12-layer encoder shared by MLM pre-training and GLUE fine-tuning."""
    return ModelConfig("full", **{**dict(d_model=768, num_heads=12, num_layers=12, d_ff=3072, dropout_rate=0.1,
                                         attention_options={"d_k": 256, "num_features": 256}), **overrides})


@register("mlm-wikitext103", table="collective", columns=(("WikiText-103 (perplexity)", "perplexity"),))
def wikitext103() -> TrainConfig:
    return TrainConfig(
        benchmark="mlm-wikitext103", dataset="mlm-wikitext103", task="mlm",
        metrics=("perplexity", "accuracy"), model=bert_base(), max_len=MAX_LEN,
        dataset_options={**SHARED_VOCAB, "max_len": MAX_LEN},
        learning_rate=1e-4, schedule="linear", warmup_steps=10_000, weight_decay=0.01, grad_clip=1.0,
        b2=0.98, eps=1e-6, batch_size=1024, steps=120_000, eval_every=5_000, eval_batches=50,
        log_every=100, checkpoint_every=5_000,
        notes="Table 6 (batch 1024, lr 1e-4, linear, 12L/12H/64/3072), §5 (120k steps); "
              "warm-up, decay, length 512 from BERT/RoBERTa",
    )
