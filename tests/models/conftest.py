"""Fixtures of the models tests; the tiny settings live in tests/support/model_helpers.py."""

from __future__ import annotations

import jax
import pytest

from flurka.attention import MECHANISMS


@pytest.fixture(params=MECHANISMS)
def mechanism(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _fast_xla_compiles():
    """Tiny graphs: XLA's optimization passes cost far more than they save (≈2.5× faster here).
    Scoped to these tests; restored afterwards."""
    previous = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)
