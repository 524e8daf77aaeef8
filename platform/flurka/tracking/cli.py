"""``flurka ui``: the MLflow UI of a sweep's tracking store, on 127.0.0.1 only."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend-store-uri", default=None,
                        help="MLflow store (default: sqlite:///<run-dir>/mlflow.db)")
    parser.add_argument("--run-dir", default="runs/uptrain", help="a sweep's run dir (default runs/uptrain)")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")


def command(args: argparse.Namespace) -> list[str]:
    run_dir = Path(args.run_dir).expanduser().resolve()
    uri = args.backend_store_uri or f"sqlite:///{run_dir / 'mlflow.db'}"
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_absolute():  # the UI process may run elsewhere: make it absolute
            db = db.resolve()
            uri = f"sqlite:///{db}"
        if not db.exists():
            raise FileNotFoundError(f"no MLflow store at {db}; run a sweep first or pass --backend-store-uri")
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
            "--port", str(args.port)]


def run(args: argparse.Namespace) -> int:
    try:
        cmd = command(args)
    except FileNotFoundError as exc:
        print(f"flurka ui: {exc}", file=sys.stderr)
        return 2
    print(" ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    print(f"MLflow UI on http://127.0.0.1:{args.port} (Ctrl-C to stop)", flush=True)
    try:
        return subprocess.call(cmd, env=os.environ.copy())
    except KeyboardInterrupt:
        return 0
