"""Issue 58, point 7: a run dir that not every node of the cluster sees is refused before the first
trial, in one line naming the nodes that cannot see it (forks and the model upload read
``<run-dir>/work`` on whichever node runs them).

One real 2-node Ray cluster on this machine (loopback, free ports, own temp dirs, auth disabled;
stopped by process group, never ``ray stop``). The second node runs in a private mount namespace
where a tmpfs hides one folder of /tmp: a run dir there is what a node-local disk is on a real
cluster; a run dir anywhere else in /tmp is shared storage."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from unittest import mock

import pytest
from testsupport import JoiningNode, ray_node_ports, stop_ray_node, wait_ray_node

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY = ["--benchmarks", "lra-listops-small", "--variants", "flurka-rnn", "--alphas", "0.5", "--steps", "2",
        "--no-baselines", *[a for k, v in dict(d_model=16, d_ff=32, num_layers=1, eval_batches=1, batch_size=8).items()
                            for a in ("--set", f"{k}={v}")]]


def _private_mounts_refused(folder: Path) -> str | None:
    """Why this machine cannot hide ``folder`` from one process (no unshare, not permitted), or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "none",
                            str(folder)], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"cannot mount in a private mount namespace here: {probe.stderr.strip() or probe.returncode}"
    return None


@pytest.fixture(scope="module")
def two_nodes():
    """(address, env, hidden folder, the second node's id, why nothing is hidden or None), the test
    process connected to the cluster as a driver."""
    import ray

    hidden = Path(tempfile.mkdtemp(prefix="frk-hid-", dir="/tmp"))
    refused = _private_mounts_refused(hidden)
    head_tmp = tempfile.mkdtemp(prefix="frk-h-", dir="/tmp")        # short: unix sockets live here
    node_tmp = tempfile.mkdtemp(prefix="frk-n-", dir="/tmp")
    head_flags, head_ports = ray_node_ports(head=True)
    node_flags, node_ports = ray_node_ports(head=False, avoid=(head_ports["min-worker-port"],
                                                               head_ports["max-worker-port"]))
    address = f"127.0.0.1:{head_ports['port']}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAY_USAGE_STATS_ENABLED="0",
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")   # else a SIGTERMed node waits 30 s for its drain
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    popen = dict(env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    procs: list[tuple[subprocess.Popen, str]] = []
    leftovers: list[int] = []
    node = None
    try:
        head = subprocess.Popen([str(BIN / "ray"), "start", "--head", *common, *head_flags,
                                 "--include-dashboard", "false", "--temp-dir", head_tmp], **popen)
        procs.append((head, head_tmp))
        gcs = head_ports["port"]
        wait_ray_node(head, lambda: bool(socket.create_connection(("127.0.0.1", gcs), timeout=2).close() or 1),
                      f"the head's GCS on port {gcs}", 120)
        node_cmd = [str(BIN / "ray"), "start", "--address", address, *common, *node_flags, "--temp-dir", node_tmp]
        if refused is None:   # the second node's own view of the file system: `hidden` is an empty tmpfs there
            node_cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs none "$0" && exec "$@"', str(hidden), *node_cmd]
        node = JoiningNode(lambda: subprocess.Popen(node_cmd, **popen))
        with mock.patch.dict(os.environ, {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}):
            os.environ.pop("RAY_ADDRESS", None)
            ray.init(address=address, configure_logging=False, log_to_driver=False)
            try:
                deadline = time.monotonic() + 120
                while True:
                    alive = [n for n in ray.nodes() if n["Alive"]]
                    if len(alive) == 2:
                        break
                    node.check()
                    assert time.monotonic() < deadline, f"the second node did not join: {alive}"
                    time.sleep(1)
                second = next(n for n in alive if n["NodeManagerPort"] == node_ports["node-manager-port"])
                yield types.SimpleNamespace(address=address, env=env, hidden=hidden, refused=refused,
                                            second=f"{second['NodeManagerAddress']} (node {second['NodeID'][:8]}")
            finally:
                ray.shutdown()
    finally:
        if node is not None:
            procs.append((node.proc, node_tmp))
        for proc, temp_dir in reversed(procs):
            leftovers += stop_ray_node(proc, temp_dir)
        shutil.rmtree(hidden, ignore_errors=True)
    assert not leftovers, f"node processes survived the stop: {leftovers}"


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
