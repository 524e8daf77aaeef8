"""Connecting, migrating, and models == migrations, on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from flurka.results import db, models

TABLES = {"environments", "sweeps", "trials", "metrics", "curve_points", "speed_measurements"}
THEORY_TABLES = {"theory_runs", "approximation_errors", "kernel_ranks"}  # revision 0002


def test_upgrade_creates_schema_and_downgrade_removes_it(db_url):
    engine = db.connect(db_url)
    assert db.current_revision(engine) is None
    assert not TABLES & set(sa.inspect(engine).get_table_names())
    db.upgrade(engine)
    assert db.current_revision(engine) == db.head_revision()
    assert TABLES | THEORY_TABLES <= set(sa.inspect(engine).get_table_names())
    db.upgrade(engine)  # idempotent
    cfg = db._alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    sa.inspect(engine).clear_cache()
    assert not (TABLES | THEORY_TABLES) & set(sa.inspect(engine).get_table_names())
    engine.dispose()


def test_theory_migration_upgrades_a_0001_database_and_downgrades(db_url, speed_dicts, theory_doc):
    """0002 adds the theory tables beside existing results and takes only them away again."""
    from flurka.results import ingest_speed, ingest_theory

    engine = db.upgrade(db_url, "0001")
    assert not THEORY_TABLES & set(sa.inspect(engine).get_table_names())
    ingest_speed(engine, speed_dicts)
    db.upgrade(engine)
    assert db.current_revision(engine) == db.head_revision() == "0002"
    sa.inspect(engine).clear_cache()
    assert THEORY_TABLES <= set(sa.inspect(engine).get_table_names())
    added = ingest_theory(engine, theory_doc).added
    assert added == len(theory_doc["approximation_errors"]) + len(theory_doc["ranks"])
    cfg = db._alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
    sa.inspect(engine).clear_cache()
    assert db.current_revision(engine) == "0001"
    assert not THEORY_TABLES & set(sa.inspect(engine).get_table_names())
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(models.SpeedMeasurement)) == len(speed_dicts)
    db.upgrade(engine)  # and back up, empty
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(models.TheoryRun)) == 0
    engine.dispose()


def test_models_agree_with_migrations(engine):
    """What `alembic check` does: autogenerate finds nothing to add, drop or alter."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        assert compare_metadata(ctx, models.Base.metadata) == []


def test_require_current_names_the_fix(db_url):
    engine = db.connect(db_url)
    with pytest.raises(db.SchemaOutOfDate, match=r"none \(empty database\).*upgrade"):
        db.require_current(engine)
    db.upgrade(engine)
    db.require_current(engine)
    engine.dispose()


def test_unreachable_postgres_is_one_line_without_password():
    start = time.monotonic()
    with pytest.raises(db.DatabaseUnreachable) as info:
        db.connect("postgresql://u:secret@127.0.0.1:1/x")
    msg = str(info.value)
    assert time.monotonic() - start < db.CONNECT_TIMEOUT_S + 1
    assert msg.startswith("cannot reach postgresql://u@127.0.0.1:1/x: ")
    assert "secret" not in msg and "\n" not in msg
    assert "refused" in msg.lower()


def test_unreachable_sqlite_directory(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(db.DatabaseUnreachable, match=f"directory {missing} does not exist"):
        db.connect(f"sqlite:///{missing / 'results.db'}")
    assert not missing.exists()


def test_bad_url_is_one_line():
    with pytest.raises(db.DatabaseUnreachable, match="cannot parse database URL 'not a url'"):
        db.connect("not a url")


def test_redact_keeps_everything_but_the_password():
    assert db.redact("postgresql+psycopg://me:pw@h:5433/res?sslmode=require") == \
        "postgresql+psycopg://me@h:5433/res?sslmode=require"


def test_sqlite_enforces_foreign_keys(tmp_path):
    engine = db.upgrade(f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.insert(models.Metric).values(trial_id=12345, name="bleu", value=1.0))
    engine.dispose()
