"""Fixtures of the attention tests; the float64 references live in tests/support/attention_reference.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def rng_seed(request):
    """A fresh seed per test (stable per test id, different across tests)."""
    return abs(hash(request.node.nodeid)) % (2 ** 31)
