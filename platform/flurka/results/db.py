"""Opening the results database and migrating it.

``connect`` fails at once, with one line that never shows the password, when the database
cannot be reached or a SQLite file is no database (or a corrupt one), so a sweep stops before
its first trial rather than after its last; ``probe`` checks the same without creating a file;
``connect_existing`` is what a reading command opens (a missing SQLite file is an error, never
created). Every function taking a URL also takes a plain path (``runs/uptrain-small/results.db``)
as that SQLite file (:func:`as_url`).
``upgrade`` is the only way the schema is created: Alembic, run through its Python API from
the migrations inside this package (works from an installed wheel; no alembic.ini).
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

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


class DatabaseMissing(DatabaseUnreachable):
    """A reading command was given a SQLite file that does not exist (it creates none)."""


class SchemaOutOfDate(RuntimeError):
    """The database exists but is not migrated to this code's schema."""


# What fills a results database, for the line that says one is missing.
FILLED_BY = ("`make sweep` writes runs/uptrain-small/results.db; `flurka ingest --db PATH FILE.json` "
             "loads speed or theory JSON into one")


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")   # "postgresql:…", "sqlite:…": no path


def as_url(url: str | URL | os.PathLike) -> str | URL:
    """``url`` as given when it is a URL (``scheme://…``, or a SQLAlchemy URL object); a plain
    path (``runs/uptrain-small/results.db``, ``~/r.db``) as the URL of that SQLite file, made
    absolute (``sqlite:////abs/runs/uptrain-small/results.db``)."""
    if isinstance(url, URL):
        return url
    text = os.fspath(url)
    if "://" in text or not text.strip() or _SCHEME.match(text):   # a URL, or a malformed one
        return text
    return f"sqlite:///{Path(text).expanduser().resolve()}"


def redact(url: str | URL) -> str:
    """The URL as text with the password removed (``postgresql://user@host:port/db``), also one
    given as a ``?password=`` query parameter."""
    u = sa.make_url(as_url(url))
    query = {k: v for k, v in u.query.items() if k.lower() != "password"}
    return URL.create(u.drivername, u.username, None, u.host, u.port, u.database, query).render_as_string()


