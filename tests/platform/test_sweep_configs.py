"""The sweep files ship with the package (issue 41): ``--config uptrain-small`` finds the main
job's file from any directory, a wheel carries it, and a path still wins over a name."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from flurka.sweeps import spec as spec_lib

ROOT = Path(__file__).resolve().parents[2]


def test_a_name_finds_the_installed_file_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert spec_lib.installed_configs() == ("uptrain-full", "uptrain-small")
    path = spec_lib.config_path("uptrain-small")
    assert path == ROOT / "platform/flurka/sweeps/configs/uptrain-small.yaml"
    spec = spec_lib.validate(spec_lib.from_args({"config": "uptrain-small"}))
    assert spec.name == "uptrain-small" and spec.benchmarks == ("nmt-list-small",) and len(spec.seeds) == 3
    # a file of that name here is the user's, and wins
    (tmp_path / "uptrain-small").write_text("benchmarks: [lra-listops-small]\nname: mine\n")
    assert spec_lib.from_args({"config": "uptrain-small"}).name == "mine"


def test_the_wheel_carries_the_sweep_files(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("flurka-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in spec_lib.installed_configs():
        packaged = f"flurka/sweeps/configs/{name}.yaml"
        assert packaged in names
        assert zipfile.ZipFile(wheel).read(packaged) == (spec_lib.CONFIGS / f"{name}.yaml").read_bytes()
