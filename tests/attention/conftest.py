"""Fixtures of the attention tests; the float64 references live in tests/support/attention_reference.py."""

from __future__ import annotations

import zlib

import pytest


@pytest.fixture
def rng_seed(request):
    """A fresh seed per test, different across tests and the same in every run (a CRC of the
    test id: ``hash`` of a string changes with each process's hash seed, which made the seeds,
    and the rare failure of a statistical bound, change from run to run)."""
    return zlib.crc32(request.node.nodeid.encode()) % (2 ** 31)