def mask_url(url: str) -> str:
    """``url`` as text without its password, unchanged if it has none: :func:`redact` for a
    SQLAlchemy URL, the ``user:password@`` (and a ``password=`` query parameter) taken out of
    any other (an ``http://`` MLflow server)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    in_query = any(k.lower() == "password" for k, _ in parse_qsl(parts.query))
    if password is None and not in_query:
        return url
    try:
        return redact(url)
    except Exception:  # not a SQLAlchemy URL (an http:// MLflow server with user:password@)
        host = parts.netloc.rsplit("@", 1)[-1]
        netloc = f"{parts.username}@{host}" if parts.username else host
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k.lower() != "password"])
        return urlunsplit(parts._replace(netloc=netloc, query=query))


def has_password(url: str | URL) -> bool:
    """Whether the URL carries a password (in its user part or as a query parameter)."""
    u = sa.make_url(as_url(url))
    return u.password is not None or any(k.lower() == "password" for k in u.query)


def _fail(url: str | URL, reason: object) -> DatabaseUnreachable:
    line = " ".join(str(reason).split()) or type(reason).__name__
    return DatabaseUnreachable(f"cannot reach {redact(url)}: {line}")


def _not_a_database(url: str | URL, reason: object) -> DatabaseUnreachable:
    line = " ".join(str(reason).split()) or type(reason).__name__
    return DatabaseUnreachable(f"cannot open {redact(url)}: {line} (not a SQLite database, or a corrupt one)")


def database_errors() -> tuple[type[BaseException], ...]:
    """What a query can raise for a broken database: SQLAlchemy's DatabaseError, and pandas' own
    (``read_sql`` wraps the driver's) once pandas is loaded — evaluated in the ``except``, so
    this module never imports pandas."""
    pandas_errors = sys.modules.get("pandas.errors")
    return (sa.exc.DatabaseError,) + ((pandas_errors.DatabaseError,) if pandas_errors is not None else ())


def database_error(url: str | URL, error: BaseException) -> str:
    """One line for a database error raised past ``connect`` (a page corrupt past the schema, a
    lost server), without the SQL or the password."""
    e = error
    while not isinstance(e, sa.exc.DBAPIError) and e.__cause__ is not None:
        e = e.__cause__
    reason = getattr(e, "orig", None) or e
    line = " ".join(str(reason).split()).split(" [SQL:")[0] or type(reason).__name__
    return f"database error in {redact(url)}: {line}"


def _sqlite_file(u: URL) -> Path | None:
    """The file of a SQLite URL (None: in memory, or a ``file:`` URI)."""
    db = u.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db).expanduser().resolve()


def sqlite_file(url: str | URL | os.PathLike) -> Path | None:
    """The absolute file behind a SQLite URL or a plain path; None for a server, an in-memory
    database, a ``file:`` URI or text that is no URL."""
    try:
        u = sa.make_url(as_url(url))
    except sa.exc.ArgumentError:
        return None
    return _sqlite_file(u) if u.get_backend_name() == "sqlite" else None


def _check_sqlite_path(u: URL) -> None:
    db = u.database
    if db and db != ":memory:" and not db.startswith("file:"):
        parent = Path(db).expanduser().resolve().parent
        if not parent.is_dir():
            raise _fail(u, f"directory {parent} does not exist")


def _parse(url: str | URL) -> URL:
    try:
        return sa.make_url(as_url(url))
    except sa.exc.ArgumentError as e:
        raise DatabaseUnreachable(f"cannot parse database URL {str(url)!r}: {e}") from None


def probe(url: str | URL, *, will_create: str | Path | None = None) -> None:
    """Raise DatabaseUnreachable (one line) unless ``url`` can be opened, creating nothing: an
    existing SQLite file is opened read-only and must be a database; a missing one needs its
    directory to exist, or to be (under) ``will_create``, the directory the caller makes next; a
    server is connected."""
    u = _parse(url)
    if u.get_backend_name() != "sqlite":
        connect(u).dispose()
        return
    path = _sqlite_file(u)
    if path is None:
        return
    if not path.exists():
        made = Path(will_create).expanduser().resolve() if will_create is not None else None
        if not path.parent.is_dir() and not (made is not None and path.parent.is_relative_to(made)):
            raise _fail(u, f"directory {path.parent} does not exist")
        return
    if not path.is_file():
        raise DatabaseUnreachable(f"cannot open {redact(u)}: {path} is not a file")
    try:
        con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise _fail(u, e) from None
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except sqlite3.OperationalError as e:
        raise _fail(u, e) from None
    except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed"
        raise _not_a_database(u, e) from None
    finally:
        con.close()


def connect(url: str | URL = DEFAULT_URL) -> Engine:
    """An engine for ``url`` whose database answered a first connection (else DatabaseUnreachable).
    A SQLite file must be a database: its schema is read, so a text file or a corrupt header
    fails here, in one line, not in the first query."""
    u = _parse(url)
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
    # SQLite opens any file lazily: "SELECT 1" passes on a text file; reading the schema does not.
    first = "SELECT count(*) FROM sqlite_master" if u.get_backend_name() == "sqlite" else "SELECT 1"
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(first))
    except sa.exc.DBAPIError as e:
        engine.dispose()
        reason = e.orig if e.orig is not None else e
        if u.get_backend_name() == "sqlite" and isinstance(e, sa.exc.DatabaseError) \
                and not isinstance(e, sa.exc.OperationalError):
            raise _not_a_database(u, reason) from None
        raise _fail(u, reason) from None
    return engine


def connect_existing(url: str | URL) -> Engine:
    """:func:`connect`, for a command that only reads: a SQLite file that does not exist is
    DatabaseMissing, one line naming the file and what fills it, and nothing is created (SQLite
    would create an empty file on connecting)."""
    u = _parse(url)
    path = _sqlite_file(u) if u.get_backend_name() == "sqlite" else None
    if path is not None and not path.exists():
        where = "" if path.parent.is_dir() else f" (directory {path.parent} does not exist)"
        raise DatabaseMissing(f"no results database at {path}{where}: {FILLED_BY}")
    return connect(u)


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
