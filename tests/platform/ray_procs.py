"""Process helpers for the platform tests that start their own Ray head or driver."""

from __future__ import annotations

import os
from pathlib import Path


def pids_naming(marker: str) -> list[int]:
    """PIDs of processes whose command line names ``marker`` (a test's own temp/run dir), so a test
    stops exactly the Ray processes it started — never `ray stop`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                out.append(int(pid))
        except OSError:
            pass
    return out
