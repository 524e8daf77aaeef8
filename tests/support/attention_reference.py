"""Float64 NumPy references for every attention mechanism, written from the formulas.

Independent of the JAX code: per batch element and head, with padded keys *dropped* (not masked)
and loops where the JAX code vectorises. Random draws (FAVOR+ ω, EVA ε) and parameters are read
from the layer; everything else is recomputed here.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from flurka.attention import make_attention

D_MODEL, HEADS, MAX_LEN = 16, 2, 24


def f64(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a, jnp.float32), dtype=np.float64)


def randomize(layer, seed: int, scale: float = 0.3):
    """Perturb every Param (biases and LayerNorm too) so nothing is trivially zero or one."""
    rng = np.random.default_rng(seed)
    for _, var in nnx.iter_graph(layer):
        if isinstance(var, nnx.Param):
            var[...] = var[...] + jnp.asarray(scale * rng.normal(size=var.shape), var.dtype)
    return layer


@nnx.jit
def forward(layer, x, mask):
    """``layer(x, mask)`` compiled as one program. Called eagerly, a layer compiles each of its
    operations on its own (hundreds, with a Pallas kernel's grid interpreted on the CPU): most of
    a test's time, for the same function."""
    return layer(x, mask)


@nnx.jit
def sin_loss_grads(layer, x, mask):
    """The parameter gradient (an ``nnx.State``) of Σ sin(layer(x, mask)) over the real rows, the
    output taken to float32 first, as one program: the gradient tests' probe (sin, so that every
    output element gets its own cotangent)."""
    def loss(m):
        return jnp.sum(jnp.sin(m(x, mask).astype(jnp.float32)) * mask[..., None])
    return nnx.grad(loss)(layer)


@functools.lru_cache(maxsize=None)
def _cached(mechanism, seed, options):
    return build(mechanism, seed, **dict(options))


def shared(mechanism, seed=0, **options):
    """A cached layer for tests that only call it (never mutate it): saves construction time."""
    return _cached(mechanism, seed, tuple(sorted(options.items())))


def build(mechanism, seed=0, **options):
    opts = dict(d_k=8, num_features=64)
    if mechanism == "eva":
        opts.update(window_size=4, chunk_size=3)
    if mechanism == "flurka-eva":   # positions: 3 and 2 of the 8 compressed rows of 24 positions
        opts.update(window_size=9, chunk_size=6)
    opts.update(options)
    layer = make_attention(mechanism, d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN,
                           rngs=nnx.Rngs(seed), **opts)
    return randomize(layer, seed + 1000)


def inputs(seed, batch=3, seq=20, padded=True):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, seq, D_MODEL)).astype(np.float32)
    if padded:
        lengths = np.array([seq, seq - 7, 5][:batch])
        mask = np.arange(seq)[None, :] < lengths[:, None]
        mask[0, 3] = False  # one hole in the middle: masks need not be right-padded
    else:
        mask = np.ones((batch, seq), bool)
    return jnp.asarray(x), jnp.asarray(mask)


# -- small formula pieces ----------------------------------------------------------------------
def linear(x, lin):
    out = x @ f64(lin.kernel[...])
    return out + f64(lin.bias[...]) if lin.bias is not None else out


def heads(y, h=HEADS):
    n, d = y.shape
    return y.reshape(n, h, d // h).transpose(1, 0, 2)      # [h, n, d_h]


def softmax(s):
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, ln, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * f64(ln.scale[...]) + f64(ln.bias[...])


def proposal(seq_module, x):
    lin, ln = seq_module.layers
    return layer_norm(linear(x, lin), ln)


# -- cores: q [n, d], k/v [m, d] of real keys only ----------------------------------------------
def softmax_core(q, k, v):
    return softmax(q @ k.T / math.sqrt(q.shape[1])) @ v


def favor_core(q, k, v, omega, eps=1e-6):
    d, m = q.shape[1], omega.shape[0]
    qs, ks = q * d ** -0.25, k * d ** -0.25
    qd, kd = qs @ omega.T, ks @ omega.T
    ql = qd - 0.5 * (qs ** 2).sum(1, keepdims=True)
    kl = kd - 0.5 * (ks ** 2).sum(1, keepdims=True)
    qf = np.exp(ql - ql.max(1, keepdims=True)) + eps     # largest feature per query row = 1
    kf = np.exp(kl - kl.max()) + eps                      # largest key feature = 1
    qf, kf = qf / math.sqrt(m), kf / math.sqrt(m)
    num = qf @ (kf.T @ v)
    den = qf @ kf.sum(0)
    den = den + 2 * eps * (np.abs(den) <= eps)
    return num / den[:, None]


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(x))


def rnn_core(q, k, v, eps=1e-6):
    qf, kf = elu1(q), elu1(k)
    return (qf @ (kf.T @ v)) / (qf @ kf.sum(0) + eps)[:, None]


