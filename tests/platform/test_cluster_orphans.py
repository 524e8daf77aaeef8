"""A driver killed outright leaves its embedded Ray's agents running (issue 40): the next start
in that run dir stops them, and only them, by the session the run dir recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flurka.cluster import SESSION_RECORD, _uses, reap_orphans

DRIVER = """
import sys, time
from flurka.cluster import connect
ctx = connect(run_dir=sys.argv[1], num_cpus=1)
print("up", flush=True)
time.sleep(600)
"""


def _session_procs(session: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if p.pid != os.getpid() and _uses(p, session)]


def _core_left(procs: list[psutil.Process]) -> bool:
    """Whether the raylet or GCS (not an agent, renamed ``ray::…``) is among ``procs`` and alive
    (one that ends, or is a zombie, meanwhile is not)."""
    for p in procs:
        try:
            if "ray::" not in " ".join(p.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


@pytest.mark.slow
def test_the_next_start_stops_what_a_killed_driver_left(tmp_path):
    run = tmp_path / "run"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "up"
        record = json.loads((run / SESSION_RECORD).read_text())
        assert record["driver_pid"] == driver.pid and Path(record["session_dir"]).is_dir()
        assert reap_orphans(run) == 0            # its driver is alive: nothing is touched
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 30         # the raylet and GCS follow the driver; agents stay
        left = _session_procs(record["session_dir"])
        while time.monotonic() < deadline and _core_left(left):
            time.sleep(0.5)
            left = _session_procs(record["session_dir"])
        assert left, "Ray left nothing behind: the case this guards against is gone"
        assert 1 <= reap_orphans(run) <= len(left)   # an agent may still end by itself meanwhile
        assert not _session_procs(record["session_dir"])
        assert not (run / SESSION_RECORD).exists()
    finally:
        if driver.poll() is None:
            driver.kill()
