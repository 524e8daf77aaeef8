"""Where the commands look when they are given no store: the newest run dir under ``runs/``.

A sweep writes its stores into its run dir (``make sweep``: ``runs/uptrain-small/``, the
``run_dir`` of the ``uptrain-small`` sweep config): ``results.db`` (the results database) and
``mlflow.db`` (the MLflow tracking store). ``flurka tables``, ``flurka report``, ``flurka ingest``
and ``flurka ui`` without ``--db`` / ``--run-dir`` take the store of the run dir under ``runs/``
(in the working directory) whose store was modified last, and say which on stderr. Importing
this module imports nothing heavy.
"""

from __future__ import annotations

import os
from pathlib import Path

RUNS = Path("runs")
MAIN_RUN_DIR = RUNS / "uptrain-small"   # make sweep's (the uptrain-small sweep config)
RESULTS = "results.db"
MLFLOW = "mlflow.db"


def newest_store(store: str, root: str | os.PathLike = RUNS) -> Path | None:
    """``<run dir>/<store>`` of the run dir directly under ``root`` whose ``store`` file was
    modified last (None: no run dir there holds one)."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = []
    for path in root.glob(f"*/{store}"):
        try:
            if path.is_file():
                found.append((path.stat().st_mtime_ns, str(path), path))
        except OSError:   # removed while looking
            continue
    return max(found)[2] if found else None


def shown(path: str | os.PathLike) -> str:
    """``path`` relative to the working directory when it lies under it (as a user typed it)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def picked_line(prog: str, path: Path, flag: str) -> str:
    """The one stderr line saying which store a command took by default."""
    return (f"{prog}: using {shown(path)} (the newest run dir under {RUNS}/ holding a {path.name}; "
            f"{flag} to choose another)")


def missing_line(prog: str, store: str, flag: str, root: str | os.PathLike = RUNS, purpose: str = "to read") -> str:
    """The one line for: no ``flag`` given and no run dir under ``root`` holds ``store``."""
    where = Path(root).resolve()
    return (f"{prog}: no {store} {purpose}: no run dir under {where} holds one; `make sweep` writes "
            f"{MAIN_RUN_DIR / store}, or pass {flag}")
