"""Each mechanism's math as the plain ``jnp`` function a researcher would write, timed beside the
project's layer: what the layer's structure (mixins, masks, precision policy, aligned and fused
options) costs on top of the maths.

    python -m flurka.speed.plain --out benchmarks/results/<dir>/cpu-layers.json
    python -m flurka.speed.plain --sizes small --mechanisms full,linformer --repeats 5

A plain form reads the layer's own parameters (W_Q, W_K, W_V, W_O, E1/E2, ω), lays heads out
[b, h, n, d_h], runs float32 with ``jax.nn.softmax``, and applies the same masks: padded keys
excluded, padded rows zeroed before the low-rank compression, compressed rows that weigh no real
position masked. So both compute one function (tests/speed check it) and the ratio of their
times is the project's overhead alone. Forward is the layer's call; ``train`` is the gradient of
the sum of its output with respect to its parameters and input, as the speed harness's layer
training step takes it. EVA, flash and the FLuRKA-EVA fusion have no plain form here.

Writes one JSON document (schema ``flurka.speed.plain/1``): device, versions, settings, and one
row per (size, mechanism, mode) with both timings (median, p10, p90 over interleaved samples)
and ``ratio``, layer time / plain time paired within each round: mean, 95 % CI, n, median.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flurka.attention import make_attention
from flurka.attention.base import NEG_INF
from flurka.attention.feature_maps import FAVOR_EPS, RNN_EPS

SCHEMA = "flurka.speed.plain/1"
PLAIN = ("full", "linformer", "performer", "rnn", "flurka-performer", "flurka-rnn")
MODES = ("forward", "train")


@dataclasses.dataclass(frozen=True)
class Size:
    """One layer shape; ``padded`` trailing positions of every sequence are masked (0: no mask)."""

    name: str
    batch: int
    seq_len: int
    d_model: int
    num_heads: int
    d_k: int
    num_features: int
    padded: int = 0


# One long sequence without a mask (where a layer's own cost shows), and the small benchmarks'
# layer (nmt-small's encoder: batch 64, N 48, d_model 64, 2 heads, d_k 16, m 32; a quarter of
# each row padding).
SIZES = {
    "long": Size("long", batch=1, seq_len=4096, d_model=256, num_heads=4, d_k=256,
                 num_features=64),
    "small": Size("small", batch=64, seq_len=48, d_model=64, num_heads=2, d_k=16,
                  num_features=32, padded=12),
}


# -- the plain forms ------------------------------------------------------------------------------
def _linear(x, p):
    return x @ p["kernel"] + p["bias"]


def _heads(x, p, h):
    b, n, _ = x.shape
    return _linear(x, p).reshape(b, n, h, -1).transpose(0, 2, 1, 3)        # [b, h, n, d_h]


def _merge(ctx, p):
    b, h, n, d = ctx.shape
    return _linear(ctx.transpose(0, 2, 1, 3).reshape(b, n, h * d), p)


def _softmax(q, k, v, key_mask):
    s = q @ k.swapaxes(-1, -2) * q.shape[-1] ** -0.5                    # [b, h, n, m]
    if key_mask is not None:
        s = jnp.where(key_mask[:, None, None, :], s, NEG_INF)
    return jax.nn.softmax(s, axis=-1) @ v


def _favor(x, omega, *, query, key_mask=None):
    d, m = x.shape[-1], omega.shape[0]
    logit = d ** -0.25 * (x @ omega.T) - 0.5 * d ** -0.5 * jnp.sum(x * x, -1, keepdims=True)
    if query:
        stab = jnp.max(logit, axis=-1, keepdims=True)
    else:
        valid = logit if key_mask is None else jnp.where(key_mask[:, None, :, None], logit,
                                                         -jnp.inf)
        stab = jnp.max(valid, axis=(2, 3), keepdims=True)
    return m ** -0.5 * (jnp.exp(logit - jax.lax.stop_gradient(stab)) + FAVOR_EPS)


def _linear_attention(qf, kf, v, key_mask, denominator):
    if key_mask is not None:
        kf = jnp.where(key_mask[:, None, :, None], kf, 0.0)
    kv = kf.swapaxes(-1, -2) @ v                                          # [b, h, f, d]
    return (qf @ kv) / denominator(qf @ jnp.sum(kf, axis=2)[..., None])


def _favor_denominator(r):
    return r + 2.0 * FAVOR_EPS * (jnp.abs(r) <= FAVOR_EPS)


def _kernel(mechanism, q, k, v, key_mask, omega):
    if key_mask is not None:
        k = jnp.where(key_mask[:, None, :, None], k, 0.0)
        v = jnp.where(key_mask[:, None, :, None], v, 0.0)
    if mechanism.endswith("performer"):
        qf = _favor(q, omega, query=True)
        kf = _favor(k, omega, query=False, key_mask=key_mask)
        return _linear_attention(qf, kf, v, key_mask, _favor_denominator)
    return _linear_attention(jax.nn.elu(q) + 1.0, jax.nn.elu(k) + 1.0, v, key_mask,
                             lambda r: r + RNN_EPS)


def plain_forward(mechanism: str, p: dict, x, mask, *, num_heads: int):
    """The layer's output from its parameters ``p`` (:func:`layer_params`), written plainly."""
    h = num_heads
    if mechanism in ("linformer", "flurka-performer", "flurka-rnn"):
        n = x.shape[1]
        x = x if mask is None else jnp.where(mask[..., None], x, 0.0)
        e1, e2 = p["e1"][:, :n], p["e2"][:, :n]
        k, v = _heads(jnp.einsum("kn,bnd->bkd", e1, x), p["key"], h), _heads(
            jnp.einsum("kn,bnd->bkd", e2, x), p["value"], h)
        key_mask = None if mask is None else jnp.any(
            ((e1 != 0) | (e2 != 0))[None] & mask[:, None, :], axis=-1)
    else:
        k, v, key_mask = _heads(x, p["key"], h), _heads(x, p["value"], h), mask
    q = _heads(x, p["query"], h)
    if mechanism in ("full", "linformer"):
        ctx = _softmax(q, k, v, key_mask)
    else:
        ctx = _kernel(mechanism, q, k, v, key_mask, p.get("omega"))
    return _merge(ctx, p["out"])


