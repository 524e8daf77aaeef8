"""The benchmark → database path a GPU user takes: ``python -m flurka.speed`` writes JSON (JAX only),
``flurka ingest`` loads it (twice: idempotent), ``flurka tables`` reads it back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flurka.cli import main


def test_speed_json_ingests_once_and_tables_read_it(tmp_path, capsys):
    out = tmp_path / "speed.json"
    subprocess.run(
        [sys.executable, "-m", "flurka.speed", "--sweep", "tiny", "--mechanisms", "full,flurka-rnn",
         "--modes", "forward", "--repeats", "2", "--warmup", "1", "--no-ceilings", "--out", str(out)],
        check=True, timeout=600)
    rows = json.loads(out.read_text())["results"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok, rows

    url = f"sqlite:///{tmp_path / 'results.db'}"
    assert main(["ingest", "--db", url, str(out)]) == 0
    first = capsys.readouterr().out
    assert f"added {len(rows)}, already present 0" in first
    assert main(["ingest", "--db", url, str(out)]) == 0
    assert f"added 0, already present {len(rows)}" in capsys.readouterr().out

    assert main(["tables", "--db", url, "--table", "speed", "--mode", "forward", "--scope", "layer",
                 "--format", "csv"]) == 0
    table = capsys.readouterr().out
    assert "full" in table and "flurka-rnn" in table


def test_ingest_unreachable_db_is_one_line(tmp_path, capsys):
    empty = tmp_path / "none.json"
    empty.write_text("[]")                          # no speed records: valid, nothing to add
    code = main(["ingest", "--db", "postgresql://u:secret@127.0.0.1:1/x", str(empty)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cannot reach" in err and "secret" not in err and "\n" not in err


@pytest.mark.parametrize("content,why", [
    ("{not json", "Expecting property name"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than Python's JSON reader follows"),   # was a RecursionError
    (b"\xb8\x00binary", "not UTF-8 text"),                                                # named no file
])
def test_ingest_bad_file_is_one_line(tmp_path, capsys, content, why):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    code = main(["ingest", "--db", f"sqlite:///{tmp_path / 'r.db'}", str(bad)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"cannot read results JSON {bad}: " in err and why in err and "\n" not in err
    assert not (tmp_path / "r.db").exists()


def test_ingest_validates_every_file_before_writing_any(tmp_path, capsys):
    """A lease's folder holds JSON that is no results file (its card checks): named in one line,
    and the good file beside it is not half-ingested either."""
    good = tmp_path / "n-sweep.json"
    subprocess.run(
        [sys.executable, "-m", "flurka.speed", "--sweep", "tiny", "--mechanisms", "rnn",
         "--modes", "forward", "--repeats", "1", "--warmup", "0", "--no-ceilings", "--out", str(good)],
        check=True, timeout=600)
    check = tmp_path / "check.json"
    check.write_text(json.dumps({"device": {"name": "cpu"}, "check": [{"rel_err": 1e-7}]}))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    assert main(["ingest", "--db", url, str(good), str(check)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(check) in err and "not a results file" in err and "\n" not in err
    assert main(["ingest", "--db", url, str(good)]) == 0             # nothing was written before
    assert "already present 0" in capsys.readouterr().out
