"""The driver's MLflow writes through a tracking server (or store) that restarts mid-sweep:
:class:`RetryingClient` is an ``MlflowClient`` whose every call is retried through an outage
(:class:`flurka.results.retry.Store`: backoff, a budget, one line when it goes and one when it is
back). MLflow's own HTTP retries (7, about 4 minutes, silent) are cut to one quick retry for these
calls — unless ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` is set — so the outage is said when it starts."""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import requests
import sqlalchemy as sa
from mlflow.exceptions import MlflowException

from flurka.results.retry import Store

# MLflow's HTTP retries while one of our retried calls runs (those not set by the user).
QUICK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
GAVE_UP = ("the sweep goes on: its trials' MLflow writes wait and are written when the server is back "
           "(what is still missing at the end, run the same command with --resume to log)")


def mlflow_transient(exc: BaseException) -> bool:
    """An MLflow error worth retrying: no connection, a timeout, a 5xx / 408 / 429 answer (a
    server restarting, a database behind it failing over, a locked SQLite store); never a 4xx
    (a bad request, a run that does not exist: retrying cannot help)."""
    if isinstance(exc, MlflowException):
        status = exc.get_http_status_code()
        return status >= 500 or status in (408, 429)
    if isinstance(exc, requests.exceptions.HTTPError):
        status = getattr(exc.response, "status_code", None)
        return status is None or status >= 500 or status in (408, 429)
    if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError,
                        TimeoutError)):
        return True
    return isinstance(exc, sa.exc.OperationalError)   # a SQLite tracking store another process locked


@contextlib.contextmanager
def quick_http():
    """MLflow's HTTP retries cut to one (see the module docstring) for the calls inside, and
    urllib3's warning on each of them ("Retrying (Retry(total=0, ...)) after connection broken")
    kept quiet: the outage is said once, by the store."""
    mine = {k: v for k, v in QUICK_HTTP.items() if k not in os.environ}
    os.environ.update(mine)
    pool_log = logging.getLogger("urllib3.connectionpool")
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        pool_log.setLevel(level)
        for k in mine:
            os.environ.pop(k, None)


def mlflow_store(what: str) -> Store:
    """The :class:`Store` of an MLflow tracking URI (``what``: it, masked, as the lines name it)."""
    return Store(what, mlflow_transient, gave_up=GAVE_UP)


class RetryingClient:
    """An ``MlflowClient`` whose public methods run through ``store.call`` (each retried; inside a
    unit the tracker retries as a whole, once, with it). ``raw``: the client itself."""

    def __init__(self, client, store: Store):
        self.raw = client
        self.store = store

    def __getattr__(self, name: str):
        attr = getattr(self.raw, name)
        if name.startswith("_") or not callable(attr):
            return attr

        @functools.wraps(attr)
        def retried(*args, **kwargs):
            return self.store.call(_quick, attr, *args, **kwargs)
        return retried


def _quick(fn, *args, **kwargs):
    with quick_http():
        return fn(*args, **kwargs)


__all__ = ["RetryingClient", "mlflow_transient", "mlflow_store", "quick_http", "GAVE_UP"]
