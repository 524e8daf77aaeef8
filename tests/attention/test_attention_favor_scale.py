"""FAVOR+ at large logit scales (e.g. Linformer-compressed keys after training): the float32
stabilisers must cancel exactly, so the layer matches the unstabilised float64 formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flurka.attention.feature_maps import gaussian_orthogonal_matrix
from flurka.attention.performer import favor_attention


def favor64(q, k, v, omega):
    """φ(x) = m^-1/2 exp(ωᵀx' − |x'|²/2), x' = d^-1/4 x, in float64, no stabiliser, no eps."""
    d, m = q.shape[-1], omega.shape[0]
    def phi(x):
        x = x * d ** -0.25
        return np.exp(x @ omega.T - 0.5 * (x * x).sum(-1, keepdims=True)) / np.sqrt(m)
    qf, kf = phi(q), phi(k)
    return (qf @ (kf.T @ v)) / (qf @ kf.sum(0))[:, None]


@pytest.mark.parametrize("half_sq_norm", [0.5, 7.0, 12.0])   # |k'|²/2; trained Linformer keys: ~7
def test_favor_matches_float64_formula_at_large_key_norms(half_sq_norm):
    rng = np.random.default_rng(0)
    n, m, d = 24, 64, 16
    q = rng.standard_normal((n, d)) * 0.5
    k = rng.standard_normal((n, d))
    k *= np.sqrt(2 * half_sq_norm) * d ** 0.25 / np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((n, d))
    omega = np.asarray(gaussian_orthogonal_matrix(jax.random.key(1), m, d), np.float64)
    got = favor_attention(*(jnp.asarray(t[None, :, None, :], jnp.float32) for t in (q, k, v)),
                          None, jnp.asarray(omega, jnp.float32))
    want = favor64(q, k, v, omega)
    got = np.asarray(got[0, :, 0], np.float64)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-3, err
    # / np.linalg.norm(want) < 1e-3
