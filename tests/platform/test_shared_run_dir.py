"""Issue 58, point 7: a run dir that not every node of the cluster sees is refused before the first
trial, in one line naming the nodes that cannot see it (forks and the model upload read
``<run-dir>/work`` on whichever node runs them).

One real 2-node Ray cluster on this machine (loopback, free ports, own temp dirs, auth disabled;
stopped by process group, never ``ray stop``). The second node runs in a private mount namespace
where a tmpfs hides one folder of /tmp: a run dir there is what a node-local disk is on a real
cluster; a run dir anywhere else in /tmp is shared storage."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
from testsupport import private_mounts_refused, two_node_cluster

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY = ["--benchmarks", "lra-listops-small", "--variants", "flurka-rnn", "--alphas", "0.5", "--steps", "2",
        "--no-baselines", *[a for k, v in {"model.d_model": 16, "model.d_ff": 32, "model.num_layers": 1, "eval_batches": 1,
                                                     "batch_size": 8}.items()
                            for a in ("--set", f"{k}={v}")]]


@pytest.fixture(scope="module")
def two_nodes():
    """(address, env, hidden folder, the second node as check_shared_dir names it, why nothing is
    hidden or None), the test process connected to the cluster as a driver."""
    hidden = Path(tempfile.mkdtemp(prefix="frk-hid-", dir="/tmp"))
    refused = private_mounts_refused(hidden)
    try:
        with two_node_cluster(hidden, hide=refused is None) as cluster:
            second = cluster.second
            yield types.SimpleNamespace(address=cluster.address, env=cluster.env, hidden=hidden, refused=refused,
                                        second=f"{second['NodeManagerAddress']} (node {second['NodeID'][:8]}")
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


@pytest.mark.slow
def test_check_names_the_node_that_cannot_see_the_run_dir(two_nodes, tmp_path):
    from flurka.cluster import ClusterError, check_shared_dir

    shared = tmp_path / "run"
    shared.mkdir()
    t0 = time.monotonic()
    check_shared_dir(shared, embedded=False)                  # /tmp is one file system for both nodes
    assert list(shared.iterdir()) == []                       # the marker is gone again
    assert time.monotonic() - t0 < 30
    check_shared_dir(two_nodes.hidden, embedded=True)         # the embedded Ray has one node: nothing checked

    if two_nodes.refused:
        pytest.skip(f"cannot hide a folder from the second node: {two_nodes.refused}")
    private = two_nodes.hidden / "run"
    private.mkdir()
    with pytest.raises(ClusterError) as err:
        check_shared_dir(private, embedded=False, wait_s=1.0)
    line = str(err.value)
    assert "\n" not in line
    assert f"--run-dir {private} is not shared with 1 of the cluster's 2 nodes" in line
    assert f"nodes: {two_nodes.second}: no such dir there);" in line
    assert "every node mounts at the same path" in line
    assert list(private.iterdir()) == []


@pytest.mark.slow
def test_sweep_refuses_a_run_dir_one_node_cannot_see(two_nodes):
    if two_nodes.refused:
        pytest.skip(f"cannot hide a folder from the second node: {two_nodes.refused}")
    run_dir = two_nodes.hidden / "sweep"
    proc = subprocess.run([sys.executable, "experiments/uptrain_sweep.py", *TINY, "--address", two_nodes.address,
                           "--run-dir", str(run_dir)], env=two_nodes.env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"uptrain_sweep: error: --run-dir {run_dir} is not shared with 1 of the cluster's 2 "
                               f"nodes: {two_nodes.second}: no such dir there);"), lines[0]
    assert "[flurka] sweep " not in proc.stdout                # refused before the plan ran: no trial
    assert not run_dir.exists()                               # the sweep made it, the refusal removed it


def test_nothing_to_check_on_one_node_that_runs_the_driver(tmp_path, monkeypatch):
    """A one-node cluster whose node runs the driver (``ray job submit`` on a single machine)
    starts no task and writes nothing, as the embedded Ray does."""
    import ray

    from flurka import cluster

    node = "ab" * 28
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "NodeID": node, "NodeManagerAddress": "10.0.0.1"},
                                               {"Alive": False, "NodeID": "cd" * 28}])
    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(get_node_id=lambda: node))
    monkeypatch.setattr(ray, "remote", lambda *a, **k: pytest.fail("a task was started"))
    cluster.check_shared_dir(tmp_path, embedded=False)
    cluster.check_shared_dir(tmp_path / "absent", embedded=True)
    assert list(tmp_path.iterdir()) == []
