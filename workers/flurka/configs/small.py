"""Small versions of the benchmarks: real data that ships with the packages, tiny models,
minutes on a laptop CPU, clearly above chance. Same families and loss/metrics as the full
benchmarks, so the whole pipeline (and the up-training switch) can be exercised anywhere.

Sizes are ours (not the paper's): d_model 64, 2 heads (head dim 32), 2 layers, FFN 128 — the
LRA shape of Table 6 at half width — AdamW 1e-3 with linear decay and 10 % warm-up. d_k and
random features are 16-32 (≤ the short sequences).
"""

from __future__ import annotations

from flurka.configs.base import TrainConfig, register
from flurka.configs.model import ModelConfig

_MODEL = ModelConfig("full", d_model=64, num_heads=2, num_layers=2, d_ff=128, dropout_rate=0.1)
_SMALL = dict(learning_rate=1e-3, schedule="linear", weight_decay=0.01, grad_clip=1.0, seed=0)
_NOTES = "small CPU version (our sizes): d_model 64, 2 heads, 2 layers, FFN 128, AdamW 1e-3 linear"


@register("lra-listops-small", table="lra-small", columns=(("ListOps (acc, %)", "accuracy"),))
def listops_small() -> TrainConfig:
    """ListOps generator with depth ≤ 3, ≤ 5 args, ≤ 40 tokens (flurka.data)."""
    return TrainConfig(
        benchmark="lra-listops-small", dataset="lra-listops-small", task="classification",
        metrics=("accuracy",), max_len=40,
        model=_MODEL.replace(pooling="cls", attention_options={"d_k": 16, "num_features": 32}), **_SMALL,
        batch_size=64, steps=1500, warmup_steps=150, eval_every=500, log_every=50, notes=_NOTES)


@register("lra-image-small", table="lra-small", columns=(("Image (acc, %)", "accuracy"),))
def image_small() -> TrainConfig:
    """scikit-learn digits, 8×8 pixels read as 64 tokens (LRA image in miniature)."""
    return TrainConfig(
        benchmark="lra-image-small", dataset="lra-image-small", task="classification",
        metrics=("accuracy",), max_len=64,
        model=_MODEL.replace(pooling="mean", attention_options={"d_k": 32, "num_features": 32}), **_SMALL,
        batch_size=64, steps=1000, warmup_steps=100, eval_every=250, log_every=50, notes=_NOTES)


@register("mlm-small")
def mlm_small() -> TrainConfig:
    """Byte-level MLM on the CPython standard library's own sources."""
    return TrainConfig(
        benchmark="mlm-small", dataset="mlm-small", task="mlm",
        metrics=("perplexity", "accuracy"), max_len=128,
        model=_MODEL.replace(attention_options={"d_k": 32, "num_features": 32}), **_SMALL,
        batch_size=32, steps=1000, warmup_steps=100, eval_every=250, eval_batches=20, log_every=50,
        notes=_NOTES)


@register("nmt-small")
def nmt_small() -> TrainConfig:
    """EN→DE number words (num2words / babel), encoder-decoder, greedy decoding, character BLEU
    (most targets are one word, whose word BLEU is always 0). Length 48 keeps 11 383 of the
    11 412 pairs (the longest German number word, 7777, has 42 characters). 600 steps at batch
    64 separate the constituents (300 flip their ranking); about 100 s a run on one core. One
    evaluation, at the end, over the whole eval split (1138 pairs: loss and BLEU), so the
    metric's own sampling noise stays below the spread over seeds."""
    return TrainConfig(
        benchmark="nmt-small", dataset="nmt-small", task="translation",
        metrics=("bleu", "perplexity", "accuracy"), max_len=48, dataset_options={"max_len": 48},
        bleu_tokenize="char",
        model=_MODEL.replace(num_decoder_layers=2, attention_options={"d_k": 16, "num_features": 32}), **_SMALL,
        batch_size=64, steps=600, warmup_steps=60, eval_every=0, eval_batches=0, bleu_batches=18,
        log_every=50, notes=_NOTES)


@register("nmt-list-small")
def nmt_list_small() -> TrainConfig:
    """Translate the item in capitals out of an English list of numbers and names (96–126
    characters, flurka.data.nmt_list), encoder-decoder, greedy decoding; character BLEU and exact
    match (sequence accuracy) over the whole eval split of 1024 examples, an exact-match rate's
    standard error there at most 1.6 points. The main job's task: ``make sweep``.

    The eval curve: loss and token accuracy on 4 eval batches every 100 steps (no decoding), so MLflow
    draws a curve for the cost of a few steps; the final evaluation as above.

    No dropout, learning rate 2e-3, batch 32, 600 steps: what the mechanisms need to separate
    beyond their seeds' spread in 600 steps (with one decoder layer instead of two, the seeds tied
    every pair of constituents: benchmarks/results/cpu/NOTES.md); about 80 s a Linformer run on one core.
    """
    small = {**_SMALL, "learning_rate": 2e-3}
    return TrainConfig(
        benchmark="nmt-list-small", dataset="nmt-list-small", task="translation",
        metrics=("bleu", "exact_match", "perplexity", "accuracy"), max_len=128, bleu_tokenize="char",
        model=_MODEL.replace(dropout_rate=0.0, num_decoder_layers=2, attention_options={"d_k": 16, "num_features": 32}),
        **small,
        batch_size=32, steps=600, warmup_steps=60, eval_every=100, curve_batches=4, eval_batches=0, bleu_batches=32,
        log_every=50, notes=_NOTES + "; nmt-list-small: no dropout, learning rate 2e-3")