def layer_params(layer: nnx.Module) -> dict:
    """The arrays a plain form reads, from a built layer."""
    p = {name: {"kernel": getattr(layer, name).kernel[...], "bias": getattr(layer, name).bias[...]}
         for name in ("query", "key", "value", "out")}
    if hasattr(layer, "seq_proj"):
        p["e1"], p["e2"] = layer.seq_proj.matrices(layer.max_len)
    if hasattr(layer, "features"):
        p["omega"] = layer.features[...]
    return p


# -- the two calls, side by side -----------------------------------------------------------------
def build(mechanism: str, size: Size, seed: int = 0):
    """(layer, x, mask): the project's layer (float32, its defaults), a normal input."""
    layer = make_attention(mechanism, d_model=size.d_model, num_heads=size.num_heads,
                           max_len=size.seq_len, d_k=size.d_k, num_features=size.num_features,
                           rngs=nnx.Rngs(seed))
    x = jax.random.normal(jax.random.key(seed + 1), (size.batch, size.seq_len, size.d_model))
    mask = None
    if size.padded:
        mask = jnp.broadcast_to(jnp.arange(size.seq_len) < size.seq_len - size.padded,
                                (size.batch, size.seq_len))
    return layer, x, mask


def calls(mechanism: str, size: Size, mode: str) -> dict[str, tuple[Callable, tuple]]:
    """{"layer": (fn, args), "plain": (fn, args)}: jitted forward or training-gradient calls."""
    layer, x, mask = build(mechanism, size)
    graphdef, state = nnx.split(layer)
    params = layer_params(layer)

    def layer_fn(state, x, mask):
        return nnx.merge(graphdef, state)(x, mask)

    def plain_fn(params, x, mask):
        return plain_forward(mechanism, params, x, mask, num_heads=size.num_heads)

    def grad_of(fn):
        return jax.jit(jax.grad(lambda w, x, mask: jnp.sum(fn(w, x, mask)), argnums=(0, 1)))

    if mode == "forward":
        return {"layer": (jax.jit(layer_fn), (state, x, mask)),
                "plain": (jax.jit(plain_fn), (params, x, mask))}
    return {"layer": (grad_of(layer_fn), (state, x, mask)),
            "plain": (grad_of(plain_fn), (params, x, mask))}


