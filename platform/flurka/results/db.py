"""Opening the results database and migrating it.

``connect`` fails at once, with one line that never shows the password, when the database
cannot be reached, so a sweep stops before its first trial rather than after its last.
``upgrade`` is the only way the schema is created: Alembic, run through its Python API from
the migrations inside this package (works from an installed wheel; no alembic.ini).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL, Engine

MIGRATIONS = Path(__file__).with_name("migrations")
DEFAULT_URL = "sqlite:///flurka-results.db"
CONNECT_TIMEOUT_S = 5


class DatabaseUnreachable(RuntimeError):
    """The database at a URL cannot be opened; the message is one line without the password."""


class SchemaOutOfDate(RuntimeError):
    """The database exists but is not migrated to this code's schema."""


def redact(url: str | URL) -> str:
    """The URL as text with the password removed (``postgresql://user@host:port/db``)."""
    u = sa.make_url(url)
    return URL.create(u.drivername, u.username, None, u.host, u.port, u.database, u.query).render_as_string()


def _fail(url: str | URL, reason: object) -> DatabaseUnreachable:
    line = " ".join(str(reason).split()) or type(reason).__name__
    return DatabaseUnreachable(f"cannot reach {redact(url)}: {line}")


def _check_sqlite_path(u: URL) -> None:
    db = u.database
    if db and db != ":memory:" and not db.startswith("file:"):
        parent = Path(db).expanduser().resolve().parent
        if not parent.is_dir():
            raise _fail(u, f"directory {parent} does not exist")


def connect(url: str | URL = DEFAULT_URL) -> Engine:
    """An engine for ``url`` whose database answered a first connection (else DatabaseUnreachable)."""
    try:
        u = sa.make_url(url)
    except sa.exc.ArgumentError as e:
        raise DatabaseUnreachable(f"cannot parse database URL {str(url)!r}: {e}") from None
    connect_args: dict[str, object] = {}
    if u.get_backend_name() == "sqlite":
        _check_sqlite_path(u)
    elif u.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    try:
        engine = sa.create_engine(u, connect_args=connect_args, pool_pre_ping=True)
    except Exception as e:  # unknown dialect, missing driver
        raise _fail(u, e) from None
    if u.get_backend_name() == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.DBAPIError as e:
        engine.dispose()
        raise _fail(u, e.orig if e.orig is not None else e) from None
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")  # SQLite ignores foreign keys unless asked
    cur.close()


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(url_or_engine: str | URL | Engine = DEFAULT_URL, revision: str = "head") -> Engine:
    """Migrate the database to ``revision`` (default: the newest schema); returns its engine."""
    engine = url_or_engine if isinstance(url_or_engine, Engine) else connect(url_or_engine)
    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    return engine


def open_results(url: str | URL = DEFAULT_URL) -> Engine:
    """``connect`` + ``upgrade``: what a producer calls before its first trial."""
    return upgrade(connect(url))


def require_current(engine: Engine) -> None:
    """Raise SchemaOutOfDate (one line) unless the database is at this code's schema."""
    have, want = current_revision(engine), head_revision()
    if have != want:
        raise SchemaOutOfDate(
            f"{redact(engine.url)} is at schema revision {have or 'none (empty database)'}, this code needs "
            f"{want}: run flurka.results.upgrade(URL) or `flurka tables --db URL --upgrade`")
