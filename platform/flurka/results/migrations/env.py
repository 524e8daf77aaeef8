"""Alembic environment: always driven through ``flurka.results.db`` with a live connection
(``config.attributes["connection"]``), never from an alembic.ini or a URL string."""

from alembic import context

from flurka.results.models import Base

target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("run migrations through flurka.results.upgrade(url), which passes a connection")
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported; use flurka.results.upgrade(url)")
run_migrations_online()
