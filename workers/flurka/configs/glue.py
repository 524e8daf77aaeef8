"""GLUE fine-tuning (paper Table 6, "NLU" row: the MLM model, lr in [1e-4, 5e-4], linear decay).

Table 6 gives the batch (1024, shared with MLM) and the lr range; 1e-4 is the default here and the
range is the sweep space. Training length is not in the paper: 10 epochs over each task's
training split at that batch (at least 100 steps), 6 % warm-up (RoBERTa's GLUE recipe), weight
decay 0.1, 128-token pairs (so d_k = 64, half the length as in MLM's 256 of 512). Metrics are
GLUE's: Matthews corr. (CoLA), F1 + accuracy (MRPC, QQP),
Pearson + Spearman (STS-B), accuracy otherwise; MNLI evaluates its mismatched dev set beside the
matched one (same ``eval_batches``) and records it as ``accuracy_mismatched`` (Table 2's MNLI-mm;
``flurka.data.tfds_sets.GLUE_EXTRA_EVALS``).

Tokens are MLM pre-training's: WikiText-103's SentencePiece vocabulary (``mlm.SHARED_VOCAB``; GLUE's
own text never trains one), so ``--init-from`` a WikiText-103 MLM run has the embedding it needs;
it needs WikiText-103 under the data dir, or ``dataset_options={"vocab": "<its .model file>"}``.
"""

from __future__ import annotations

import math

from flurka.configs.base import TrainConfig, register
from flurka.configs.mlm import SHARED_VOCAB, bert_base

# task -> (train examples, classes, metrics)
TASKS: dict[str, tuple[int, int, tuple[str, ...]]] = {
    "cola": (8_551, 2, ("matthews", "accuracy")),
    "sst2": (67_349, 2, ("accuracy",)),
    "mrpc": (3_668, 2, ("f1", "accuracy")),
    "stsb": (5_749, 1, ("pearson", "spearman")),
    "qqp": (363_846, 2, ("f1", "accuracy")),
    "mnli": (392_702, 3, ("accuracy",)),
    "qnli": (104_743, 2, ("accuracy",)),
    "rte": (2_490, 2, ("accuracy",)),
}
LR_RANGE = (1e-4, 5e-4)
BATCH = 1024
MAX_LEN = 128   # subword tokens, [CLS] a [SEP] b [SEP]


def _glue(task: str) -> TrainConfig:
    n, _, metrics = TASKS[task]
    steps = max(100, math.ceil(10 * n / BATCH))
    return TrainConfig(
        benchmark=f"glue-{task}", dataset=f"glue-{task}",
        task="regression" if task == "stsb" else "classification", metrics=metrics,
        model=bert_base(attention_options={"d_k": 64, "num_features": 64}, pooling="cls"), max_len=MAX_LEN,
        dataset_options={**SHARED_VOCAB, "max_len": MAX_LEN},
        learning_rate=LR_RANGE[0], schedule="linear", warmup_steps=math.ceil(0.06 * steps),
        weight_decay=0.1, grad_clip=1.0, b2=0.98, eps=1e-6,
        batch_size=BATCH, steps=steps, eval_every=max(1, steps // 5), log_every=10,
        notes=f"Table 6 NLU (batch {BATCH}, lr range {LR_RANGE}, linear, 12L/12H/64/3072); "
              "10 epochs, 6% warm-up from RoBERTa's GLUE recipe",
    )


# Table 2's columns: (header, metric) per task
COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "cola": (("CoLA (mcc, %)", "matthews"),),
    "sst2": (("SST-2 (acc, %)", "accuracy"),),
    "mrpc": (("MRPC (F1, %)", "f1"), ("MRPC (acc, %)", "accuracy")),
    "stsb": (("STS-B (Pearson, %)", "pearson"), ("STS-B (Spearman, %)", "spearman")),
    "qqp": (("QQP (F1, %)", "f1"), ("QQP (acc, %)", "accuracy")),
    "mnli": (("MNLI-m (acc, %)", "accuracy"), ("MNLI-mm (acc, %)", "accuracy_mismatched")),
    "qnli": (("QNLI (acc, %)", "accuracy"),),
    "rte": (("RTE (acc, %)", "accuracy"),),
}
for _task in TASKS:
    register(f"glue-{_task}", table="glue", columns=COLUMNS[_task])(lambda _t=_task: _glue(_t))
