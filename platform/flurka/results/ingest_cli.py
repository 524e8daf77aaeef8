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

Speed and theory documents also go to MLflow, one run each in the experiments ``flurka-speed`` /
``flurka-theory`` (the document, its rows as tables, the card in the tags:
:mod:`flurka.tracking.documents`): ``--mlflow-uri`` names the store; by default it is the
``mlflow.db`` beside a SQLite ``--db`` when there is one (a run dir's), and ``--mlflow-uri none``
skips it.

Idempotent: ingesting a file twice adds nothing (in MLflow either). Every file is read and validated before any is
written (a bad one names itself and nothing is added); then each file is one transaction. SIGINT / SIGTERM
stop it with one line and exit 130 / 143: the file in progress is rolled back (its MLflow run, once begun, is
logged whole), the files before it stay in, and the same command adds the rest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flurka.cli import stopping_on_signals
from flurka.results import db, rundirs
from flurka.results.ingest import ingest_parsed, parse_file
from flurka.results.retry import StoreUnavailable, db_store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, metavar="URL|PATH",
                        help="SQLAlchemy URL or a SQLite file's path, created if missing (default: the "
                             "results.db of the newest run dir under runs/)")
    parser.add_argument("--mlflow-uri", default=None, metavar="URI|PATH|none",
                        help="MLflow store for a run per speed/theory document (default: the mlflow.db beside "
                             "a SQLite --db, if there is one; none: skip)")
    parser.add_argument("files", nargs="+", help="JSON files written by flurka.speed, flurka.theory or a sweep")


def _tracking_uri(flag: str | None, results_url: str) -> str | None:
    """Where the documents' MLflow runs go: the flag (a URI, or a SQLite file's path), else the
    mlflow.db beside a SQLite results file if it exists, else nowhere."""
    if flag is not None:
        if flag.lower() == "none":
            return None
        return flag if "://" in flag else f"sqlite:///{Path(flag).expanduser().resolve()}"
    path = db.sqlite_file(results_url)
    beside = path.parent / rundirs.MLFLOW if path is not None else None
    return f"sqlite:///{beside}" if beside is not None and beside.is_file() else None


def run(args: argparse.Namespace) -> int:
    with stopping_on_signals(raising=True) as stop:   # SQL: Ctrl-C unwinds it, the transaction rolls back
        stop.line = "stopped before any file was ingested; nothing added"
        return _run(args, stop)


def _run(args: argparse.Namespace, stop) -> int:
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
    tracking = _tracking_uri(args.mlflow_uri, url)
    # Reaching the database at all is checked once, at once (as a sweep's preflight does: a wrong port
    # or password is bad input); a server restarting once the files are going in (maintenance, a
    # failover) is waited out, a line when it goes and one when it is back ($FLURKA_STORE_RETRY_S).
    store = db_store(url, gave_up="nothing added (the same command adds the files when it is back)")
    try:
        if tracking is not None:
            from flurka.tracking.store import probe_tracking   # MLflow: 1.4 s, only for documents that go to it

            probe_tracking(tracking)
        with stop.held():   # a database created (migrated) whole or not at all
            engine = db.open_results(url)
    except db.DatabaseUnreachable as e:
        print(f"flurka ingest: {e}", file=sys.stderr)
        return 2
    try:
        for done, (path, records) in enumerate(parsed):
            stop.line = (f"stopped after {done} of {len(parsed)} files; {path} rolled back "
                         "(the same command adds the rest)")
            store.gave_up_line = (f"{done} of {len(parsed)} files added; {path} rolled back (the same command "
                                  "adds the rest when it is back)")
            report = store.call(ingest_parsed, engine, records)   # one transaction: retried whole
            stop.line = (f"stopped after {done + 1} of {len(parsed)} files"
                         + ("" if done + 1 == len(parsed) else " (the same command adds the rest)"))
            updated = f", updated {report.updated} (FLOP-model fields re-derived)" if report.updated else ""
            print(f"{path}: added {report.added}, already present {report.skipped}{updated}")
            if tracking is not None:
                from flurka.tracking.documents import log_document   # MLflow, as probe_tracking above

                with stop.held():   # an MLflow run half logged would pass for the whole one next time
                    logged = log_document(tracking, path, Path(path).read_text())
                if logged is not None:
                    print(f"{path}: MLflow run {logged[0]} ({'logged' if logged[1] else 'already there'})")
    except StoreUnavailable:   # said in the store's line
        return 2
    except db.database_errors() as e:  # a page corrupt past the schema: the file's transaction rolled back
        print(f"flurka ingest: {db.database_error(engine.url, e)}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    return 0
