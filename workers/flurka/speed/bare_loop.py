"""Steps per second of ``flurka train`` against a bare Flax NNX + optax loop of the same model,
optimizer and batches: what the training loop (functional state, resumable per-step keys,
metrics, compute casts, logging) costs on top of the step itself.

    python -m flurka.speed.bare_loop --out benchmarks/results/<dir>/cpu-loop.json
    python -m flurka.speed.bare_loop --benchmarks nmt-small --steps 100

The bare loop is the Flax examples' shape: ``nnx.Optimizer(model, tx, wrt=nnx.Param)``, one
``nnx.jit`` step whose loss is written out per task (cross-entropy over labels, masked tokens or
shifted targets; dropout drawn from the model's own ``nnx.Rngs``), the batches already on the
device. ``flurka train`` runs the same number of steps through :func:`flurka.training.train`
without checkpoints (its one evaluation, at the end, outside the timed part); its steps/s is its ``train_steps`` part of the time split
(every step but each phase's first, which compiles). Each is timed ``--repeats`` times,
alternating; the document records both medians and their ratio per benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

SCHEMA = "flurka.speed.loop/1"
SMALL = ("lra-listops-small", "lra-image-small", "mlm-small", "nmt-small")


def _weighted_ce(logits, labels, weights):
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    return jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def bare_loss(config, model, batch, deterministic: bool = False):
    """The task's training loss, written as a Flax example would (no metrics)."""
    if config.task == "translation":
        t, tm = batch["targets"], batch["targets_mask"]
        logits = model(batch["inputs"], batch["mask"], t[:, :-1], tm[:, :-1],
                       deterministic=deterministic)
        return _weighted_ce(logits, t[:, 1:], tm[:, 1:].astype(jnp.float32))
    logits = model(batch["inputs"], batch["mask"], deterministic=deterministic)
    if config.task == "mlm":
        return _weighted_ce(logits, batch["targets"], batch["weights"].astype(jnp.float32))
    if config.task == "classification":
        return _weighted_ce(logits, batch["label"], jnp.ones(logits.shape[:1]))
    raise ValueError(f"bare loop: no loss for task {config.task!r}")


def bare_steps_per_s(config, dataset, steps: int) -> float:
    """Train ``steps`` steps in the bare loop; steps/s over all but the first (compiling) one."""
    from flurka.training.loop import build_model
    from flurka.training.optimizer import make_optimizer
    model = build_model(config, dataset.info, config.model.attention)
    optimizer = nnx.Optimizer(model, make_optimizer(config), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, batch):
        loss, grads = nnx.value_and_grad(lambda m: bare_loss(config, m, batch))(model)
        optimizer.update(model, grads)
        return loss

    keys = ("inputs", "mask", "targets", "targets_mask", "weights", "label")
    it = dataset.train_batches(config.batch_size)
    batches = [{k: jnp.asarray(v) for k, v in next(it).items() if k in keys}
               for _ in range(steps)]
    jax.block_until_ready(step(model, optimizer, batches[0]))
    start = time.perf_counter()
    for batch in batches[1:]:
        loss = step(model, optimizer, batch)
    jax.block_until_ready(loss)
    return (steps - 1) / (time.perf_counter() - start)


def flurka_steps_per_s(config, dataset, steps: int) -> float:
    """``flurka train``'s steps/s: its ``train_steps`` time over the steps it covers."""
    from flurka.training.loop import train
    config = dataclasses.replace(config, eval_every=0, eval_batches=1, bleu_batches=1,
                                 workdir=None, checkpoint_every=0)
    result = train(config, dataset=dataset, progress=False, mesh=None)
    return (steps - 1) / result["time_split"]["train_steps"]


def measure(benchmark: str, *, steps: int, repeats: int) -> dict[str, Any]:
    from flurka.configs import get_config
    from flurka.training.loop import load_dataset
    config = get_config(benchmark)   # both loops: the same optimizer over `steps` steps
    config = dataclasses.replace(config, steps=steps,
                                 warmup_steps=min(config.warmup_steps, steps // 10))
    dataset = load_dataset(config)
    runs: dict[str, list[float]] = {"flurka": [], "bare": []}
    for _ in range(repeats):
        runs["flurka"].append(flurka_steps_per_s(config, dataset, steps))
        runs["bare"].append(bare_steps_per_s(config, dataset, steps))
    med = {k: float(np.median(v)) for k, v in runs.items()}
    return {"benchmark": benchmark, "attention": config.model.attention, "batch_size": config.batch_size,
            "steps": steps, "repeats": repeats,
            **{f"{k}_steps_per_s": v for k, v in runs.items()},
            **{f"{k}_median_steps_per_s": v for k, v in med.items()},
            "ratio": med["bare"] / med["flurka"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flurka.speed.bare_loop",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmarks", default=",".join(SMALL))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="JSON file to write (rewritten after each benchmark)")
    args = ap.parse_args(argv)
    benchmarks = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    bad = [b for b in benchmarks if b not in SMALL]
    if bad or not benchmarks:
        ap.error(f"unknown benchmark(s) {bad or args.benchmarks!r}; valid: {', '.join(SMALL)}")
    if args.steps < 2 or args.repeats < 1:
        ap.error("--steps must be >= 2 and --repeats >= 1")
    from flurka.speed.runner import document, write_json
    doc = document(sweep="loop", results=[], ceilings=None,
                   settings={"steps": args.steps, "repeats": args.repeats}, schema=SCHEMA)
    for benchmark in benchmarks:
        row = measure(benchmark, steps=args.steps, repeats=args.repeats)
        doc["results"].append(row)
        print(f"{benchmark:18s} flurka train {row['flurka_median_steps_per_s']:6.2f} steps/s  "
              f"bare loop {row['bare_median_steps_per_s']:6.2f} steps/s  "
              f"ratio {row['ratio']:.2f}x", flush=True)
        if args.out:
            write_json(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
