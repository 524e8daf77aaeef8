"""The paper's tables and figures as a static report, regenerated from the results database.

``build_report(db_url, out_dir, theory=[...])`` writes ``index.html`` (figures as PNG beside it),
``report.md``, and every table as Markdown/LaTeX/CSV; ``log_report`` uploads the directory to an
MLflow run. ``flurka report`` is the command line (:mod:`flurka.reports.cli`). The report leads
with the main job's result (the up-training table with seed CIs, the paper's observations on it
and the α figure, then loss against training FLOPs); the sections the database cannot fill close
it, one line each naming the command that fills them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flurka.results import db

TITLE = "FLuRKA: results report"


def build_report(db_url_or_engine, out_dir: str | Path, *, theory: Sequence[str | Path] = (),
                 title: str = TITLE) -> Path:
    """Build every section from the database (migrated to this code's schema; its theory runs
    included) and the theory files, write the report into ``out_dir`` and return the path of its
    ``index.html``."""
    # pandas, matplotlib and JAX (sources' flurka.speed): 2.3 s that `flurka report --help` does
    # not pay; and matplotlib's backend is chosen only when a report is built
    import matplotlib

    matplotlib.use("Agg")  # headless, whatever the caller's backend
    from flurka.reports import render, sections, sources

    loaded = sources.load_theory(theory)  # bad theory files fail before any database work
    # a URL or a SQLite file's path; a missing file is DatabaseMissing (a report creates no database)
    engine = db.connect_existing(db_url_or_engine) if not hasattr(db_url_or_engine, "connect") else db_url_or_engine
    try:
        db.require_current(engine)
        built = sections.build_sections(engine, loaded)
        source = db.redact(engine.url) + (f" and {len(theory)} theory file(s)" if theory else "")
    finally:
        if engine is not db_url_or_engine:
            engine.dispose()
    return render.write(built, out_dir, title=title, source=source)


def __getattr__(name: str):
    if name == "log_report":  # imports MLflow: only when asked for
        from flurka.reports.mlflow_log import log_report

        return log_report
    raise AttributeError(f"module 'flurka.reports' has no attribute {name!r}")


__all__ = ["TITLE", "build_report", "log_report"]