def measure(mechanism: str, size: Size, mode: str, *, warmup: int, repeats: int) -> dict[str, Any]:
    """Both calls side by side (:func:`~flurka.speed.timing.time_interleaved`: compiled, then
    rounds timing one sample of each in alternating order); a round's layer/plain ratio is paired
    within it, so the machine's drift between rounds cancels in ``ratio`` (mean ± 95 % CI over
    the rounds, :func:`flurka.stats.mean_ci`)."""
    from flurka.speed.timing import time_interleaved
    from flurka.stats import mean_ci

    timed = time_interleaved(calls(mechanism, size, mode), warmup=warmup, repeats=repeats,
                             samples=True)
    for key, t in timed.items():
        if t.get("status") != "ok":
            raise RuntimeError(f"{mechanism} {mode} at {size.name}: the {key} form failed: "
                               f"{t.get('error')}")
    samples = {key: t.pop("samples_s") for key, t in timed.items()}
    ratios = [a / b for a, b in zip(samples["layer"], samples["plain"])]
    row: dict[str, Any] = {"mechanism": mechanism, "mode": mode, **dataclasses.asdict(size)}
    row["size"] = row.pop("name")
    for key, t in timed.items():
        row[key] = {k: v for k, v in t.items() if k != "status"}
    est = mean_ci(ratios)
    row["ratio"] = {"mean": est.mean, "low": est.low, "high": est.high, "n": est.n,
                    "median": float(np.median(ratios))}
    return row


def _csv(ap: argparse.ArgumentParser, text: str, valid, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if bad or not items:
        ap.error(f"unknown {what} {bad or text!r}; valid: {', '.join(valid)}")
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flurka.speed.plain", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--mechanisms", default=",".join(PLAIN))
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", help="JSON file to write (rewritten after each row)")
    args = ap.parse_args(argv)
    mechanisms = _csv(ap, args.mechanisms, PLAIN, "mechanism(s)")
    sizes = _csv(ap, args.sizes, tuple(SIZES), "size(s)")
    modes = _csv(ap, args.modes, MODES, "mode(s)")
    if args.warmup < 0 or args.repeats < 2:
        ap.error("--warmup must be >= 0 and --repeats >= 2 (the ratio's CI needs two rounds)")
    from flurka.speed.runner import document, write_json
    doc = document(sweep="plain", results=[], ceilings=None,
                   settings={"warmup": args.warmup, "repeats": args.repeats}, schema=SCHEMA)
    for size in sizes:
        for mechanism in mechanisms:
            for mode in modes:
                row = measure(mechanism, SIZES[size], mode, warmup=args.warmup,
                              repeats=args.repeats)
                doc["results"].append(row)
                r = row["ratio"]
                print(f"{size:6s} {mechanism:17s} {mode:8s} layer "
                      f"{row['layer']['median_s'] * 1e3:8.2f} ms  plain "
                      f"{row['plain']['median_s'] * 1e3:8.2f} ms  ratio {r['mean']:.2f}x "
                      f"[{r['low']:.2f}, {r['high']:.2f}] (n={r['n']})", flush=True)
                if args.out:
                    write_json(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
