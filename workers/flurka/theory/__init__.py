"""The paper's theory, stated and measured: its cost model and claims 1-3
(:mod:`flurka.theory.cost_model`, printed by ``flurka flops``: :mod:`flurka.theory.flops_cli`),
approximation error (Theorem 1), rank of kernelized attention (Fig. 2's observation), and the
FLOP models' predicted speedups against measured ones. Its JSON writer is
``python -m flurka.theory`` (:mod:`flurka.theory.cli`); :mod:`flurka.theory.trained` measures
the same on a trained model's own layer inputs.

Approximation error. Every approximation is compared with full attention *with the same
W_Q, W_K, W_V, W_O* (copied by attribute name; the names are uniform across mechanisms), on the
same inputs: ``rel_error = ‖out − full‖_F / ‖full‖_F`` and ``inf_error = ‖out − full‖_∞`` (max
row sum of |·|, Theorem 1's norm), per example then averaged over seeds. For FLuRKA the random
objects are *shared with its constituents*: ``flurka-X`` gets linformer's E1/E2 and X's random
features, so its error can be set against kernel-only error + low-rank-only error (Theorem 1's
triangle inequality: ‖F − A‖ ≤ ‖F − L‖ + ‖L − A‖, with L the Linformer output).
Inputs are random by default; pass ``x`` and ``mask`` (a trained model's captured layer inputs,
:mod:`flurka.theory.trained`) and the ``full`` layer carrying that model's projections to measure
the same on real activations (errors then count real rows only).

Rank. ``kernel_attention_ranks`` counts the singular values of φ(Q)φ(K)ᵀ, per example and head,
above a tolerance (NumPy's ``matrix_rank`` rule by default), for the feature-map mechanisms
(performer, rnn and their FLuRKA variants; EVA has no single φ(Q)φ(K)ᵀ).

Speedups. ``speedup_table`` pairs every FLuRKA result with its constituents (and full/flash) at
the same configuration: predicted = FLOP-model ratio, measured = median step-time ratio, with the
paper's claims evaluated at that shape, so a regime boundary can be checked against measurement.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx

from flurka.attention import make_attention
from flurka.attention import flops as flop_model
from flurka.theory import cost_model
from flurka.attention.feature_maps import elu_features, favor_features

PROJECTIONS = ("query", "key", "value", "out")
# Random objects a FLuRKA layer shares with its constituents (copied when present in both).
SHARED = PROJECTIONS + ("seq_proj", "features", "noise", "adaptive_mu_q", "adaptive_mu_k")
FEATURE_MECHANISMS = ("performer", "rnn", "flurka-performer", "flurka-rnn")


def uses(mech: str) -> tuple[bool, bool]:
    """(uses d_k, uses m) of a mechanism: the grid axes its error and rank rows vary over."""
    return mech == "linformer" or mech in flop_model.FLURKA, mech.removeprefix("flurka-") == "performer"


def layer_options(d_k: int | None, m: int | None) -> dict[str, int]:
    """make_attention's options for a grid point (None: the mechanism does not use it)."""
    return {**({"d_k": d_k} if d_k is not None else {}),
            **({"num_features": m} if m is not None else {})}


# ---------------------------------------------------------------------------------------------
# Copying parameters by attribute name
# ---------------------------------------------------------------------------------------------
def copy_shared(src: nnx.Module, dst: nnx.Module, names: Iterable[str] = SHARED) -> list[str]:
    """Copy each attribute in ``names`` that both layers have (modules by state, variables by
    value; a variable whose shapes differ is left alone); returns the names copied."""
    copied = []
    for name in names:
        a, b = getattr(src, name, None), getattr(dst, name, None)
        if a is None or b is None:
            continue
        if isinstance(a, nnx.Variable):
            if a.value.shape != b.value.shape:
                continue
            b.value = a.value
        else:
            nnx.update(b, nnx.state(a))
        copied.append(name)
    return copied


