"""Issue 58: the commit and dirtiness of the code that runs, captured at submit time for a Ray job
(``flurka submit``'s stamp), the workers' PYTHONPATH, and the one-line warning for code that runs
but was not submitted (:mod:`flurka.source`). The job itself: tests/platform/test_job_submit.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from testsupport import flurka

from flurka import source
from flurka.cluster import driver_runtime_env

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _tree(root: Path) -> Path:
    for part in source.PARTS:
        (root / part / "flurka").mkdir(parents=True)
        (root / part / "flurka" / f"{part}_mod.py").write_text(f"NAME = {part!r}\n")
    return root


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


def _repo(root: Path) -> tuple[Path, str]:
    _tree(root)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "x")
    return root, _git(root, "rev-parse", "HEAD").strip()


def test_a_checkout_reports_its_head_and_whether_anything_differs(tmp_path):
    root, sha = _repo(tmp_path / "repo")
    assert source.describe_root(root) == source.Source(sha, False, "git")
    assert source.describe_root(root).describe() == sha[:12]
    (root / source.STAMP).write_text("{}")                     # flurka submit's own file is no change
    assert source.git_source(root).dirty is False
    (root / "new.py").write_text("")                             # untracked: it runs, and is uploaded
    assert source.git_source(root).dirty is True
    (root / "new.py").unlink()
    (root / "workers" / "flurka" / "workers_mod.py").write_text("NAME = 'edited'\n")
    assert source.describe_root(root) == source.Source(sha, True, "git")
    assert source.describe_root(root).describe() == f"{sha[:12]}-dirty"


def test_a_subfolder_of_a_checkout_is_not_that_checkout(tmp_path):
    """An upload unpacked somewhere inside another checkout must not report that checkout's commit."""
    _repo(tmp_path)
    inner = _tree(tmp_path / "unpacked")
    assert source.git_source(inner) is None
    assert source.describe_root(inner) == source.Source(None, None, "unknown")
    assert source.describe_root(inner).describe() == "unknown"


def test_the_stamp_carries_the_submitted_commit_into_a_tree_without_git(tmp_path):
    root, sha = _repo(tmp_path / "repo")
    (root / "platform" / "flurka" / "platform_mod.py").write_text("NAME = 'local edit'\n")
    stamp = source.write_stamp(root)
    assert (stamp["commit"], stamp["dirty"]) == (sha, True)
    assert json.loads((root / source.STAMP).read_text()) == stamp
    upload = _tree(tmp_path / "upload")                           # what Ray unpacks: no .git
    for part in source.PARTS:
        for f in (root / part / "flurka").iterdir():
            (upload / part / "flurka" / f.name).write_bytes(f.read_bytes())
    (upload / source.STAMP).write_text((root / source.STAMP).read_text())
    assert source.describe_root(upload) == source.Source(sha, True, "submitted")
    assert source.code_digest(upload) == stamp["digest"]


def test_a_stamp_outside_git_records_no_commit(tmp_path):
    root = _tree(tmp_path / "plain")
    stamp = source.write_stamp(root)
    assert stamp["commit"] is None and stamp["dirty"] is None
    assert source.describe_root(root).describe() == "unknown"


def test_the_digest_sees_code_not_caches(tmp_path):
    root = _tree(tmp_path)
    before = source.code_digest(root)
    (root / "workers" / "flurka" / "__pycache__").mkdir()
    (root / "workers" / "flurka" / "__pycache__" / "x.py").write_text("junk")
    (root / "workers" / "flurka" / "notes.txt").write_text("junk")
    assert source.code_digest(root) == before
    (root / "workers" / "flurka" / "workers_mod.py").write_text("NAME = 'edited'\n")
    assert source.code_digest(root) != before


def test_workers_get_the_drivers_flurka(tmp_path):
    """In a job, relative parts: each node's worker starts in its own unpacked working dir; else
    the driver's tree, absolute. A job that sets PYTHONPATH itself keeps it."""
    tree = _tree(tmp_path / "tree")
    assert source.worker_pythonpath({"working_dir": "gcs://_ray_pkg_x.zip"}, tree) == os.pathsep.join(source.PARTS)
    mine = os.pathsep.join(str(source.source_root() / p) for p in source.PARTS)
    assert source.worker_pythonpath({}, tree) == mine
    assert source.worker_pythonpath({"working_dir": "gcs://_ray_pkg_x.zip"}, tmp_path) == mine   # not a tree

    def job(runtime_env):
        return {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": runtime_env})}

    env = driver_runtime_env(None, None, environ=job({"working_dir": "gcs://x"}), cwd=str(tree))
    assert env == {"env_vars": {"PYTHONPATH": os.pathsep.join(source.PARTS)}}
    assert driver_runtime_env(None, None, environ=job({"working_dir": "gcs://x", "env_vars": {"PYTHONPATH": "p"}}),
                              cwd=str(tree)) is None


def test_code_that_was_not_submitted_is_one_line(tmp_path):
    # this process imports flurka from the checkout, not from tmp_path: as a job started there would
    line = source.mismatch({"working_dir": "gcs://x"}, cwd=tmp_path)
    assert line and "\n" not in line and "not what runs" in line and str(source.source_root()) in line
    assert source.mismatch({"working_dir": "gcs://x"}, cwd=source.source_root()) is None
    assert source.mismatch({}, cwd=tmp_path) is None               # not a job: nothing was submitted


def test_code_that_differs_from_its_stamp_is_one_line(monkeypatch, tmp_path):
    root = _tree(tmp_path)
    monkeypatch.setattr(source, "source_root", lambda: root)
    stamp = source.write_stamp(root)
    assert source.mismatch({}) is None
    (root / "dashboards" / "flurka" / "dashboards_mod.py").write_text("NAME = 'edited after submit'\n")
    line = source.mismatch({})
    assert line and "\n" not in line and "differs from what `flurka submit` stamped" in line
    assert stamp["stamped_at"] in line


@pytest.mark.parametrize("args, wd", [(["--address", "a", "--working-dir", "d", "--", "python", "x"], "d"),
                                      (["--working-dir=d2", "--", "python", "--working-dir", "e"], "d2")])
def test_submit_finds_the_working_dir(args, wd):
    assert source._working_dir(args) == wd


def test_submit_without_a_working_dir_or_a_tree_is_one_line(tmp_path):
    code, out, err = flurka(["submit", "--address", "http://127.0.0.1:1", "--", "python", "x.py"], tmp_path)
    assert (code, out) == (2, "") and err.startswith("flurka submit: error: give --working-dir") and err.count("\n") == 1
    code, _, err = flurka(["submit", "--working-dir", str(tmp_path), "--", "python", "x.py"], tmp_path)
    assert code == 2 and "holds no flurka tree" in err and err.count("\n") == 1
    assert not (tmp_path / source.STAMP).exists()
