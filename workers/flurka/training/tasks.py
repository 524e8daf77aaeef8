"""Per-task loss and evaluation: given a model and a batch → loss, and eval statistics.

A :class:`Task` has three parts: :meth:`Task.loss` (traced inside the jitted train step),
:meth:`Task.eval_stats` (traced inside the jitted eval step: per-example numbers, weighted by the
batch's ``example_weight`` so padding examples never count) and :meth:`Task.summarize` (host side:
concatenated per-example numbers → the metrics of :mod:`flurka.training.metrics`). Batch keys are
those of the data contract (``flurka.data``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flurka.training import metrics as M


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
    """Per-position cross-entropy in float32, optionally with label smoothing."""
    logits = logits.astype(jnp.float32)
    if not label_smoothing:
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    num_classes = logits.shape[-1]
    targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
    return optax.softmax_cross_entropy(logits, targets)


def _example_weight(batch) -> jax.Array:
    n = next(iter(batch.values())).shape[0]
    return batch["example_weight"].astype(jnp.float32) if "example_weight" in batch else jnp.ones((n,), jnp.float32)


class Task:
    """Base: cross-entropy over ``[B, C]`` logits against ``label``."""

    def __init__(self, metrics: Sequence[str], label_smoothing: float = 0.0):
        self.metrics = tuple(metrics)
        self.label_smoothing = label_smoothing

    # -- model call -----------------------------------------------------------------------------
    def forward(self, model, batch, *, deterministic: bool):
        kwargs = {k: batch[k] for k in ("segments", "inputs2", "mask2") if k in batch}
        return model(batch["inputs"], batch["mask"], deterministic=deterministic, **kwargs)

    # -- training -------------------------------------------------------------------------------
    def loss(self, model, batch, *, deterministic: bool = False):
        logits = self.forward(model, batch, deterministic=deterministic)
        w = _example_weight(batch)
        ce = cross_entropy(logits, batch["label"], self.label_smoothing)
        loss = jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)
        acc = jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * w) / jnp.maximum(jnp.sum(w), 1.0)
        return loss, {"accuracy": acc}

    # -- evaluation -----------------------------------------------------------------------------
    def eval_stats(self, model, batch) -> dict[str, jax.Array]:
        logits = self.forward(model, batch, deterministic=True).astype(jnp.float32)
        stats = {
            "loss": cross_entropy(logits, batch["label"]),
            "pred": jnp.argmax(logits, -1),
            "label": batch["label"],
            "weight": _example_weight(batch),
        }
        if "top5" in self.metrics:
            k = min(5, logits.shape[-1])
            stats["top5"] = jnp.any(jax.lax.top_k(logits, k)[1] == batch["label"][:, None], axis=-1)
        return stats

    def summarize(self, s: dict[str, np.ndarray]) -> dict[str, float]:
        w = s["weight"]
        out = {"loss": float(np.sum(s["loss"] * w) / max(np.sum(w), 1.0))}
        for name in self.metrics:
            if name == "accuracy":
                out[name] = M.accuracy(s["pred"], s["label"], w)
                out["majority_accuracy"] = M.majority_accuracy(s["label"], w)   # its chance line
            elif name == "top5":
                keep = w > 0
                out[name] = float(np.mean(s["top5"][keep]))
            elif name == "matthews":
                out[name] = M.matthews(s["pred"], s["label"], w)
            elif name == "f1":
                out[name] = M.f1(s["pred"], s["label"], w)
        return out


class ImageTask(Task):
    """ViT classification on ``image`` [B, H, W, C]. A data set whose batches hold uint8 pixels
    (``DatasetInfo.pixel_mean`` / ``pixel_std``) has them normalised here, inside the jitted
    step: the host builds and moves a quarter of float32's bytes, and the model sees the same
    float32 input as if the host had normalised them."""

    def __init__(self, metrics: Sequence[str], label_smoothing: float = 0.0, *,
                 pixel_mean: Sequence[float] = (), pixel_std: Sequence[float] = ()):
        super().__init__(metrics, label_smoothing)
        if len(pixel_mean) != len(pixel_std) or any(s <= 0 for s in pixel_std):
            raise ValueError(f"pixel_mean {tuple(pixel_mean)} and pixel_std {tuple(pixel_std)} must be "
                             "per-channel values of one length, the deviations positive")
        self.pixel_mean, self.pixel_std = tuple(pixel_mean), tuple(pixel_std)

    def pixels(self, image: jax.Array) -> jax.Array:
        """The model's input: integer pixels in [0, 255] scaled to [0, 1] and normalised per
        channel; float images as they are."""
        if not jnp.issubdtype(image.dtype, jnp.integer):
            return image
        x = image.astype(jnp.float32) / 255.0
        if self.pixel_mean:
            x = (x - jnp.asarray(self.pixel_mean, jnp.float32)) / jnp.asarray(self.pixel_std, jnp.float32)
        return x

    def forward(self, model, batch, *, deterministic: bool):
        return model(self.pixels(batch["image"]), deterministic=deterministic)


class RegressionTask(Task):
    """STS-B: mean squared error on a single output; Pearson/Spearman."""

    def loss(self, model, batch, *, deterministic: bool = False):
        pred = self.forward(model, batch, deterministic=deterministic)[..., 0].astype(jnp.float32)
        w = _example_weight(batch)
        loss = jnp.sum(jnp.square(pred - batch["label"]) * w) / jnp.maximum(jnp.sum(w), 1.0)
        return loss, {}

    def eval_stats(self, model, batch):
        pred = self.forward(model, batch, deterministic=True)[..., 0].astype(jnp.float32)
        return {"loss": jnp.square(pred - batch["label"]), "pred": pred, "label": batch["label"],
                "weight": _example_weight(batch)}

    def summarize(self, s):
        w = s["weight"]
        out = {"loss": float(np.sum(s["loss"] * w) / max(np.sum(w), 1.0))}
        for name in self.metrics:
            if name == "pearson":
                out[name] = M.pearson(s["pred"], s["label"], w)
            elif name == "spearman":
                out[name] = M.spearman(s["pred"], s["label"], w)
        return out


class TokenTask(Task):
    """Token-level cross-entropy (MLM over the masked positions, translation over targets)."""

    def token_logits(self, model, batch, *, deterministic: bool):
        raise NotImplementedError

    def loss(self, model, batch, *, deterministic: bool = False):
        logits, labels, weights = self.token_logits(model, batch, deterministic=deterministic)
        ce = cross_entropy(logits, labels, self.label_smoothing)
        total = jnp.maximum(jnp.sum(weights), 1.0)
        acc = jnp.sum((jnp.argmax(logits, -1) == labels) * weights) / total
        return jnp.sum(ce * weights) / total, {"accuracy": acc}

    def eval_stats(self, model, batch):
        logits, labels, weights = self.token_logits(model, batch, deterministic=True)
        weights = weights * _example_weight(batch)[:, None]
        ce = cross_entropy(logits, labels)
        return {"nll": jnp.sum(ce * weights, -1),
                "correct": jnp.sum((jnp.argmax(logits, -1) == labels) * weights, -1),
                "tokens": jnp.sum(weights, -1)}

    def summarize(self, s):
        tokens = float(np.sum(s["tokens"]))
        nll = float(np.sum(s["nll"]))
        out = {"loss": nll / max(tokens, 1.0)}
        if "perplexity" in self.metrics:
            out["perplexity"] = M.perplexity(nll, tokens)
        if "accuracy" in self.metrics:
            out["accuracy"] = float(np.sum(s["correct"]) / max(tokens, 1.0))
        return out


class MLMTask(TokenTask):
    def token_logits(self, model, batch, *, deterministic: bool):
        logits = self.forward(model, batch, deterministic=deterministic)
        return logits, batch["targets"], batch["weights"].astype(jnp.float32)


class TranslationTask(TokenTask):
    """Teacher forcing: decoder input targets[:, :-1], labels targets[:, 1:]."""

    def forward(self, model, batch, *, deterministic: bool):
        targets, tmask = batch["targets"], batch["targets_mask"]
        return model(batch["inputs"], batch["mask"], targets[:, :-1], tmask[:, :-1],
                     deterministic=deterministic)

    def token_logits(self, model, batch, *, deterministic: bool):
        logits = self.forward(model, batch, deterministic=deterministic)
        return logits, batch["targets"][:, 1:], batch["targets_mask"][:, 1:].astype(jnp.float32)


def make_task(config, info=None) -> Task:
    """``config``'s task; ``info`` (the data set's ``DatasetInfo``) says how an image task's
    pixels are normalised."""
    kinds = {"classification": Task, "image": ImageTask, "regression": RegressionTask,
             "mlm": MLMTask, "translation": TranslationTask}
    if config.task not in kinds:
        raise ValueError(f"unknown task {config.task!r}; valid: {', '.join(kinds)}")
    if config.task == "image" and info is not None:
        return ImageTask(config.metrics, config.label_smoothing, pixel_mean=getattr(info, "pixel_mean", ()),
                         pixel_std=getattr(info, "pixel_std", ()))
    return kinds[config.task](config.metrics, config.label_smoothing)
