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


def test_migrations_keep_the_results_down_and_up_again(db_url, speed_dicts, theory_doc):
    """Down from the head with results in: 0003 takes away only the speed rows' run (the rows
    stay), 0002 only the theory tables; up again, every speed row is back with its run unknown
    and the theory tables empty."""
    from flurka.results import ingest_speed, ingest_theory

    engine = db.upgrade(db_url)
    assert db.current_revision(engine) == db.head_revision() == "0006"
    ingest_speed(engine, [dict(r, run="2026-11-29T00:00:00+00:00") for r in speed_dicts])
    added = ingest_theory(engine, theory_doc).added
    assert added == len(theory_doc["approximation_errors"]) + len(theory_doc["ranks"])

    def speed_rows() -> list:
        with engine.connect() as conn:
            table = sa.Table("speed_measurements", sa.MetaData(), autoload_with=conn)
            return [dict(r) for r in conn.execute(sa.select(table).order_by(table.c.id)).mappings()]

    before = speed_rows()
    assert len(before) == len(speed_dicts) and {r["run"] for r in before} == {"2026-11-29T00:00:00+00:00"}
    cfg = db._alembic_config()
    for revision, gone in (("0002", set()), ("0001", THEORY_TABLES)):
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
        sa.inspect(engine).clear_cache()
        assert db.current_revision(engine) == revision
        assert not gone & set(sa.inspect(engine).get_table_names())
        assert speed_rows() == [{k: v for k, v in r.items() if k != "run"} for r in before]
    db.upgrade(engine)
    assert speed_rows() == [{**r, "run": None} for r in before]
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(models.TheoryRun)) == 0
    engine.dispose()


def test_migration_0004_spells_the_base_as_the_cli_does(db_url, sweep_dict, make_trial):
    """Down to 0003 an up-trained trial's base is its base model's mechanism; up to 0004 it is
    --base's word ("low-rank", "kernel"), and a trial trained from scratch keeps none."""
    from flurka.results import ingest_sweep

    trials = [make_trial("k", "flurka-rnn", "nmt-small", {"bleu": 70.0}, alpha=0.25, base="kernel", d_k=16),
              make_trial("r", "flurka-eva", "nmt-small", {"bleu": 71.0}, alpha=0.5, base="low-rank", d_k=16),
              make_trial("s", "rnn", "nmt-small", {"bleu": 69.0})]
    engine = db.upgrade(db_url)
    ingest_sweep(engine, {**sweep_dict, "trials": trials})

    def bases() -> dict:
        with engine.connect() as conn:
            return dict(conn.execute(sa.select(models.Trial.trial_key, models.Trial.base)).all())

    cfg = db._alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0003")
    assert bases() == {"k": "rnn", "r": "linformer", "s": None}
    db.upgrade(engine)
    assert bases() == {"k": "kernel", "r": "low-rank", "s": None}
    engine.dispose()


def test_migration_0005_keeps_each_trial_where_it_ran(db_url, sweep_dict, make_trial):
    """A trial's node, device and peak memory (bytes past 32 bits on a GPU) are stored and read
    back; a trial without them (an older file) has none. Down to 0004 the columns go and the
    trials stay; up again they are back, unknown."""
    from flurka.results import ingest_sweep
    from flurka.results.records import SweepRecord

    placed = {"node": "gpu-node-2", "device": "NVIDIA H100 80GB HBM3", "device_count": 1,
              "peak_host_bytes": 6_100_000_000, "peak_device_bytes": 42_000_000_000}
    trials = [{**make_trial("g", "flurka-rnn", "nmt-small", {"bleu": 70.0}, alpha=0.25, base="kernel", d_k=16),
               **placed},
              make_trial("old", "rnn", "nmt-small", {"bleu": 69.0})]
    record = SweepRecord.from_dict({**sweep_dict, "trials": trials})
    assert SweepRecord.from_dict(record.to_dict()) == record     # the sweep-record JSON carries them
    engine = db.upgrade(db_url)
    ingest_sweep(engine, record)
    columns = [getattr(models.Trial, k) for k in placed]

    def rows() -> dict:
        with engine.connect() as conn:
            return {r[0]: tuple(r[1:]) for r in conn.execute(sa.select(models.Trial.trial_key, *columns))}

    assert rows() == {"g": tuple(placed.values()), "old": (None,) * len(placed)}
    cfg = db._alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
    sa.inspect(engine).clear_cache()
    assert not set(placed) & {c["name"] for c in sa.inspect(engine).get_columns("trials")}
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(sa.table("trials"))) == 2
    db.upgrade(engine)
    assert rows() == {"g": (None,) * len(placed), "old": (None,) * len(placed)}
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
    """A malformed URL (a scheme, then no ``//``) is one line; text without a scheme is a SQLite
    file's path (``db.as_url``; tests/infra/test_newcomer_paths.py)."""
    for bad in ("postgres:oops", "sqlite:/one-slash.db"):
        with pytest.raises(db.DatabaseUnreachable, match=f"cannot parse database URL '{bad}'"):
            db.connect(bad)


def test_redact_keeps_everything_but_the_password():
    assert db.redact("postgresql+psycopg://me:pw@h:5433/res?sslmode=require") == \
        "postgresql+psycopg://me@h:5433/res?sslmode=require"


def test_sqlite_enforces_foreign_keys(tmp_path):
    engine = db.upgrade(f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.insert(models.Metric).values(trial_id=12345, name="bleu", value=1.0))
    engine.dispose()
