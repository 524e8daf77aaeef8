"""Theory, measured: rank counting, Theorem 1's error behaviour, predicted vs measured speedups."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from flurka.attention import make_attention
from flurka import theory as T


@pytest.mark.parametrize("shape,rank", [((20, 15), 0), ((20, 15), 1), ((20, 15), 7),
                                        ((12, 30), 12), ((16, 16), 16)])
def test_numerical_rank_matches_numpy(shape, rank):
    rng = np.random.default_rng(rank)
    a = rng.standard_normal((shape[0], rank)) @ rng.standard_normal((rank, shape[1]))
    assert T.numerical_rank(a) == np.linalg.matrix_rank(a) == rank
    assert T.numerical_rank(a, tol=1e-6) == rank


def test_numerical_rank_tolerance_counts_large_singular_values():
    s = np.array([10.0, 1.0, 1e-3, 1e-9])
    u, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((6, 4)))
    a = (u * s) @ np.eye(4)
    assert T.numerical_rank(a, tol=1e-2) == 2 and T.numerical_rank(a, tol=1e-6) == 3


def _elu1(z):
    return np.where(z > 0, z + 1.0, np.exp(z))


def test_rnn_kernel_rank_against_numpy_reference():
    # heads of dim 4 and N=12: φ(Q)φ(K)ᵀ is 12×12 of rank ≤ 4 — the paper's low-rank observation.
    layer = make_attention("rnn", d_model=8, num_heads=2, max_len=12, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 12, 8))
    ranks = T.kernel_attention_ranks(layer, x)
    xn = np.asarray(x, np.float64)

    def proj(p):
        return xn @ np.asarray(p.kernel.value, np.float64) + np.asarray(p.bias.value, np.float64)

    q, k = proj(layer.query).reshape(2, 12, 2, 4), proj(layer.key).reshape(2, 12, 2, 4)
    expected = [[np.linalg.matrix_rank(_elu1(q[b, :, h]) @ _elu1(k[b, :, h]).T) for h in range(2)]
                for b in range(2)]
    assert ranks.tolist() == expected and ranks.max() <= 4


def test_flurka_kernel_rank_bounded_by_features_and_d_k():
    layer = make_attention("flurka-performer", d_model=16, num_heads=2, max_len=32, d_k=6,
                           num_features=5, rngs=nnx.Rngs(0))
    ranks = T.kernel_attention_ranks(layer, 0.5 * jax.random.normal(jax.random.key(2), (1, 32, 16)))
    assert ranks.shape == (1, 2) and 1 <= ranks.min() and ranks.max() <= 5
    with pytest.raises(ValueError, match="feature-map mechanism"):
        T.kernel_attention_ranks(make_attention("full", d_model=16, num_heads=2, max_len=32,
                                                rngs=nnx.Rngs(0)), np.ones((1, 4, 16)))


@pytest.fixture(scope="module")
def errors():
    x = 0.5 * jax.random.normal(jax.random.key(5), (2, 64, 32))  # same inputs for every seed
    return T.approximation_errors(d_model=32, num_heads=2, seq_len=64, d_k_values=[16],
                                  m_values=[4, 32, 256], seeds=[0, 1, 2], x=x,
                                  mechanisms=["full", "flash", "performer", "linformer",
                                              "flurka-performer"])


def test_same_weights_give_exact_attention(errors):
    for mech in ("full", "flash"):
        assert T.mean_error(errors, mechanism=mech) < 1e-5


def test_favor_error_decreases_with_m(errors):
    e = [T.mean_error(errors, mechanism="performer", m=m) for m in (4, 32, 256)]
    assert e[0] > e[1] > e[2] and e[2] < 0.5 * e[0]


def test_flurka_error_against_kernel_plus_low_rank(errors):
    low = T.mean_error(errors, mechanism="linformer", d_k=16)
    for m in (4, 32, 256):
        rows = [r for r in errors if r["mechanism"] == "flurka-performer" and r["m"] == m]
        for r in rows:  # Theorem 1's triangle inequality, per seed
            assert r["rel_error"] <= r["kernel_term"] + r["lowrank_term"] + 1e-9
        flurka = T.mean_error(errors, mechanism="flurka-performer", m=m, d_k=16)
        kernel = T.mean_error(errors, mechanism="performer", m=m)
        assert flurka <= 1.25 * (kernel + low)
    # as m grows the kernel term vanishes and FLuRKA tends to its Linformer
    terms = [T.mean_error(errors, "kernel_term", mechanism="flurka-performer", m=m)
             for m in (4, 32, 256)]
    assert terms[0] > terms[1] > terms[2]


def test_speedup_table_pairs_flurka_with_constituents():
    cfg = dict(mode="forward", scope="layer", seq_len=20000, d_model=2600, num_heads=8, d_k=1500,
               num_features=325, layers=6, ffn=512, dtype="bfloat16", batch=1, status="ok")
    results = [dict(cfg, mechanism="flurka-rnn", flops=100, median_s=1.0),
               dict(cfg, mechanism="linformer", flops=300, median_s=2.5),
               dict(cfg, mechanism="rnn", flops=150, median_s=0.8),
               dict(cfg, mechanism="performer", flops=999, median_s=9.0),
               dict(cfg, mechanism="full", status="oom", flops=5000, median_s=None)]
    rows = {r["baseline"]: r for r in T.speedup_table(results)}
    assert set(rows) == {"linformer", "rnn"}  # performer is not flurka-rnn's constituent
    assert rows["linformer"]["predicted_speedup"] == 3.0
    assert rows["linformer"]["measured_speedup"] == 2.5 and rows["linformer"]["agree"]
    assert rows["rnn"]["measured_speedup"] == 0.8 and rows["rnn"]["agree"] is False
    # N > d_k(H+2) > d_m > d_k > d_h: 20000 > 15000 > 2600 > 1500 > 325, so Claim 1 holds and
    # the paper's cost model predicts FLuRKA cheaper than both constituents
    assert rows["rnn"]["claim1"] is True and rows["linformer"]["claim2"] is True
    assert rows["linformer"]["paper_predicted_speedup"] > 1
    assert rows["rnn"]["paper_predicted_speedup"] > 1
    assert rows["rnn"]["ratio_spread"] is None


def test_speedup_table_reads_a_ratio_within_its_spread_as_a_tie():
    """flurka-rnn 0.95× rnn with 8 % and 4 % p10–p90 widths: spread 6 %, a tie (agree None);
    1.2× Linformer beyond its spread agrees with a predicted win."""
    cfg = dict(mode="forward", scope="layer", seq_len=20000, d_model=2600, num_heads=8, d_k=1500,
               num_features=325, layers=None, ffn=None, dtype="bfloat16", batch=1, status="ok")
    timed = lambda m, flops, t, w: dict(cfg, mechanism=m, flops=flops, median_s=t,  # noqa: E731
                                        p10_s=t * (1 - w / 2), p90_s=t * (1 + w / 2))
    rows = {r["baseline"]: r for r in T.speedup_table([timed("flurka-rnn", 100, 1.0, 0.08),
                                                       timed("rnn", 150, 0.95, 0.04),
                                                       timed("linformer", 300, 1.2, 0.04)])}
    assert rows["rnn"]["ratio_spread"] == pytest.approx(0.06)
    assert rows["rnn"]["measured_speedup"] == pytest.approx(0.95) and rows["rnn"]["agree"] is None
    assert rows["linformer"]["ratio_spread"] == pytest.approx(0.06) and rows["linformer"]["agree"] is True
