"""Helpers for the platform tests: tiny sweep settings and an MLflow reader."""

from __future__ import annotations

import pytest

# A sweep small enough for 2 shared CPU cores: 1-layer d_model 16 models, 8 steps.
TINY_OVERRIDES = dict(warmup_steps=0, eval_every=0, log_every=2, batch_size=8, eval_batches=1,
                      model=dict(d_model=16, d_ff=32, num_layers=1))


@pytest.fixture
def tiny_overrides():
    return dict(TINY_OVERRIDES)


@pytest.fixture
def mlflow_runs():
    """``(client, runs)`` of an MLflow experiment."""
    from mlflow.tracking import MlflowClient

    def read(uri: str, experiment: str):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        return client, client.search_runs([exp.experiment_id], max_results=1000)

    return read

