"""Whether an MLflow tracking URI can be used, asked before any work: an existing SQLite file must
be a database (a read-only look), a database server or an MLflow server must answer within a
few seconds. Nothing is created; the error is one line without the password."""

from __future__ import annotations

from pathlib import Path

DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
PROBE_TIMEOUT_S = 5


def probe_tracking(uri: str, will_create: Path | None = None) -> None:
    """Raise :class:`flurka.results.db.DatabaseUnreachable` if ``uri`` cannot be used;
    ``will_create``: a directory the caller creates later (a SQLite file may go under it)."""
    from flurka.results.db import DatabaseUnreachable, mask_url, probe

    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme in DB_SCHEMES:
        try:
            probe(uri, will_create=will_create)
        except DatabaseUnreachable as exc:
            raise DatabaseUnreachable(f"MLflow store: {exc}") from None
    elif scheme in ("http", "https"):
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).close()
        except urllib.error.HTTPError:
            pass  # it answered
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DatabaseUnreachable(f"cannot reach the MLflow server at {mask_url(uri)}: "
                                      f"{' '.join(str(reason).split())}") from None
