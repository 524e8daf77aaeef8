"""A file that is no database, or a corrupt results.db, given to ``flurka tables``, ``ingest`` or
``report`` (issue 40): one line on stderr, exit 2, no traceback, nothing written (the file itself
unchanged, no ``--out``). The sweep's ``--results-db`` / ``--mlflow-uri`` rows are in
tests/platform/test_sweep_bad_input.py.

``BROKEN`` makes the bad files, ``COMMANDS`` the commands given one; every pair is a case (but
the pairs in ``SKIP``). The next case is one row.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Callable

import pytest

from flurka.cli import main
from flurka.results import db


def _migrated(path: Path, speed_rows: list[dict] = ()) -> bytes:
    from flurka.results import ingest_speed

    engine = db.upgrade(f"sqlite:///{path}")
    if speed_rows:
        ingest_speed(engine, speed_rows)
    engine.dispose()
    return path.read_bytes()


def _text(path: Path, _rows=()) -> None:
    path.write_text("mechanism,N,median_s\nfull,1024,0.01\n")


def _zeroed_header(path: Path, _rows=()) -> None:
    data = bytearray(_migrated(path))
    data[:100] = bytes(100)
    path.write_bytes(bytes(data))


def _truncated(path: Path, _rows=()) -> None:
    data = _migrated(path)
    path.write_bytes(data[: len(data) // 2])


def _schema_page_garbage(path: Path, _rows=()) -> None:
    data = bytearray(_migrated(path))
    data[100:4096] = b"\xa5" * (4096 - 100)
    path.write_bytes(bytes(data))


def _data_page_garbage(path: Path, speed_rows) -> None:
    """The schema intact (``connect`` passes), the speed table's root page overwritten: the error
    comes from the first query that reads it."""
    _migrated(path, speed_rows)
    con = sqlite3.connect(path)
    (root,), = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'speed_measurements'")
    (page,), = con.execute("PRAGMA page_size")
    con.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * page: root * page] = b"\xff" * page
    path.write_bytes(bytes(data))


BROKEN: dict[str, tuple[Callable[[Path, list], None], str]] = {
    # name: (make the file (path, speed rows), what the one line says)
    "text-file": (_text, "file is not a database"),
    "zeroed-header": (_zeroed_header, "file is not a database"),
    "truncated": (_truncated, "database disk image is malformed"),
    "schema-page-garbage": (_schema_page_garbage, "database disk image is malformed"),
    "data-page-garbage": (_data_page_garbage, "database disk image is malformed"),
}

COMMANDS: dict[str, list[str]] = {
    # name: the flags after `flurka`; {db} is the broken file's URL, {tmp} the test's directory
    "tables": ["tables", "--db", "{db}", "--table", "speed"],
    "tables-upgrade": ["tables", "--db", "{db}", "--table", "glue", "--upgrade"],
    "ingest": ["ingest", "--db", "{db}", "{tmp}/none.json"],
    "report": ["report", "--db", "{db}", "--out", "{tmp}/report"],
}

# Pairs left out: ingesting nothing reads no table page, so a data page can be broken unnoticed
# (connect still refuses every file whose schema cannot be read).
SKIP = {("ingest", "data-page-garbage"), ("tables-upgrade", "data-page-garbage")}
CASES = [(c, b) for c in COMMANDS for b in BROKEN if (c, b) not in SKIP]


def _snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = (p.is_dir(), p.read_bytes() if p.is_file() else None,
                                             p.stat().st_mtime_ns)
    return out


@pytest.mark.parametrize("command,broken", CASES, ids=[f"{c}-{b}" for c, b in CASES])
def test_broken_database_is_one_line_exit_2_and_writes_nothing(command, broken, tmp_path, capsys, speed_dicts):
    make, needle = BROKEN[broken]
    path = tmp_path / "results.db"
    make(path, speed_dicts)
    (tmp_path / "none.json").write_text("[]")            # a valid, empty results file
    url = f"sqlite:///{path}"
    argv = [a.replace("{db}", url).replace("{tmp}", str(tmp_path)) for a in COMMANDS[command]]
    capsys.readouterr()
    before = _snapshot(tmp_path)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"flurka {argv[0]}: ") and str(path) in err and needle in err, err
    assert not any(line.startswith("wrote ") or "added" in line for line in out.splitlines())
    assert _snapshot(tmp_path) == before                 # the file unchanged, no report/, no journal


def test_connect_and_probe_refuse_a_text_file_creating_nothing(tmp_path):
    _text(tmp_path / "notdb.db")
    for check in (db.probe, db.connect):
        with pytest.raises(db.DatabaseUnreachable, match="file is not a database") as info:
            check(f"sqlite:///{tmp_path / 'notdb.db'}")
        assert "\n" not in str(info.value)
    db.probe(f"sqlite:///{tmp_path / 'missing.db'}")     # a missing file passes: it will be created,
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notdb.db"]   # but probe creates nothing


def test_redact_drops_a_query_password_too():
    assert db.redact("postgresql://me@h/res?password=pw&sslmode=require") == \
        "postgresql://me@h/res?sslmode=require"
    assert db.has_password("postgresql://me@h/res?password=pw") and db.has_password("postgresql://me:pw@h/res")
    assert not db.has_password("sqlite:////abs/results.db")
