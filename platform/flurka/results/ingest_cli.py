"""``flurka ingest``: load result JSON files (speed benchmark and theory documents, sweep records)
into the DB.

    python -m flurka.speed --sweep n-sweep --out benchmarks/h100_nsweep.json     # on the GPU box
    python -m flurka.theory --out benchmarks/h100_theory.json
    flurka ingest --db postgresql://me@db-host/flurka benchmarks/h100_nsweep.json benchmarks/h100_theory.json
    flurka ingest benchmarks/h100_nsweep.json      # into the newest run dir's results.db (stderr says which)

``--db`` takes a URL or a SQLite file's path (created if missing); without it the files go into the
results.db of the newest run dir under ``runs/`` (make sweep: runs/uptrain-small/results.db), and
with no run dir there the command stops, creating nothing. A sweep's own ``sweep.json`` is its
spec, not a results file: the sweep has written its trials to its results database already.

Idempotent: ingesting a file twice adds nothing. Every file is read and validated before any is
written (a bad one names itself and nothing is added); then each file is one transaction.
"""

from __future__ import annotations

import argparse
import sys

from flurka.results import db, rundirs
from flurka.results.ingest import ingest_parsed, parse_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, metavar="URL|PATH",
                        help="SQLAlchemy URL or a SQLite file's path, created if missing (default: the "
                             "results.db of the newest run dir under runs/)")
    parser.add_argument("files", nargs="+", help="JSON files written by flurka.speed, flurka.theory or a sweep")


def run(args: argparse.Namespace) -> int:
    parsed = [(path, parse_file(path)) for path in args.files]   # ValueError: one line, by main
    url = args.db
    if url is None:
        found = rundirs.newest_store(rundirs.RESULTS)
        if found is None:
            print(rundirs.missing_line("flurka ingest", rundirs.RESULTS, "--db URL|PATH (a new SQLite file is "
                                       "created)", purpose="to add to"), file=sys.stderr)
            return 2
        print(rundirs.picked_line("flurka ingest", found, "--db"), file=sys.stderr)
        url = str(found)
    try:
        engine = db.open_results(url)
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
