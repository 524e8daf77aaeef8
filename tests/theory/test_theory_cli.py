"""``python -m flurka.theory`` / ``flurka theory``: the theory JSON the report reads, bad
input as one line before any compute, and a fresh process without Ray, MLflow or SQL installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flurka.cli import main as flurka_main
from flurka.reports import sections, sources
from flurka import theory
from flurka.theory.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--seq-len", "32", "--d-model", "16", "--heads", "2", "--d-k", "8,16", "--features", "6",
        "--seeds", "0,1", "--batch", "1"]
MECHS = ["full", "linformer", "performer", "flurka-performer", "flurka-rnn"]


def test_theory_document_and_the_report_reading_it(tmp_path):
    doc_path = tmp_path / "sub" / "theory.json"  # parent made by the CLI
    assert main([*TINY, "--mechanisms", ",".join(MECHS), "--rank-mechanisms", "rnn,flurka-performer",
                 "--out", str(doc_path)]) == 0
    doc = json.loads(doc_path.read_text())
    assert doc["schema"] == "flurka.theory/1" and doc["device"]["name"] and doc["versions"]["jax"]
    assert doc["config"] == {"seq_len": 32, "d_model": 16, "num_heads": 2, "batch": 1, "seeds": [0, 1],
                             "d_k": [8, 16], "m": [6], "inputs": "standard normal",
                             "matmul_precision": "highest", "rank_d_k": 16, "rank_m": 6}
    errors = doc["approximation_errors"]
    # per seed: full 1, linformer 2 (d_k), performer 1 (m), flurka-performer 2 (d_k × m), flurka-rnn 2
    assert len(errors) == 2 * (1 + 2 + 1 + 2 + 2)
    assert {(r["mechanism"], r["d_k"], r["m"]) for r in errors if r["seed"] == 1} == {
        ("full", None, None), ("linformer", 8, None), ("linformer", 16, None), ("performer", None, 6),
        ("flurka-performer", 8, 6), ("flurka-performer", 16, 6), ("flurka-rnn", 8, None), ("flurka-rnn", 16, None)}
    assert theory.mean_error(errors, mechanism="full") < 1e-6  # same W's: exact
    for r in errors:
        if r["mechanism"].startswith("flurka-"):  # Theorem 1's triangle inequality
            assert r["rel_error"] <= r["kernel_term"] + r["lowrank_term"] + 1e-9
    ranks = doc["ranks"]
    assert len(ranks) == 2 * 2 * 1 * 2  # mechanisms × seeds × examples × heads
    for r in ranks:
        assert 1 <= r["rank"] <= r["max_rank"]
        if r["mechanism"] == "flurka-performer":
            assert r["max_rank"] == 16 and r["d_k"] == 16 and r["rank"] <= r["m"] == 6
        else:  # elu+1 features of a d_h = 8 head: rank at most 8 of a 32 × 32 matrix
            assert r["max_rank"] == 32 and r["rank"] <= 8

    # the report's reader: every row, with the device and config in the captions
    loaded = sources.load_theory([doc_path])
    assert len(loaded.errors) == 16 and len(loaded.ranks) == 8
    assert set(loaded.errors["device"]) == {json.loads(doc_path.read_text())["device"]["name"]}
    err, rank = sections.error_section(loaded), sections.rank_section(loaded)
    assert err.missing is None and rank.missing is None
    table = next(i.df for i in err.items if isinstance(i, sections.Table)).reset_index()
    assert set(table["mechanism"]) == set(MECHS)
    assert (table["seeds"] == 2).all()
    caption = next(i for i in err.items if isinstance(i, sections.Table)).caption
    assert "seq_len=32" in caption and "d_model=16" in caption and "theory.json" in caption
    summary = next(i.df for i in rank.items if isinstance(i, sections.Table))
    assert list(summary.index) == ["rnn", "flurka-performer"] and (summary["heads"] == 4).all()


def _forbid_compute(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("computed before validating the input")

    monkeypatch.setattr(theory, "approximation_errors", boom)
    monkeypatch.setattr(theory, "kernel_attention_ranks", boom)


@pytest.mark.parametrize("argv,message", [
    (["--seq-len", "32", "--d-k", "8,64"], "d_k=64 must not exceed seq_len=32"),
    (["--mechanisms", "full,softmax"], "unknown mechanism 'softmax'; valid: full, flash, linformer"),
    (["--rank-mechanisms", "eva"], "rank needs a feature-map mechanism, got 'eva'"),
    (["--d-model", "64", "--heads", "5"], "num_heads=5 must divide d_model=64"),
    (["--seq-len", "32", "--d-k", "16", "--rank-d-k", "33"], "d_k=33 must not exceed seq_len=32"),
    (["--seeds", "0,0"], "--seeds has duplicates"),
])
def test_bad_input_is_one_line_before_compute(tmp_path, capsys, monkeypatch, argv, message):
    _forbid_compute(monkeypatch)
    out = tmp_path / "theory.json"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m flurka.theory: error: ")
    assert message in err
    assert flurka_main(["theory", *argv, "--out", str(out)]) == 2  # the same through `flurka theory`
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("flurka theory: error: ") and message in err
    assert not out.exists()


def test_argparse_rejects_non_positive_sizes(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--d-k", "8,-2"])
    assert info.value.code == 2 and "expected a positive integer, got -2" in capsys.readouterr().err


def test_fresh_process_without_ray_mlflow_or_sql(tmp_path):
    """``python -m flurka.theory`` with Ray, MLflow, SQLAlchemy and pandas made unimportable
    (as on a GPU box with JAX alone)."""
    blocked = tmp_path / "blocked"
    for name in ("ray", "mlflow", "sqlalchemy", "pandas", "alembic"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    out = tmp_path / "theory.json"
    proc = subprocess.run(
        [sys.executable, "-m", "flurka.theory", "--seq-len", "16", "--d-model", "8", "--heads", "2",
         "--d-k", "8", "--features", "4", "--seeds", "0", "--batch", "1", "--mechanisms", "full,flurka-rnn",
         "--rank-mechanisms", "rnn", "--out", str(out)],
        cwd=tmp_path, env={**_env(), "PYTHONPATH": str(blocked)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"wrote {out}: 2 approximation-error rows (2 mechanisms), 2 rank rows")
    doc = json.loads(out.read_text())
    assert [r["mechanism"] for r in doc["approximation_errors"]] == ["full", "flurka-rnn"]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
