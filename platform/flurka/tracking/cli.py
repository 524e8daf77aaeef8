"""``flurka ui``: the MLflow UI of a sweep's tracking store, on 127.0.0.1 only.

    flurka ui                              # the newest run dir under runs/ (make sweep: runs/uptrain-small)
    flurka ui --run-dir runs/uptrain-small --port 5001

Without ``--run-dir`` / ``--backend-store-uri`` the store is the mlflow.db of the newest run dir
under ``runs/`` (stderr says which); ``--backend-store-uri`` takes a URI or a SQLite file's path.
A port out of range or already in use on 127.0.0.1 is one line and exit 2, before MLflow starts.
A run dir that was copied or moved opens too: its store's artifact URIs (absolute, as MLflow
writes them) are pointed at the run dir's own ``mlartifacts`` (:func:`flurka.tracking.store.relocate_artifacts`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from flurka.results import rundirs
from flurka.results.db import mask_url
from flurka.tracking.store import relocate_artifacts
from flurka.tracking.view import VIEW_KEY, VIEW_TAG, view_url

HOST = "127.0.0.1"
# MLflow 3's UI takes its view from the URL's workflowType, else from the browser's localStorage,
# whose default is GenAI (traces, "Detect Issues"), whatever the experiment's mlflow.experimentKind
# tag says: the URL flurka ui prints names the model-training view.
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


class CannotServe(RuntimeError):
    """The UI cannot start: no store, or no port to serve on (the message is one line)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend-store-uri", default=None, metavar="URI|PATH",
                        help="MLflow store: a URI, or a SQLite file's path (a directory: MLflow's file "
                             "store) (default: <run-dir>/mlflow.db)")
    parser.add_argument("--run-dir", default=None,
                        help="a sweep's run dir (default: the newest run dir under runs/ holding a mlflow.db, "
                             "e.g. runs/uptrain-small after make sweep)")
    parser.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")


def store_uri(args: argparse.Namespace) -> str:
    """The MLflow store to serve, an absolute ``sqlite:///`` URI for a file (the UI process may run
    elsewhere); CannotServe where the file is missing or none was given and no run dir holds one."""
    uri = args.backend_store_uri
    if uri is not None and "://" not in uri and not Path(uri).expanduser().is_dir():
        uri = f"sqlite:///{Path(uri).expanduser().resolve()}"   # a plain path: that SQLite file
    if uri is None:
        if args.run_dir is not None:
            uri = f"sqlite:///{Path(args.run_dir).expanduser().resolve() / rundirs.MLFLOW}"
        else:
            found = rundirs.newest_store(rundirs.MLFLOW)
            if found is None:
                raise CannotServe(rundirs.missing_line("flurka ui", rundirs.MLFLOW, "--run-dir DIR or "
                                                       "--backend-store-uri URI").removeprefix("flurka ui: "))
            print(rundirs.picked_line("flurka ui", found, "--run-dir"), file=sys.stderr, flush=True)
            uri = f"sqlite:///{found.resolve()}"
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_absolute():
            db = db.resolve()
            uri = f"sqlite:///{db}"
        if not db.exists():
            raise CannotServe(f"no MLflow store at {db}; `make sweep` writes {rundirs.MAIN_RUN_DIR / rundirs.MLFLOW}, "
                              "or pass --run-dir / --backend-store-uri")
    return uri


def check_port(port: int) -> None:
    """CannotServe unless ``port`` is a TCP port that nothing listens on at 127.0.0.1."""
    if not 1 <= port <= 65535:
        raise CannotServe(f"--port {port} is not a TCP port (1-65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the server binds: TIME_WAIT is free
        try:
            s.bind((HOST, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise CannotServe(f"port {port} on {HOST} is in use (another `flurka ui`?): pass a free --port") from None
            raise CannotServe(f"cannot serve on {HOST}:{port}: {e.strerror or e}") from None


def command(args: argparse.Namespace) -> list[str]:
    if not 1 <= args.port <= 65535:
        raise CannotServe(f"--port {args.port} is not a TCP port (1-65535)")
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store_uri(args), "--host", HOST,
            "--port", str(args.port)]


def run(args: argparse.Namespace) -> int:
    if (args.backend_store_uri or "").startswith(("http://", "https://")):   # MLflow's UI would crash on it
        print(f"flurka ui: {mask_url(args.backend_store_uri)} is already a tracking server: open it in a browser")
        return 0
    try:
        cmd = command(args)
        if not args.dry_run:
            check_port(args.port)
    except CannotServe as exc:
        print(f"flurka ui: {exc}", file=sys.stderr)
        return 2
    store = cmd[cmd.index("--backend-store-uri") + 1]
    if store.startswith("sqlite:///") and not args.dry_run:
        moved = relocate_artifacts(Path(store.removeprefix("sqlite:///")))
        if moved:
            print(f"flurka ui: {moved}", file=sys.stderr, flush=True)
    print(" ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    print(f"MLflow UI on {landing_url(store, args.port)} (Ctrl-C to stop)", flush=True)
    return serve(cmd)


def landing_url(store: str, port: int) -> str:
    """The page to open: the newest experiment other than MLflow's empty Default (a sweep's, whose
    description holds its result), in the model-training view (:data:`MODEL_TRAINING_VIEW`), its
    runs table opened on the sweep's saved view where the sweep wrote one (the result's columns,
    best first: :mod:`flurka.tracking.view`)."""
    found = [e for e in MlflowClient(tracking_uri=store).search_experiments(order_by=["creation_time DESC"])
             if e.name != "Default"]
    base = f"http://{HOST}:{port}"
    if not found:
        return f"{base}/#/experiments?{MODEL_TRAINING_VIEW}"
    exp = found[0]
    return view_url(base, exp.experiment_id, MODEL_TRAINING_VIEW, VIEW_KEY if VIEW_TAG in exp.tags else None)


class _Terminated(Exception):
    """SIGTERM reached ``flurka ui``."""


def _raise_terminated(signum, frame):
    raise _Terminated


def serve(cmd: list[str], grace_s: float = 10.0) -> int:
    """Run the MLflow server in a process group of its own and, on Ctrl-C or SIGTERM, stop the
    whole group (MLflow's uvicorn and huey workers outlive their parent otherwise, holding the
    port): SIGTERM, ``grace_s`` to exit, then SIGKILL. Exit 130 / 143 as a shell reports them."""
    server = subprocess.Popen(cmd, env=os.environ.copy(), start_new_session=True)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        return server.wait()
    except (KeyboardInterrupt, _Terminated) as stop:
        _stop_group(server, grace_s)
        print("flurka ui: stopped the MLflow server", file=sys.stderr, flush=True)
        return 130 if isinstance(stop, KeyboardInterrupt) else 143
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _stop_group(server: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the group, up to ``grace_s`` for every member to exit, then SIGKILL to what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(grace_s)
    while time.monotonic() < deadline and _group_alive(server.pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
