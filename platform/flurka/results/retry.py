"""A store that restarts mid-sweep (maintenance, a failover) costs nothing: the driver's writes
to it are retried with exponential backoff for up to a budget per outage.

A :class:`Store` wraps one store (the MLflow server, the results database). Its :meth:`Store.call`
runs a write; a *transient* error (its ``transient`` says which: a refused connection, a 5xx, a
locked SQLite file — never a bad request) starts an outage, said in one line on stderr::

    [flurka] MLflow server at http://127.0.0.1:5000 unreachable (Connection refused); retrying for up to 300 s

and the write is tried again, 0.5 s later, then 1, 2, 4 ... (at most 15 s apart), until it
passes (``[flurka] MLflow server at ... is back after 7 s``) or the budget is spent: then
:class:`StoreUnavailable` (one line) is raised, and every later write is tried once, without
waiting, until one passes. The budget is ``$FLURKA_STORE_RETRY_S`` seconds (default 300; 0: no
retrying, the outage said in one line with what happens now).

A write must be idempotent to be retried (a lost answer to one that did land is retried too); a
unit of several writes that is idempotent as a whole (find a run, else create it) is one
:meth:`Store.call` — the calls inside it are not retried one by one.
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from typing import Any, Callable, TypeVar

import sqlalchemy as sa

from flurka.results.db import DatabaseUnreachable, mask_url, redact

BUDGET_ENV = "FLURKA_STORE_RETRY_S"
DEFAULT_BUDGET_S = 300.0
FIRST_WAIT_S = 0.5
MAX_WAIT_S = 15.0

T = TypeVar("T")


class StoreUnavailable(DatabaseUnreachable):
    """A store stayed unreachable for the whole retry budget; one line, without the password."""


def budget_s() -> float:
    """Seconds an outage is retried for: ``$FLURKA_STORE_RETRY_S`` (default 300; 0: no retry)."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_BUDGET_S
    except ValueError:
        return DEFAULT_BUDGET_S
    return max(value, 0.0)


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\"\])]+)")


def _driver_error(exc: BaseException) -> BaseException:
    """The SQLAlchemy error behind a :class:`DatabaseUnreachable` from ``db.connect`` (raised
    ``from None``: its context still holds it), else ``exc``."""
    if isinstance(exc, DatabaseUnreachable) and isinstance(exc.__context__, sa.exc.DBAPIError):
        return exc.__context__
    return exc


# libpq's "connection to server at "127.0.0.1", port 5432 failed: Connection refused": the last part
_LIBPQ_FAILED = re.compile(r"^(?:connection failed: )?connection to server .*? failed: ")


def reason(exc: BaseException) -> str:
    """What went wrong, in a few words: "Connection refused", "database is locked", "HTTP 503"."""
    exc = _driver_error(exc)
    text = " ".join(str(exc).split())
    found = _ERRNO.search(text)
    if found:
        return found.group(1).strip()
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status:
        return f"HTTP {status}"
    orig = getattr(exc, "orig", None)     # SQLAlchemy's: the driver's own message, without the SQL
    if orig is not None:                  # its first line: libpq's hint ("Is the server running...") left out
        text = next((" ".join(line.split()) for line in str(orig).splitlines() if line.strip()), "")
        text = _LIBPQ_FAILED.sub("", text)
    text = text.split(" [SQL:")[0] or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _say(line: str) -> None:
    print(f"[flurka] {line}", file=sys.stderr, flush=True)


