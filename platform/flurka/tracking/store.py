"""Whether an MLflow tracking URI can be used, asked before any work: an existing SQLite file must
be a database (a read-only look), a database server or an MLflow server must answer within a
few seconds. Nothing is created; the error is one line without the password."""

from __future__ import annotations

import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

from flurka.results.db import DatabaseUnreachable, mask_url, probe

DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
PROBE_TIMEOUT_S = 5


def probe_tracking(uri: str, will_create: Path | None = None) -> None:
    """Raise :class:`flurka.results.db.DatabaseUnreachable` if ``uri`` cannot be used;
    ``will_create``: a directory the caller creates later (a SQLite file may go under it)."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme in DB_SCHEMES:
        try:
            probe(uri, will_create=will_create)
        except DatabaseUnreachable as exc:
            raise DatabaseUnreachable(f"MLflow store: {exc}") from None
    elif scheme in ("http", "https", "databricks"):
        if scheme == "databricks":
            return      # its own credentials and workspace: MLflow's client says what is wrong
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).close()
        except urllib.error.HTTPError:
            pass  # it answered
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DatabaseUnreachable(f"cannot reach the MLflow server at {mask_url(uri)}: "
                                      f"{' '.join(str(reason).split())}") from None
    else:   # a file store ("file:", a bare path): MLflow 3 refuses it, after Ray would have started
        raise DatabaseUnreachable(f"MLflow store {mask_url(uri)!r}: not a database or server; MLflow 3 keeps "
                                  "no new runs in file stores: give sqlite:///PATH.db, postgresql://… or "
                                  "http(s)://HOST:PORT")


ARTIFACTS = "mlartifacts"   # a SQLite store's artifacts: beside it (flurka.tracking.mlflow_runs.artifact_root_for)
_URI_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                ("logged_models", "artifact_location"))


def relocate_artifacts(db: Path) -> str | None:
    """MLflow records absolute artifact URIs, so a run dir moved elsewhere points its SQLite store
    at artifacts that are no longer there (and a copy at the original's). Where an experiment's
    root is a ``mlartifacts`` directory other than the one beside the store, and that one exists,
    rewrite the root of every URI to it (one transaction). Returns the line saying so, or None."""
    here = db.parent / ARTIFACTS
    if not here.is_dir():
        return None
    new = here.resolve().as_uri()
    con = sqlite3.connect(db)
    try:
        roots = {loc.rstrip("/") for (loc,) in con.execute("SELECT artifact_location FROM experiments")
                 if loc and loc.startswith("file:") and loc.rstrip("/").endswith(f"/{ARTIFACTS}")}
        gone = sorted(r for r in roots if r != new)
        if not gone:
            return None
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        with con:
            for old in gone:
                for table, column in _URI_COLUMNS:
                    if table in tables:
                        con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "   # noqa: S608
                                    f"WHERE substr({column}, 1, ?) = ?", (new, len(old) + 1, len(old), old))
        was = ", ".join(unquote(urlparse(r).path) for r in gone)
        return f"{db.parent} was moved or copied: its MLflow artifacts are now {here} (were {was})"
    finally:
        con.close()
