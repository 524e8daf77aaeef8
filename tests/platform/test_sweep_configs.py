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
    assert spec_lib.installed_configs() == ("paper-quality-glue", "paper-quality-image", "paper-quality-lra",
                                            "paper-quality-mlm", "paper-quality-nmt", "paper-uptrain", "uptrain-full",
                                            "uptrain-small")
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


def test_every_sweep_file_says_its_command_and_plans_dry(tmp_path, monkeypatch, capsys):
    """Issue 57: each shipped file's header gives its command; ``--dry-run`` prints its plan and
    steps and starts nothing (no Ray, no store, no run dir)."""
    import ray

    from flurka.sweeps import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray, "init", lambda *a, **k: (_ for _ in ()).throw(AssertionError("Ray started")))
    for name in spec_lib.installed_configs():
        header = (spec_lib.CONFIGS / f"{name}.yaml").read_text().split("\nbenchmarks:")[0]
        assert f"flurka sweep --config {name}" in header, name
        parser = spec_lib.ArgumentParser(prog="flurka sweep")
        cli.add_arguments(parser)
        assert cli.run(parser.parse_args(["--config", name, "--dry-run"])) == 0
        out = capsys.readouterr().out
        spec = spec_lib.validate(spec_lib.from_args({"config": name}))
        assert out.startswith(f"{name}: dry run, nothing started\nplan: ")
        assert f"over {len(spec.seeds)} seed(s)" in out and all(f"  {b}: " in out for b in spec.benchmarks)
        if spec.pretrain:   # a chained file: both phases, their steps, and each phase's predicted time per card
            assert f"plan: phase 1, pre-training on {spec.pretrain['benchmark']}: " in out
            assert f"  {spec.pretrain['benchmark']}: phase 1, pre-training; " in out
            assert all(f"  {b}: phase 2, fine-tuning from phase 1; " in out for b in spec.benchmarks)
            assert "of them pre-training)" in out
            assert any(line.startswith("  H") and "(pre-training " in line and "; fine-tuning " in line
                       for line in out.splitlines())
    assert list(tmp_path.iterdir()) == []


def test_the_paper_files_hold_the_appendix_alphas_and_bases():
    """Appendix: NMT Lin.-Perf. / Lin.-EVA at α 80 % from low-rank, Lin.-RNN 64 % from kernel;
    images 16.7 % / 33.3 %; no up-training elsewhere; Table 5's seven α."""
    def load(name):
        return spec_lib.validate(spec_lib.from_args({"config": name}))

    bases = {"flurka-performer": "low-rank", "flurka-rnn": "kernel", "flurka-eva": "low-rank"}
    uptrain = load("paper-uptrain")
    assert uptrain.benchmarks == ("nmt-ablation-ende",) and uptrain.alphas == spec_lib.PAPER_ALPHAS
    assert uptrain.base == bases and len(uptrain.seeds) >= 3
    nmt, image = load("paper-quality-nmt"), load("paper-quality-image")
    assert {v: nmt.alphas_of(v) for v in nmt.variants} == {"flurka-performer": (0.8,), "flurka-rnn": (0.64,),
                                                            "flurka-eva": (0.8,)}
    assert {v: image.alphas_of(v) for v in image.variants} == {"flurka-performer": (0.167,),
                                                                "flurka-rnn": (0.333,), "flurka-eva": (0.167,)}
    assert nmt.base == image.base == bases
    for name in ("paper-quality-lra", "paper-quality-mlm", "paper-quality-glue"):
        assert load(name).alphas == (0.0,)
    glue = load("paper-quality-glue")   # Table 2: every mechanism fine-tuned from its WikiText-103 MLM run
    assert glue.benchmarks == tuple(f"glue-{t}" for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"))
    assert glue.variants == ("flurka-performer", "flurka-rnn", "flurka-eva") and glue.full and glue.control
    assert glue.pretrain["benchmark"] == "mlm-wikitext103" and glue.pretrain["full_length"] == ("flurka-eva",)
    assert glue.seeds == load("paper-quality-mlm").seeds
    assert set(load("paper-quality-lra").benchmarks) == {"lra-listops", "lra-text", "lra-retrieval", "lra-image",
                                                         "lra-pathfinder"}
