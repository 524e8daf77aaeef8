"""``flurka ingest``: load result JSON files (speed benchmark and theory documents, sweep records)
into the DB.

    python -m flurka.speed --sweep n-sweep --out benchmarks/h100_nsweep.json     # on the GPU box
    python -m flurka.speed.theory --out benchmarks/h100_theory.json
    flurka ingest --db postgresql://me@db-host/flurka benchmarks/h100_nsweep.json benchmarks/h100_theory.json

Idempotent: ingesting a file twice adds nothing. Every file is read and validated before any is
written (a bad one names itself and nothing is added); then each file is one transaction.
"""

from __future__ import annotations

import argparse
import sys

from flurka.results import db
from flurka.results.ingest import ingest_parsed, parse_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=db.DEFAULT_URL, help="SQLAlchemy URL (default %(default)s)")
    parser.add_argument("files", nargs="+", help="JSON files written by flurka.speed, flurka.speed.theory or a sweep")


def run(args: argparse.Namespace) -> int:
    parsed = [(path, parse_file(path)) for path in args.files]   # ValueError: one line, by main
    try:
        engine = db.open_results(args.db)
    except db.DatabaseUnreachable as e:
        print(f"flurka ingest: {e}", file=sys.stderr)
        return 2
    try:
        for path, records in parsed:
            report = ingest_parsed(engine, records)
            updated = f", updated {report.updated} (FLOP-model fields re-derived)" if report.updated else ""
            print(f"{path}: added {report.added}, already present {report.skipped}{updated}")
    except db.database_errors() as e:  # a page corrupt past the schema: the file's transaction rolled back
        print(f"flurka ingest: {db.database_error(engine.url, e)}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    return 0
