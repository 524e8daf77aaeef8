"""``flurka flops``: the spec's two facts, through the dispatcher and the installed script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flurka.attention.flops import FLURKA, MECHANISMS
from flurka.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAPER_ARGS = ["--d-model", "2600", "--heads", "8", "--d-k", "1500", "--features", "325", "--json"]


def _records(stdout: str) -> dict[str, dict]:
    records = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    return {r["mechanism"]: r for r in records}


def test_long_sequence_flurka_variants_beat_both_constituents(capsys):
    """flurka-eva beats Linformer where its chunks summarise several compressed rows: with EVA's
    16-position chunks at d_k/N = 1500/55 500 each chunk is one row, and it attends every row
    as a summary (flurka.attention.flops.flurka_eva_sizes); with --chunk-size 64, two."""
    assert main(["flops", "--seq-len", "55500", *PAPER_ARGS]) == 0
    records = _records(capsys.readouterr().out)
    assert list(records) == list(MECHANISMS)
    for name in FLURKA:
        r, kernel = records[name], name.removeprefix("flurka-")
        fewer = {"linformer": name != "flurka-eva", kernel: True}
        assert r["fewer_than_constituents"] == fewer
        # the flag agrees with the printed numbers
        assert (r["flops"] < records["linformer"]["flops"]) == fewer["linformer"]
        assert r["flops"] < records[kernel]["flops"]
        assert r["claims"] == {"claim1": True, "claim2": True, "claim3": True}
        assert sum(r["breakdown"].values()) == r["flops"] > r["dot_flops"] > 0
    for name in set(MECHANISMS) - set(FLURKA):
        assert records[name]["claims"] is None and records[name]["fewer_than_constituents"] is None
    assert records["full"]["config"]["seq_len"] == 55500
    assert main(["flops", "--seq-len", "55500", *PAPER_ARGS, "--chunk-size", "64",
                 "--mechanism", "flurka-eva"]) == 0
    (r,) = _records(capsys.readouterr().out).values()
    assert r["fewer_than_constituents"] == {"linformer": True, "eva": True}


def test_installed_script_short_sequence_claim1_fails():
    script = ROOT / ".venv" / "bin" / "flurka"
    proc = subprocess.run([str(script), "flops", "--seq-len", "7050", *PAPER_ARGS],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    records = _records(proc.stdout)
    for name in FLURKA:
        assert records[name]["claims"]["claim1"] is False
        assert records[name]["claims"]["claim2"] is True  # N - 1 > d_k > d_h still holds


def test_table_output(capsys):
    # --features left out: performer's default (256 features) is used
    assert main(["flops", "--seq-len", "4096", "--d-model", "512", "--heads", "8", "--d-k", "256",
                 "--mechanism", "full", "--mechanism", "flurka-rnn"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("mechanism")
    assert "flurka-rnn" in out and "linformer: " in out and "performer" not in out


@pytest.mark.parametrize("argv,message", [
    (["--seq-len", "100", "--d-model", "64", "--heads", "4", "--d-k", "200", "--features", "8"],
     "d_k=200 must not exceed seq_len=100"),
    (["--seq-len", "100", "--d-model", "64", "--heads", "5", "--d-k", "20", "--features", "8"],
     "must divide d_model=64"),
])
def test_bad_configuration_is_one_clear_line(capsys, argv, message):
    assert main(["flops", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_non_positive_number_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["flops", "--seq-len", "-3", "--d-model", "64", "--heads", "4", "--d-k", "2",
              "--features", "8"])
    assert exit_info.value.code == 2
    assert "expected a positive integer, got -3" in capsys.readouterr().err