class Store:
    """One store's outages: see the module docstring. ``what`` names it in the lines (no
    password: the caller masks it); ``gave_up`` is what the line on a spent budget adds (what
    happens to the writes now)."""

    def __init__(self, what: str, transient: Callable[[BaseException], bool], *, budget: float | None = None,
                 gave_up: str = "", sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.what = what
        self.transient = transient
        self.budget = budget
        self.gave_up_line = gave_up
        self.sleep, self.clock = sleep, clock
        self.down_since: float | None = None    # the outage now going on (clock time), if any
        self.given_up = False                   # its budget is spent: one try per write until it is back
        self.outages = 0                        # outages seen (each said in one line)
        self._depth = 0

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, retried through an outage (see the module docstring)."""
        if self._depth:             # inside a unit that is retried as a whole
            return fn(*args, **kwargs)
        self._depth += 1
        try:
            return self._retried(fn, args, kwargs)
        finally:
            self._depth -= 1

    def _retried(self, fn, args, kwargs):
        budget = budget_s() if self.budget is None else self.budget
        wait = FIRST_WAIT_S
        while True:
            try:
                out = fn(*args, **kwargs)
            except Exception as exc:
                if not self.transient(exc):
                    raise
                now = self.clock()
                if self.down_since is None:
                    self.down_since, self.outages = now, self.outages + 1
                    if budget <= 0:         # no retrying: the one line says what now
                        self.given_up = True
                        _say(f"{self.what} unreachable ({reason(exc)})"
                             + (f"; {self.gave_up_line}" if self.gave_up_line else ""))
                    else:
                        _say(f"{self.what} unreachable ({reason(exc)}); retrying for up to {budget:g} s")
                left = self.down_since + budget - now
                if self.given_up or left <= 0:
                    if not self.given_up:
                        self.given_up = True
                        _say(f"{self.what} still unreachable after {now - self.down_since:.0f} s"
                             + (f"; {self.gave_up_line}" if self.gave_up_line else ""))
                    raise StoreUnavailable(f"{self.what} unreachable ({reason(exc)}) for "
                                           f"{now - self.down_since:.0f} s") from exc
                self.sleep(min(wait * random.uniform(1.0, 1.25), left))
                wait = min(wait * 2, MAX_WAIT_S)
                continue
            if self.down_since is not None:
                _say(f"{self.what} is back after {self.clock() - self.down_since:.0f} s")
                self.down_since, self.given_up = None, False
            return out


# -- the results database ---------------------------------------------------------------------------

_SQLITE_TRANSIENT = ("locked", "busy")


# A server that answers "no" (libpq gives these no SQLSTATE at connect time): a wrong password, a
# user or database that does not exist, pg_hba.conf refusing the host. No restart ends them.
_SERVER_REFUSED = ("authentication failed", "no password supplied", "does not exist", "pg_hba.conf",
                   "permission denied")


def db_transient(exc: BaseException) -> bool:
    """A database error worth retrying: a lost or refused connection, a server starting or shutting
    down, a SQLite file locked by another writer; not a wrong password or database name, a
    constraint, a missing table or bad SQL. Also a :class:`DatabaseUnreachable` from
    ``db.connect`` (a command's first connection), by the error behind it."""
    exc = _driver_error(exc)
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        orig = getattr(exc, "orig", None)
        text = str(orig).lower()
        if type(orig).__module__.startswith("sqlite3"):
            return any(word in text for word in _SQLITE_TRANSIENT)
        return not any(words in text for words in _SERVER_REFUSED)
    return isinstance(exc, sa.exc.TimeoutError)   # the pool's: no connection came back in time


SWEEP_GAVE_UP = ("the sweep's results stay in its run dir (sweep-record.json): `flurka ingest` or --resume loads "
                 "them when it is back")


def db_store(engine_or_url, gave_up: str = SWEEP_GAVE_UP) -> Store:
    """The retrying :class:`Store` of a results database, named by its engine or URL (its engine
    pings each pooled connection before use, :func:`flurka.results.db.connect`, so a restarted
    server's stale connections are replaced, not failed on). ``gave_up``: what the line on a spent
    budget adds (default: the sweep's)."""
    url = getattr(engine_or_url, "url", engine_or_url)
    try:
        name = redact(url)
    except Exception:   # no URL: the first connection says so, in its own line
        name = mask_url(str(url))
    return Store(f"results DB {name}", db_transient, gave_up=gave_up)


__all__ = ["Store", "StoreUnavailable", "budget_s", "reason", "db_transient", "db_store", "BUDGET_ENV"]
