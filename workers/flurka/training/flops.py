"""Whole-model training FLOPs per step (for loss-vs-compute curves, paper Table 1).

Counting: every dense layer (W_Q/K/V/O, FFN, heads, the MLM/decoder output projection, patch
and T2T projections) is a matrix product, 2·M·N·K FLOPs. Each encoder attention layer is
counted by :func:`flurka.attention.flops.forward_flops` (its exact model: matmuls plus the
softmax / feature-map elementwise work); the decoder's causal self-attention and
cross-attention are softmax attention and use the same model ("full"). Embedding lookups,
LayerNorm, GELU, residual adds and the loss are not counted (elementwise, O(N·d) against the
O(N·d²) matmuls). With ``dots_only=True`` only matrix products are counted: that number is
exactly what XLA's compiled forward pass multiplies, and the tests check it against the HLO.

Up-training hand-over steps (:mod:`flurka.attention.handover`) run the FLuRKA variant and its base
in every attention layer: ``handover_from`` counts both layers in full, an upper bound (the W_Q /
W_O products, and for a Linformer base the E·X compression and K'/V' projections, are shared and
counted twice).

A training step (``train=True``) counts the backward pass by the convention of
:mod:`flurka.attention.flops` (its docstring states it): product by product, the gradient of
each operand that needs one at the product's own cost. A dense layer is then 3 × its forward (the
usual convention, Kaplan et al. 2020), except the image stem's first projection, whose input is
the data (2 ×); each attention layer is ``training_flops(..., input_grad=True)``: 3 × forward
less FAVOR+'s fixed ω. The speed benchmark's floors use the same count.
"""

from __future__ import annotations

from collections.abc import Mapping

from flurka.attention import flops as attention_flops
from flurka.attention.flops import matmul_flops
from flurka.catalogue.mechanisms import COMPRESSED


def _dense(*dims: int, train: bool, data_input: bool = False) -> int:
    """A dense product's FLOPs: forward, or forward + the weight's gradient (+ the input's,
    unless the input is the data)."""
    return matmul_flops(*dims) * (1 if not train else 2 if data_input else 3)


def attention_layer(mechanism: str, *, batch: int, seq_len: int, d_model: int, num_heads: int,
                    options: Mapping | None = None, dots_only: bool = False,
                    handover_from: str | None = None, train: bool = False) -> int:
    if handover_from is not None and mechanism in attention_flops.FLURKA:
        return sum(attention_layer(m, batch=batch, seq_len=seq_len, d_model=d_model,
                                   num_heads=num_heads, options=options, dots_only=dots_only,
                                   train=train)
                   for m in (mechanism, handover_from))
    opts = {k: v for k, v in dict(options or {}).items()
            if k in ("d_k", "num_features", "window_size", "chunk_size")}
    if mechanism not in COMPRESSED:
        opts.pop("d_k", None)
    shape = attention_flops.AttentionShape(batch=batch, seq_len=seq_len, d_model=d_model,
                                           num_heads=num_heads, **opts)
    if train:
        fn = attention_flops.training_dot_flops if dots_only else attention_flops.training_flops
    else:
        fn = attention_flops.dot_flops if dots_only else attention_flops.forward_flops
    return int(fn(mechanism, shape))


def encoder(mechanism: str, *, batch: int, seq_len: int, d_model: int, num_heads: int,
            num_layers: int, d_ff: int, options: Mapping | None = None, dots_only: bool = False,
            handover_from: str | None = None, train: bool = False) -> int:
    """The shared pre-LN encoder stack: per layer one attention and a two-matmul FFN."""
    attn = attention_layer(mechanism, batch=batch, seq_len=seq_len, d_model=d_model,
                           num_heads=num_heads, options=options, dots_only=dots_only,
                           handover_from=handover_from, train=train)
    return num_layers * (attn + ffn_flops(batch, seq_len, d_model, d_ff, train=train))


def ffn_flops(batch: int, seq_len: int, d_model: int, d_ff: int, *, train: bool) -> int:
    """One block's two-matmul FFN (d_model → d_ff → d_model), forward or its training step."""
    return 2 * _dense(batch, seq_len, d_model, d_ff, train=train)