def eva_core(q, k, v, real, layer, noise, head):
    """EVA per head from the paper/official code; q, k, v [n, d] (all rows), real [n] bool."""
    n, d = q.shape
    s = d ** -0.5
    w, c = layer.window_size, layer.chunk_size
    unit = math.lcm(w, c)
    n_pad = -(-n // unit) * unit
    chunks = []
    for ci in range(n_pad // c):
        idx = [j for j in range(ci * c, min((ci + 1) * c, n)) if real[j]]
        if not idx:
            continue
        k_bar, q_bar = k[idx].mean(0), q[idx].mean(0)
        k_tilde = proposal(layer.adaptive_mu_k, k_bar)
        omega = 0.5 * (proposal(layer.adaptive_mu_q, q_bar) + k_tilde)
        if noise is not None:
            omega = omega + noise[ci, head]
        logw = s * k[idx] @ omega - 0.5 * s * (k[idx] ** 2).sum(1)
        chunks.append((k_tilde, softmax(logw) @ v[idx]))
    out = np.zeros((n, d))
    for i in range(n):
        g = i // w
        local = [j for j in range(g * w, min((g + 1) * w, n)) if real[j]]
        logits = [s * q[i] @ k[j] for j in local] + [s * q[i] @ kt for kt, _ in chunks]
        vals = [v[j] for j in local] + [beta for _, beta in chunks]
        out[i] = softmax(np.array(logits)) @ np.array(vals)
    return out


def compressed_rows(size, d_k, max_len):
    """A window or chunk of ``size`` positions in compressed rows: round(size·d_k/L), at least 1."""
    return max(1, int(math.floor(size * d_k / max_len + 0.5)))


def flurka_eva_core(q, k, v, real_q, real_k, layer, noise, head):
    """flurka-eva per head: EVA on the compressed rows. Query t sits at compressed position
    r(t) = ⌊t·d_k/L⌋; it attends exactly to the real rows of the window of w' rows holding r(t)
    and to every chunk of c' rows with a real row, summarised as in EVA with q̄ the mean of the
    real queries whose r(t) lies in the chunk (w', c': EVA's window and chunk in positions, scaled
    by d_k/L). Compressed rows that are not ``real_k`` are dropped."""
    n, d = q.shape
    m, big = k.shape[0], layer.max_len
    s = d ** -0.5
    w = compressed_rows(layer.window_size, m, big)
    c = compressed_rows(layer.chunk_size, m, big)
    padded = -(-m // math.lcm(w, c)) * math.lcm(w, c)
    r = [min(t * m // big, m - 1) for t in range(n)]
    chunks = []
    for ci in range(padded // c):
        keep = [j for j in range(ci * c, min((ci + 1) * c, m)) if real_k[j]]
        if not keep:
            continue
        mine = [t for t in range(n) if real_q[t] and r[t] // c == ci]
        q_bar = q[mine].mean(0) if mine else np.zeros(d)
        k_tilde = proposal(layer.adaptive_mu_k, k[keep].mean(0))
        omega = 0.5 * (proposal(layer.adaptive_mu_q, q_bar) + k_tilde)
        if noise is not None:
            omega = omega + noise[ci, head]
        logw = s * k[keep] @ omega - 0.5 * s * (k[keep] ** 2).sum(1)
        chunks.append((k_tilde, softmax(logw) @ v[keep]))
    out = np.zeros((n, d))
    for t in range(n):
        g = r[t] // w
        local = [j for j in range(g * w, min((g + 1) * w, m)) if real_k[j]]
        logits = [s * q[t] @ k[j] for j in local] + [s * q[t] @ kt for kt, _ in chunks]
        vals = [v[j] for j in local] + [beta for _, beta in chunks]
        out[t] = softmax(np.array(logits)) @ np.array(vals)
    return out


# -- whole layer ------------------------------------------------------------------------------
def reference(layer, x, mask, *, omega=None, noise="layer"):
    """Float64 output [b, n, d_model] of ``layer`` on x with bool mask, from the formulas."""
    mech = layer.mechanism
    x, mask = f64(x), np.asarray(mask)
    b, n, _ = x.shape
    out = np.zeros_like(x)
    if omega is None and hasattr(layer, "features"):
        omega = f64(layer.features[...])
    if isinstance(noise, str):
        noise = None if (not hasattr(layer, "noise") or layer.deterministic) else f64(layer.noise[...])
    for bi in range(b):
        xb, real = x[bi], mask[bi]
        q = heads(linear(xb, layer.query))
        if hasattr(layer, "seq_proj"):
            xm = xb * real[:, None]                         # E·(mask⊙X)
            e1 = f64(layer.seq_proj.e1[...])[..., :n]
            e2 = e1 if layer.seq_proj.e2 is None else f64(layer.seq_proj.e2[...])[..., :n]
            if e1.ndim == 3:                                 # per-head E
                k = np.stack([heads(linear(e1[h] @ xm, layer.key))[h] for h in range(HEADS)])
                v = np.stack([heads(linear(e2[h] @ xm, layer.value))[h] for h in range(HEADS)])
            else:
                k, v = heads(linear(e1 @ xm, layer.key)), heads(linear(e2 @ xm, layer.value))
            # a compressed row is real where E1's or E2's row weighs a real position (any head);
            # the others are bias-only keys of padding, dropped like padded keys
            weighs = (np.abs(e1) + np.abs(e2)) @ real.astype(np.float64) > 0
            kreal = weighs.any(axis=0) if weighs.ndim == 2 else weighs
        else:
            k, v = heads(linear(xb, layer.key)), heads(linear(xb, layer.value))
            kreal = real
        ctx = []
        for h in range(HEADS):
            qh, kh, vh = q[h], k[h][kreal], v[h][kreal]
            if mech in ("full", "flash", "linformer"):
                ctx.append(softmax_core(qh, kh, vh))
            elif mech in ("performer", "flurka-performer"):
                ctx.append(favor_core(qh, kh, vh, omega))
            elif mech in ("rnn", "flurka-rnn"):
                ctx.append(rnn_core(qh, kh, vh))
            elif mech == "eva":
                ctx.append(eva_core(qh, k[h], v[h], real, layer, noise, h))
            elif mech == "flurka-eva":
                ctx.append(flurka_eva_core(qh, k[h], v[h], real, kreal, layer, noise, h))
            else:
                raise AssertionError(mech)
        merged = np.stack(ctx, axis=1).reshape(n, -1)
        out[bi] = linear(merged, layer.out)
    return out
