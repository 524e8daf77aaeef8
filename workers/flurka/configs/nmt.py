"""WMT'14 translation (paper Table 6, "NMT" row; §5: 128k steps with t5x).

Table 6: batch 128, lr 1 with the inverse-square-root schedule (the Transformer's "noam" rate
lr · d_model^-0.5 · min(t^-0.5, t · warmup^-1.5)), 12 layers, 12 heads, head dim 64, FFN 3072 —
T5-base (12 encoder + 12 decoder layers, 220M parameters, as the table's count says). The
FLuRKA/efficient mechanism is in the encoder only (appendix). Not in the paper: 4000 warm-up
steps, Adam β2 0.98 and ε 1e-9, label smoothing 0.1 (Vaswani et al.), 256-token sequences,
beam 4 with length penalty 0.6 for BLEU.

Tokens are SentencePiece subwords, as in t5x: one 32k unigram vocabulary shared by source and
target (Table 6's 220M and 60.5M parameter counts are those of a shared 32k vocabulary), trained
once on each language pair's training split and cached under the data dir
(:mod:`flurka.data.subword`; ``dataset_options={"vocab": "path/to/sentencepiece.model"}`` uses a
given one, ``{"vocab": "bytes"}`` the byte level of before). BLEU is sacrebleu's corpus BLEU with its
standard ``13a`` tokenization on detokenized text (the decoded pieces), as t5x reports it.
"""

from __future__ import annotations

from flurka.configs.base import TrainConfig, register
from flurka.configs.model import ModelConfig

MAX_LEN = 256            # subword tokens per side
BATCH = 128
# BLEU over the whole eval split (newstest2013's 3,000 sentences, newstest2014's 3,003), as the
# paper reports it; the evaluations before the last score loss on 20 batches and decode nothing.
NEWSTEST_BATCHES = -(-3_003 // BATCH)
VOCAB = {"vocab": "sentencepiece"}   # the pair's 32k vocabulary (flurka.data.subword.DEFAULT_VOCAB_SIZE)


def _nmt(name: str, dataset: str) -> TrainConfig:
    return TrainConfig(
        benchmark=name, dataset=dataset, task="translation", metrics=("bleu", "perplexity", "accuracy"),
        model=ModelConfig("full", attention_options={"d_k": 128, "num_features": 128}, d_model=768, num_heads=12,
                          num_layers=12, num_decoder_layers=12, d_ff=3072, dropout_rate=0.1),
        max_len=MAX_LEN, dataset_options={**VOCAB, "max_len": MAX_LEN}, bleu_tokenize="13a",
        learning_rate=1.0, schedule="inverse_sqrt", warmup_steps=4000, weight_decay=0.0,
        b2=0.98, eps=1e-9, label_smoothing=0.1,
        batch_size=BATCH, steps=128_000, eval_every=8_000, eval_batches=0, bleu_batches=NEWSTEST_BATCHES,
        curve_batches=20,
        beam_size=4, log_every=100, checkpoint_every=8_000,
        notes="Table 6 NMT (batch 128, lr 1, inverse sqrt, 12L/12H/64/3072), §5 (128k steps); "
              "warm-up 4000, label smoothing, β2 from Vaswani et al.",
    )


@register("nmt-wmt14-ende", table="collective", columns=(("En-De (BLEU, 0–100)", "bleu"),))
def ende() -> TrainConfig:
    return _nmt("nmt-wmt14-ende", "nmt-wmt14-ende")


@register("nmt-wmt14-enfr", table="collective", columns=(("En-Fr (BLEU, 0–100)", "bleu"),))
def enfr() -> TrainConfig:
    return _nmt("nmt-wmt14-enfr", "nmt-wmt14-enfr")


@register("nmt-ablation-ende")
def ablation() -> TrainConfig:
    """Table 6 "Quality Ablations" (up-training, Table 5): 6 layers, 8 heads, FFN 2048."""
    return _nmt("nmt-ablation-ende", "nmt-wmt14-ende").replace(
        model={"d_model": 512, "num_heads": 8, "num_layers": 6, "num_decoder_layers": 6, "d_ff": 2048},
        notes="Table 6 Quality Ablations (batch 128, lr 1, inverse sqrt, 6L/8H/64/2048)")
