"""Helpers shared by several test directories (on pytest's ``pythonpath``, see pyproject)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


def pids_naming(marker: str) -> list[int]:
    """PIDs of processes whose command line names ``marker`` (a test's own temp/run dir), so a test
    stops exactly the Ray processes it started — never `ray stop`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                out.append(int(pid))
        except OSError:
            pass
    return [p for p in out if p != os.getpid()]


@contextlib.contextmanager
def scratch_postgres_database(admin_url: str, prefix: str) -> Iterator[str]:
    """URL of a fresh database on the server of ``admin_url`` (FLURKA_TEST_POSTGRES_URL), dropped
    on exit even if connections are still open."""
    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