def _rel(diff: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-example ‖diff‖_F / ‖ref‖_F."""
    return (np.linalg.norm(diff.reshape(len(diff), -1), axis=1)
            / np.linalg.norm(ref.reshape(len(ref), -1), axis=1))


def _errors(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Relative Frobenius and ∞-norm (max row sum) errors, averaged over the batch."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    diff = out - ref
    inf = np.abs(diff).sum(axis=-1).max(axis=-1)
    return {"rel_error": float(_rel(diff, ref).mean()), "inf_error": float(inf.mean())}


@jax.jit
def _apply_jit(graphdef, state, x, mask):
    return nnx.merge(graphdef, state)(x, mask)


def apply(layer: nnx.Module, x: jax.Array, mask: jax.Array | None = None) -> np.ndarray:
    """layer(x, mask) through one jit per layer structure (layers differing only in their draws
    share the compiled code), as float64 NumPy."""
    graphdef, state = nnx.split(layer)
    return np.asarray(_apply_jit(graphdef, state, x, mask), np.float64)


def approximation_errors(*, d_model: int, num_heads: int, seq_len: int,
                         d_k_values: Sequence[int], m_values: Sequence[int],
                         mechanisms: Sequence[str] = tuple(flop_model.MECHANISMS),
                         seeds: Sequence[int] = (0, 1, 2), batch: int = 2,
                         x: jax.Array | None = None, mask: jax.Array | None = None,
                         full: nnx.Module | None = None) -> list[dict[str, Any]]:
    """Error of every mechanism vs full attention over a grid of d_k and m, per seed: the rows of
    :func:`iter_approximation_errors` (same arguments) as a list."""
    return list(iter_approximation_errors(d_model=d_model, num_heads=num_heads, seq_len=seq_len,
                                          d_k_values=d_k_values, m_values=m_values,
                                          mechanisms=mechanisms, seeds=seeds, batch=batch, x=x,
                                          mask=mask, full=full))


def iter_approximation_errors(*, d_model: int, num_heads: int, seq_len: int,
                              d_k_values: Sequence[int], m_values: Sequence[int],
                              mechanisms: Sequence[str] = tuple(flop_model.MECHANISMS),
                              seeds: Sequence[int] = (0, 1, 2), batch: int = 2,
                              x: jax.Array | None = None, mask: jax.Array | None = None,
                              full: nnx.Module | None = None) -> Iterator[dict[str, Any]]:
    """Error of every mechanism vs full attention over a grid of d_k and m, per seed, one row at
    a time (a caller may stop between rows: ``flurka theory`` on a signal).

    Rows: {mechanism, d_k, m, seed, rel_error, inf_error}; mechanisms that use neither d_k nor m
    appear once per seed with d_k = m = None. FLuRKA rows add Theorem 1's two terms (relative,
    Frobenius): ``kernel_term`` = ‖F − L‖/‖A‖ (kernel error on the compressed keys) and
    ``lowrank_term`` = ‖L − A‖/‖A‖, with F, L, A the FLuRKA, Linformer and full outputs; so
    rel_error ≤ kernel_term + lowrank_term. Per seed: one ``full`` layer (unless given) and one
    input ``x`` (unless given, standard normal; ``mask`` [batch, seq] marks its real tokens); for
    each (d_k, m) one linformer, one of each kernel, and FLuRKA layers reusing those draws (see
    the module docstring).
    """
    for seed in seeds:
        ref_layer = full or make_attention("full", d_model=d_model, num_heads=num_heads,
                                           max_len=seq_len, rngs=nnx.Rngs(seed))
        xs = x if x is not None else jax.random.normal(jax.random.key(seed),
                                                       (batch, seq_len, d_model))
        keep = 1.0 if mask is None else np.asarray(mask, np.float64)[..., None]
        ref = apply(ref_layer, xs, mask) * keep  # padded rows count in no error
        built: dict[tuple, nnx.Module] = {}
        outputs: dict[tuple, np.ndarray] = {}

        def layer(mech: str, d_k: int | None, m: int | None) -> nnx.Module:
            if (mech, d_k, m) not in built:
                new = make_attention(mech, d_model=d_model, num_heads=num_heads, max_len=seq_len,
                                     rngs=nnx.Rngs(1000 * seed + len(built) + 1),
                                     **layer_options(d_k, m))
                copy_shared(ref_layer, new, PROJECTIONS)
                if mech in flop_model.FLURKA:  # share E1/E2 and the kernel's random features
                    kernel = mech.removeprefix("flurka-")
                    copy_shared(layer("linformer", d_k, None), new, ("seq_proj",))
                    copy_shared(layer(kernel, None, m if kernel == "performer" else None),
                                new, ("features", "noise", "adaptive_mu_q", "adaptive_mu_k"))
                built[(mech, d_k, m)] = new
            return built[(mech, d_k, m)]

        def output(mech: str, d_k: int | None, m: int | None) -> np.ndarray:
            if (mech, d_k, m) not in outputs:
                outputs[(mech, d_k, m)] = apply(layer(mech, d_k, m), xs, mask) * keep
            return outputs[(mech, d_k, m)]

        for mech in mechanisms:
            uses_dk, uses_m = uses(mech)
            grid = itertools.product(d_k_values if uses_dk else [None],
                                     m_values if uses_m else [None])
            for d_k, m in grid:
                out = output(mech, d_k, m)
                row = {"mechanism": mech, "d_k": d_k, "m": m, "seed": seed, **_errors(out, ref)}
                if mech in flop_model.FLURKA:
                    low = output("linformer", d_k, None)
                    row["kernel_term"] = float(_rel(out - low, ref).mean())
                    row["lowrank_term"] = float(_rel(low - ref, ref).mean())
                yield row


def mean_error(rows: Sequence[dict], metric: str = "rel_error", **where) -> float:
    """Mean of ``metric`` over the rows matching ``where`` (e.g. mechanism="performer", m=16)."""
    vals = [r[metric] for r in rows if all(r.get(k) == v for k, v in where.items())]
    if not vals:
        raise ValueError(f"no error rows match {where}")
    return float(np.mean(vals))


# ---------------------------------------------------------------------------------------------
# Rank of kernelized attention
# ---------------------------------------------------------------------------------------------
def numerical_rank(matrix: np.ndarray, tol: float | None = None) -> int:
    """Singular values above ``tol`` (default: NumPy's σ_max · max(M, N) · eps, float64)."""
    a = np.asarray(matrix, np.float64)
    if a.ndim != 2:
        raise ValueError(f"numerical_rank needs a 2-D matrix, got shape {a.shape}")
    s = np.linalg.svd(a, compute_uv=False)
    if tol is None:
        tol = (s.max() if s.size else 0.0) * max(a.shape) * np.finfo(np.float64).eps
    return int((s > tol).sum())


def kernel_features(layer: nnx.Module, x: jax.Array, mask: jax.Array | None = None
                    ) -> tuple[jax.Array, jax.Array]:
    """φ(Q) [b, n, h, f] and φ(K) [b, n_k, h, f] of a feature-map layer (keys compressed first
    for FLuRKA, as the layer itself does, padded rows zeroed before its projections)."""
    mech = getattr(layer, "mechanism", None)
    if mech not in FEATURE_MECHANISMS:
        raise ValueError(f"rank needs a feature-map mechanism ({', '.join(FEATURE_MECHANISMS)}), "
                         f"got {mech!r}")
    if mech.startswith("flurka-"):
        (q, k, _), key_mask = layer.low_rank_qkv(x, mask), None
    else:
        q, k, key_mask = layer.heads(layer.query, x), layer.heads(layer.key, x), mask
    if mech.endswith("performer"):
        omega = layer.features.value
        return (favor_features(q, omega, is_query=True),
                favor_features(k, omega, is_query=False, mask=key_mask))
    return elu_features(q), elu_features(k, key_mask)


def kernel_attention_ranks(layer: nnx.Module, x: jax.Array, tol: float | None = None,
                           mask: jax.Array | None = None) -> np.ndarray:
    """[batch, heads] numerical ranks of φ(Q)φ(K)ᵀ (unnormalised kernelized attention); with a
    ``mask``, over each example's real queries and keys only (FLuRKA: all d_k compressed keys)."""
    qf, kf = (np.asarray(t, np.float64) for t in kernel_features(layer, x, mask))
    b, n, h, _ = qf.shape
    real = np.ones((b, n), bool) if mask is None else np.asarray(mask, bool)
    compressed = kf.shape[1] != n or layer.mechanism.startswith("flurka-")
    return np.array([[numerical_rank(qf[i, real[i], j]
                                     @ (kf[i, :, j] if compressed else kf[i, real[i], j]).T, tol)
                      for j in range(h)] for i in range(b)])


def rank_rows(layer: nnx.Module, x: jax.Array, mask: jax.Array | None = None,
              tol: float | None = None) -> list[dict[str, Any]]:
    """One row per example and head: {mechanism, example, head, rank, max_rank, d_k, m}, with
    ``max_rank`` = min(real queries, keys) (FLuRKA's keys: its d_k compressed rows)."""
    ranks = kernel_attention_ranks(layer, x, tol, mask=mask)
    mech = layer.mechanism
    uses_dk, uses_m = uses(mech)
    d_k = layer.d_k if uses_dk else None
    real = (np.full(x.shape[0], x.shape[1]) if mask is None else np.asarray(mask).sum(axis=1))
    return [{"mechanism": mech, "example": example, "head": head, "rank": int(ranks[example, head]),
             "max_rank": int(min(real[example], d_k or real[example])), "d_k": d_k,
             "m": layer.num_features if uses_m else None}
            for example in range(ranks.shape[0]) for head in range(ranks.shape[1])]


# ---------------------------------------------------------------------------------------------
# Predicted vs measured speedups
# ---------------------------------------------------------------------------------------------
CONFIG_KEYS = ("mode", "scope", "seq_len", "d_model", "num_heads", "d_k", "num_features",
               "layers", "ffn", "dtype", "batch")
PAPER_KIND = {"linformer": "low-rank", "performer": "kernel", "rnn": "kernel", "eva": "kernel"}


def _width(result: dict) -> float | None:
    """A result's p10–p90 width over its median (None without them)."""
    if result.get("p10_s") is None or result.get("p90_s") is None:
        return None
    return (result["p90_s"] - result["p10_s"]) / result["median_s"]


def speedup_table(results: Sequence[dict]) -> list[dict[str, Any]]:
    """One row per (FLuRKA result, baseline result) at the same configuration.

    ``predicted_speedup`` = baseline FLOPs / FLuRKA FLOPs (our exact FLOP model),
    ``paper_predicted_speedup`` = the same from the paper's appendix-B cost model (layer scope),
    ``measured_speedup`` = baseline median_s / FLuRKA median_s, its ``ratio_spread`` (half the
    sum of the two times' p10–p90 widths over their medians, as the report reads it; None
    without p10/p90), and the claims at this shape. ``agree`` says whether "FLuRKA needs fewer
    FLOPs" and "FLuRKA ran faster" coincide; None where the ratio is within its spread (a tie).
    """
    groups: dict[tuple, dict[str, dict]] = {}
    for r in results:
        if r.get("status") == "ok":
            groups.setdefault(tuple(r.get(k) for k in CONFIG_KEYS), {})[r["mechanism"]] = r
    rows = []
    for cfg, by_mech in groups.items():
        config = dict(zip(CONFIG_KEYS, cfg))
        N, d_m, d_k, H = config["seq_len"], config["d_model"], config["d_k"], config["num_heads"]
        claims = cost_model.claims_at(N, d_m, d_k, H) if d_k else {}
        for mech in flop_model.FLURKA:
            if mech not in by_mech:
                continue
            f = by_mech[mech]
            kernel = mech.removeprefix("flurka-")
            for base in ("linformer", kernel, "full", "flash"):
                if base not in by_mech:
                    continue
                b = by_mech[base]
                pred = (b["flops"] / f["flops"]) if b.get("flops") and f.get("flops") else None
                paper = None
                if base in PAPER_KIND and d_k:
                    paper = cost_model.paper_speedup_at(PAPER_KIND[base], N, d_m, d_k, H)
                meas = b["median_s"] / f["median_s"]
                widths = [_width(f), _width(b)]
                spread = None if None in widths else sum(widths) / 2
                tie = abs(meas - 1) <= (spread or 0.0)
                rows.append({**config, "mechanism": mech, "baseline": base,
                             "predicted_speedup": pred, "paper_predicted_speedup": paper,
                             "measured_speedup": meas, "ratio_spread": spread, **claims,
                             "agree": None if pred is None or tie else (pred > 1) == (meas > 1)})
    return rows
