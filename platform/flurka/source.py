"""Where the running flurka code came from: its tree, its commit, whether that tree was dirty,
and ``flurka submit`` (``ray job submit`` that records what it submits).

A job's working dir is an upload without ``.git``, so git cannot say there which commit runs.
``flurka submit ... --working-dir DIR -- python experiments/uptrain_sweep.py ...`` reads the
commit and dirtiness of DIR at submit time, writes them with a digest of the code into
``DIR/.flurka-source.json`` (the *stamp*), runs ``ray job submit`` with the same arguments (the
stamp travels in the upload) and removes the stamp again. :func:`describe` then reports:

* in a git checkout (the tree flurka imports from is a work tree's top level): git's HEAD, and
  dirty if ``git status`` lists anything (untracked files included: they run too);
* else the stamp the submit left in the tree: the submitted commit and dirtiness;
* else nothing known (``Source.describe()`` is ``"unknown"``).

:func:`mismatch` is the one-line warning for code that runs but was not submitted: a job whose
flurka imports from outside its working dir (an installed copy), or a tree whose code no longer
matches its stamp's digest. No Ray, MLflow or JAX here: the console script, tracking and the
cluster code all read it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

PARTS = ("workers", "platform", "dashboards")   # the folders the `flurka` namespace package lives in
STAMP = ".flurka-source.json"                    # written into the working dir by `flurka submit`


@dataclasses.dataclass(frozen=True)
class Source:
    commit: str | None      # full sha; None where unknown
    dirty: bool | None      # the tree differed from the commit (None: unknown)
    origin: str             # "git" (a checkout), "submitted" (the stamp), "unknown"

    def describe(self) -> str:
        """``0123456789ab`` or ``0123456789ab-dirty`` (git describe's mark), else ``unknown``."""
        if not self.commit:
            return "unknown"
        return self.commit[:12] + ("-dirty" if self.dirty else "")


def is_tree(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` holds the three parts of the flurka package (a checkout or its upload)."""
    return path is not None and all((Path(path) / part / "flurka").is_dir() for part in PARTS)


def source_root() -> Path | None:
    """The tree this code imports from (``platform/flurka/source.py`` two folders up); None for an
    installed wheel."""
    root = Path(__file__).resolve().parents[2]
    return root if is_tree(root) else None


def _git(path: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_source(path: str | os.PathLike, *, toplevel: bool = True) -> Source | None:
    """HEAD and dirtiness of the git work tree at ``path`` (None where git cannot tell). With
    ``toplevel``, only if ``path`` is the work tree's top (an upload unpacked under some other
    checkout is not that checkout). Dirty: anything ``git status`` lists under ``path``, untracked
    files included, the stamp excepted."""
    path = Path(path).resolve()
    top = _git(path, "rev-parse", "--show-toplevel")
    if top is None or (toplevel and Path(top.strip()).resolve() != path):
        return None
    head = _git(path, "rev-parse", "HEAD")
    status = _git(path, "status", "--porcelain", "--untracked-files=normal", "--", ".", f":(exclude){STAMP}")
    if not head or status is None:
        return None
    return Source(head.strip(), bool(status.strip()), "git")


def code_digest(root: str | os.PathLike) -> str:
    """sha256 over the ``.py`` files of the tree's flurka package (names and contents): what the
    stamp's code was, compared with what imports."""
    root = Path(root)
    h = hashlib.sha256()
    files = sorted(p for part in PARTS for p in (root / part / "flurka").rglob("*.py") if "__pycache__" not in p.parts)
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def read_stamp(root: str | os.PathLike) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(root) / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_stamp(working_dir: str | os.PathLike) -> dict[str, Any]:
    """The stamp of ``working_dir`` as it is now (commit, dirty, digest, time), written into it."""
    working_dir = Path(working_dir)
    src = git_source(working_dir, toplevel=False) or Source(None, None, "unknown")
    data = {"commit": src.commit, "dirty": src.dirty, "digest": code_digest(working_dir),
            "stamped_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    tmp = working_dir / f"{STAMP}.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(working_dir / STAMP)
    return data


def describe_root(root: str | os.PathLike | None) -> Source:
    """The source of the tree at ``root``: git where it is a checkout, else its stamp."""
    if root is None:
        return Source(None, None, "unknown")
    src = git_source(root)
    if src is not None:
        return src
    stamp = read_stamp(root)
    if stamp and stamp.get("commit"):
        dirty = stamp.get("dirty")
        return Source(str(stamp["commit"]), dirty if isinstance(dirty, bool) else None, "submitted")
    return Source(None, None, "unknown")


@functools.cache
def describe() -> Source:
    """The source of the code running in this process (read once: what it started with)."""
    return describe_root(source_root())


def worker_pythonpath(job_runtime_env: Mapping[str, Any], cwd: str | os.PathLike | None = None) -> str | None:
    """``PYTHONPATH`` for every Ray worker of a sweep, so that they import the flurka the driver
    imports. In a job with a working dir that is a flurka tree: the parts as *relative* paths. Ray
    starts each worker as ``cd <its node's unpacked working dir> && python ...`` and Python makes
    PYTHONPATH entries absolute at start-up, so each node finds its own copy (an absolute path is
    only right on the head; ``py_modules`` would upload the same code a second time and name a field
    the job may already set). Elsewhere the driver's tree as absolute paths (one machine); None
    for an installed wheel."""
    if job_runtime_env.get("working_dir") and is_tree(cwd if cwd is not None else os.getcwd()):
        return os.pathsep.join(PARTS)
    root = source_root()
    return os.pathsep.join(str(root / part) for part in PARTS) if root else None


def mismatch(job_runtime_env: Mapping[str, Any], cwd: str | os.PathLike | None = None) -> str | None:
    """One line when the code that runs is not the code submitted, else None: in a job with a
    working dir, a flurka module imported from outside it; anywhere, a tree whose code differs
    from its stamp's digest."""
    if job_runtime_env.get("working_dir"):
        here = Path(cwd if cwd is not None else os.getcwd()).resolve()
        for name, module in sorted(sys.modules.items()):
            file = getattr(module, "__file__", None) if name.startswith("flurka.") else None
            if file and not Path(file).resolve().is_relative_to(here):
                return (f"this job imports {name} from {file}, not from its working dir {here}: the code submitted "
                        "is not what runs (start the job with `python experiments/uptrain_sweep.py`)")
    root = source_root()
    stamp = read_stamp(root) if root else None
    if stamp and stamp.get("digest") and stamp["digest"] != code_digest(root):
        submitted = Source(stamp.get("commit"), stamp.get("dirty"), "submitted").describe()
        return (f"the flurka code in {root} differs from what `flurka submit` stamped ({submitted}, "
                f"{stamp.get('stamped_at', '?')}): the recorded commit is not what runs")
    return None


# -- flurka submit -------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ray_args", nargs=argparse.REMAINDER, metavar="RAY_JOB_SUBMIT_ARGS",
                        help="what `ray job submit` takes, --working-dir DIR among them: "
                             "flurka submit --address URL --working-dir . -- python experiments/uptrain_sweep.py ...")


def _working_dir(ray_args: list[str]) -> str:
    head = ray_args[:ray_args.index("--")] if "--" in ray_args else ray_args
    for i, arg in enumerate(head):
        if arg == "--working-dir" and i + 1 < len(head):
            return head[i + 1]
        if arg.startswith("--working-dir="):
            return arg.split("=", 1)[1]
    raise ValueError("give --working-dir DIR: a job runs the code it uploads (without one, whatever the cluster has installed)")


def run(args: argparse.Namespace) -> int:
    """Stamp the working dir, ``ray job submit`` with the same arguments, remove the stamp."""
    ray_args = list(args.ray_args)
    working_dir = Path(_working_dir(ray_args))
    if not is_tree(working_dir):
        raise ValueError(f"--working-dir {working_dir} holds no flurka tree ({', '.join(p + '/flurka' for p in PARTS)})")
    stamp = write_stamp(working_dir)
    submitted = Source(stamp["commit"], stamp["dirty"], "submitted").describe()
    print(f"flurka submit: source {submitted}" + ("" if stamp["commit"] else " (no git checkout)"), file=sys.stderr, flush=True)
    ray = Path(sys.executable).parent / "ray"
    try:
        return subprocess.call([str(ray) if ray.exists() else "ray", "job", "submit", *ray_args])
    finally:
        (working_dir / STAMP).unlink(missing_ok=True)


__all__ = ["Source", "describe", "describe_root", "git_source", "code_digest", "read_stamp", "write_stamp",
           "worker_pythonpath", "mismatch", "source_root", "is_tree", "PARTS", "STAMP"]
