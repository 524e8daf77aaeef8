"""Headless Chromium as the tests open pages with it: the report (tests/reports) and the MLflow UI
that ``flurka ui`` serves (tests/infra). Debian's chromium; ``.ci/run`` installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium_binary() -> str:
    """The binary; missing: the test fails in CI (``.ci/run`` installs it) and skips elsewhere."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed in CI: .ci/run must apt-get install chromium")
    pytest.skip("chromium not installed (apt-get install chromium; .ci/run does)")


def chromium(binary: str, tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """One headless run with a fresh profile under ``tmp_path`` (a new user's browser: no stored
    settings), quiet about the network it must not use."""
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
