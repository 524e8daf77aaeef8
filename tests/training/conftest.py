"""Fixtures of the training tests; the tiny configs live in tests/support/training_helpers.py."""

import pytest


@pytest.fixture(scope="session")
def digits():
    from flurka.data import get_dataset
    return get_dataset("lra-image-small", seed=0)
