"""``flurka report``: the paper's tables and figures as a static HTML report (plus Markdown and
LaTeX tables) from a results database, optionally logged to the sweep's MLflow run.

    flurka report --out report/            # the newest run dir's results.db (make sweep: runs/uptrain-small)
    flurka report --db runs/uptrain-small/results.db --out report/ --theory theory.json
    flurka report --db postgresql://me@db-host/flurka --out report/ \\
        --mlflow-uri sqlite:////abs/mlflow.db --experiment uptrain --sweep-id uptrain-2024-05-01-a1b2

``--db`` takes a URL or a SQLite file's path; without it the report is read from the results.db of
the newest run dir under ``runs/`` (stderr says which). A missing SQLite file is an error naming
it (the report creates no database).

Exit codes: 0 written; 1 a bad option or theory file; 2 no database (none given and no run dir
holds one, or a missing SQLite file), the database or MLflow cannot be reached, or the database is
not at this code's schema (one line on stderr, never the password); 130 / 143 stopped by SIGINT /
SIGTERM (one line: whether the report was written; ``--out`` holds the whole new report or the
one it held before, never a mix).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from flurka.cli import stopping_on_signals, writable_dir
from flurka.reports import TITLE, build_report
from flurka.results import db, rundirs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, metavar="URL|PATH",
                        help="SQLAlchemy URL or SQLite file path of the results database (default: the "
                             "results.db of the newest run dir under runs/)")
    parser.add_argument("--out", required=True, help="directory to write index.html, report.md, tables/, figures/")
    parser.add_argument("--theory", nargs="+", action="extend", default=[], metavar="FILE",
                        help="theory JSON (approximation errors, ranks; see flurka.reports.sources); "
                             "several files, or the flag again, add to each other")
    parser.add_argument("--title", default=None, help="report title")
    parser.add_argument("--mlflow-uri", help="log the report as artifacts to this MLflow tracking URI")
    parser.add_argument("--run-id", help="MLflow run to log to")
    parser.add_argument("--experiment", help="MLflow experiment: the sweep's (with --sweep-id) or a new 'report' run")
    parser.add_argument("--sweep-id", help="log to this sweep's parent run in --experiment")


def _without_password(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", "@")))


def _fail(msg: str, code: int) -> int:
    print(f"flurka report: {msg}", file=sys.stderr)
    return code


def _identity(path: Path) -> tuple[int, int] | None:
    """What tells one written file from the one that replaced it (a rename: a new inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def run(args: argparse.Namespace) -> int:
    with stopping_on_signals(raising=True) as stop:   # pure Python and SQL: Ctrl-C unwinds it
        index = Path(args.out) / "index.html"
        before = _identity(index)
        stop.line = lambda: (f"stopped; nothing written to {args.out}" if _identity(index) == before
                             else f"stopped after writing {index}"
                             + (" (its MLflow logging not finished)" if args.mlflow_uri else ""))
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.mlflow_uri and not (args.run_id or args.experiment):
        return _fail("--mlflow-uri needs --run-id, or --experiment (with --sweep-id for the sweep's run)", 1)
    if (args.run_id or args.experiment or args.sweep_id) and not args.mlflow_uri:
        return _fail("--run-id/--experiment/--sweep-id need --mlflow-uri", 1)
    try:
        writable_dir(args.out, "--out")
    except ValueError as e:
        return _fail(str(e), 2)
    if args.mlflow_uri:   # a server that does not answer: one line now, not after the report
        from flurka.tracking.store import probe_tracking   # MLflow: 1.4 s, only with --mlflow-uri
        try:
            probe_tracking(args.mlflow_uri)
        except db.DatabaseUnreachable as e:
            return _fail(str(e), 2)
    url = args.db
    if url is None:
        found = rundirs.newest_store(rundirs.RESULTS)
        if found is None:
            return _fail(rundirs.missing_line("flurka report", rundirs.RESULTS, "--db URL|PATH")
                         .removeprefix("flurka report: "), 2)
        print(rundirs.picked_line("flurka report", found, "--db"), file=sys.stderr)
        url = str(found)
    try:
        index = build_report(url, args.out, theory=args.theory, title=args.title or TITLE)
    except (db.DatabaseUnreachable, db.SchemaOutOfDate) as e:  # incl. a file that is no database
        return _fail(str(e), 2)
    except db.database_errors() as e:  # corrupt past the schema: found while building, before writing
        return _fail(db.database_error(url, e), 2)
    except ValueError as e:  # a bad theory file
        return _fail(str(e), 1)
    print(f"wrote {index}")
    if args.mlflow_uri:   # MLflow, as above
        from mlflow.exceptions import MlflowException

        from flurka.reports.mlflow_log import log_report

        try:
            run_id = log_report(args.out, tracking_uri=args.mlflow_uri, run_id=args.run_id,
                                experiment=args.experiment, sweep_id=args.sweep_id)
        except ValueError as e:
            return _fail(str(e), 1)
        except MlflowException as e:
            return _fail(f"cannot log to MLflow at {_without_password(args.mlflow_uri)}: {' '.join(str(e).split())[:300]}", 2)
        print(f"logged {args.out} to MLflow run {run_id} (artifacts under report/)")
    return 0
