"""The embedded Ray of a sweep (``flurka.cluster.connect`` without an address) listens on
127.0.0.1 only (issue 58, point 4), checked with ``ss -ltnp``; the one-node switch it sets for
that is put back, so a ``ray start`` this process runs later can still join a cluster."""

from __future__ import annotations

import os
import subprocess
import sys

from testsupport import listening, off_loopback

DRIVER = """
import os, sys
import psutil, ray
from flurka.cluster import ONE_NODE_ENV, connect
from ray._private import ray_constants
sys.path.insert(0, sys.argv[2])
from testsupport import listening, off_loopback

connect(run_dir=sys.argv[1], num_cpus=1)
assert ray.get(ray.remote(lambda: 1).remote()) == 1          # a worker started, and answered
ours = {p.pid for p in psutil.Process().children(recursive=True)} | {os.getpid()}
sockets = listening(lambda pid: pid in ours)
assert {"gcs_server", "raylet"} <= {name for name, _ in sockets}, sockets
assert not off_loopback(sockets), f"listening off loopback: {off_loopback(sockets)}"
assert ONE_NODE_ENV not in os.environ and ray_constants.ENABLE_RAY_CLUSTER   # put back
ray.shutdown()
print("ok", len(sockets))
"""


def test_the_embedded_instance_listens_on_loopback_only(tmp_path):
    support = os.path.join(os.path.dirname(__file__), "..", "support")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / "run"), support], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.split()[-2] == "ok" and int(proc.stdout.split()[-1]) >= 4


def test_loopback_sockets_are_told_apart():
    """The check itself: what it counts as loopback, and what not."""
    sockets = [("gcs_server", "[::ffff:127.0.0.1]:6379"), ("raylet", "127.0.0.1:4000"), ("raylet", "*:4001"),
               ("agent", "0.0.0.0:52365"), ("agent", "192.0.2.2:52365"), ("client", "[::]:10001")]
    assert off_loopback(sockets) == sockets[2:]
    assert listening(lambda pid: False) == []
    assert subprocess.run(["ss", "-V"], capture_output=True).returncode == 0
