"""``contract``'s CPU lowering (``base.batched_dot``: operands transposed to one canonical
dot_general) is the einsum it replaces: values and both cotangents against numpy's float64
einsum (the cotangents are einsums of the output cotangent), for every layout the
mechanisms use and for specs it must hand back to ``jnp.einsum``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flurka.attention.base import batched_dot, contract

SIZES = dict(b=2, n=5, q=5, k=4, m=3, h=2, d=3, e=2, f=4, c=2, j=3, g=2, i=3)
SPECS = ["bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd", "bnhd,md->bnhm", "bmhf,bmhd->bhfd",
         "bnhf,bhfd->bhnd", "bnhf,bhf->bnh", "kn,bnd->bkd", "hkn,bnd->bhkd",
         "bcjhd,bchd->bchj", "bhgij,bgjhd->bgihd", "bhnc,bchd->bnhd",
         "bii,bi->bi", "bnd,bne->de"]


def _operands(spec, seed=0):
    lhs, rhs = spec.split("->")[0].split(",")
    rng = np.random.default_rng(seed)
    return [rng.normal(size=[SIZES[c] for c in t]) for t in (lhs, rhs)]


@pytest.mark.parametrize("spec", SPECS)
def test_batched_dot_is_the_einsum(spec):
    a, b = _operands(spec)
    want = np.einsum(spec, a, b)
    got = batched_dot(spec, jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_contract_and_its_gradient_on_cpu(spec):
    a, b = _operands(spec, seed=1)
    out = np.einsum(spec, a, b)
    g = np.random.default_rng(2).normal(size=out.shape)
    lhs, rhs = spec.split("->")[0].split(",")
    res = spec.split("->")[1]
    want_da = np.einsum(f"{res},{rhs}->{lhs}", g, b) if "bii" not in spec else None
    y, vjp = jax.vjp(lambda a, b: contract(spec, a, b, jnp.float32),
                     jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), out, rtol=1e-5, atol=1e-5)
    da, db = vjp(jnp.asarray(g, jnp.float32))
    np.testing.assert_allclose(np.asarray(db), np.einsum(f"{lhs},{res}->{rhs}", a, g),
                               rtol=1e-4, atol=1e-5)
    if want_da is not None:
        np.testing.assert_allclose(np.asarray(da), want_da, rtol=1e-4, atol=1e-5)