def decoder(*, batch: int, target_len: int, source_len: int, d_model: int, num_heads: int,
            num_layers: int, d_ff: int, vocab_size: int, dots_only: bool = False,
            train: bool = False) -> int:
    """Causal self-attention (softmax over all M positions: the mask does not skip work),
    cross-attention (queries M, keys/values N), FFN, then the vocabulary projection."""
    b, m, n, d, h = batch, target_len, source_len, d_model, num_heads
    self_attn = attention_layer("full", batch=b, seq_len=m, d_model=d, num_heads=h, dots_only=dots_only,
                                train=train)
    rows = b * h * m
    cross = matmul_flops(b, d, d) * (2 * m + 2 * n) + 2 * matmul_flops(rows, n, d // h)
    if not dots_only:
        cross += b * d * (2 * m + 2 * n) + 6 * rows * n     # biases; scale + 5-op softmax
    cross *= 3 if train else 1                               # every operand needs its gradient
    ffn = 2 * _dense(b, m, d, d_ff, train=train)
    return num_layers * (self_attn + cross + ffn) + _dense(b, m, d, vocab_size, train=train)


def _t2t(mechanism, *, batch, image_shape, d_model, splits, token_dim, options, dots_only,
         handover_from=None, train=False) -> int:
    h, w, c = image_shape
    total, channels = 0, c
    for i, (k, s, p) in enumerate(splits):
        h, w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        last = i == len(splits) - 1
        total += _dense(batch, h * w, channels * k * k, d_model if last else token_dim, train=train,
                        data_input=i == 0)
        if not last:
            total += encoder(mechanism, batch=batch, seq_len=h * w, d_model=token_dim, num_heads=1,
                             num_layers=1, d_ff=token_dim, options=options, dots_only=dots_only,
                             handover_from=handover_from, train=train)
            channels = token_dim
    return total


def forward_flops(config, info, shapes: Mapping[str, tuple], *, attention: str | None = None,
                  dots_only: bool = False, handover_from: str | None = None,
                  train: bool = False) -> int:
    """Forward FLOPs of one batch (with ``train``: forward + backward, the module docstring's
    convention). ``shapes``: the batch's array shapes (key -> shape); ``attention`` overrides
    ``config.model.attention`` (the up-training base phase); ``handover_from``: a hand-over step that
    also runs this base mechanism."""
    mech = attention or config.model.attention
    c, model = config, config.model
    common = dict(d_model=model.d_model, num_heads=model.num_heads, num_layers=model.num_layers, d_ff=model.d_ff,
                  options=model.attention_options, dots_only=dots_only, handover_from=handover_from,
                  train=train)
    if c.task == "image":
        b, hh, ww, ch = shapes["image"]
        if model.t2t:
            stem = _t2t(mech, batch=b, image_shape=(hh, ww, ch), d_model=model.d_model, splits=model.t2t_splits,
                        token_dim=model.t2t_dim, options=model.attention_options, dots_only=dots_only,
                        handover_from=handover_from, train=train)
            for k, s, p in model.t2t_splits:
                hh, ww = (hh + 2 * p - k) // s + 1, (ww + 2 * p - k) // s + 1
            tokens = hh * ww
        else:
            tokens = (hh // model.patch_size) * (ww // model.patch_size)
            stem = _dense(b, tokens, ch * model.patch_size ** 2, model.d_model, train=train, data_input=True)
        body = encoder(mech, batch=b, seq_len=tokens + 1, **common)
        return stem + body + _dense(b, model.d_model, info.num_classes, train=train)
    b, n = shapes["inputs"]
    if c.task in ("classification", "regression"):
        towers = 2 if "inputs2" in shapes else 1
        width = 4 * model.d_model if towers == 2 else model.d_model
        classes = 1 if c.task == "regression" else info.num_classes
        return (towers * encoder(mech, batch=b, seq_len=n, **common)
                + _dense(b, width, model.d_model, train=train) + _dense(b, model.d_model, classes, train=train))
    if c.task == "mlm":
        return (encoder(mech, batch=b, seq_len=n, **common)
                + _dense(b, n, model.d_model, model.d_model, train=train)
                + _dense(b, n, model.d_model, info.vocab_size, train=train))
    if c.task == "translation":
        m = shapes["targets"][1] - 1
        return (encoder(mech, batch=b, seq_len=n, **common)
                + decoder(batch=b, target_len=m, source_len=n, d_model=model.d_model,
                          num_heads=model.num_heads, num_layers=model.num_decoder_layers or model.num_layers,
                          d_ff=model.d_ff, vocab_size=info.target_vocab_size, dots_only=dots_only,
                          train=train))
    raise ValueError(f"unknown task {c.task!r}")


def train_step_flops(config, info, shapes, *, attention: str | None = None,
                     handover_from: str | None = None, dots_only: bool = False) -> int:
    """FLOPs of one training step: forward + backward (the module docstring's convention)."""
    return forward_flops(config, info, shapes, attention=attention, handover_from=handover_from,
                         dots_only=dots_only, train=True)
