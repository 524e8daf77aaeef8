"""Every result document recorded in the repository (benchmarks/results/) still ingests into a
fresh results database: the schema and the validators may evolve, the recorded runs may not be
lost to them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flurka.results import ingest_file, open_results

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(p for p in (ROOT / "benchmarks" / "results").rglob("*.json")
                   if str(json.loads(p.read_text()).get("schema", "")).startswith(
                       ("flurka.speed/", "flurka.speed.plain/", "flurka.theory/")))


def test_there_are_recorded_documents():
    kinds = {json.loads(p.read_text())["schema"] for p in DOCUMENTS}
    assert kinds == {"flurka.speed/1", "flurka.speed.plain/1", "flurka.theory/1"}, kinds


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_recorded_document_ingests(path, tmp_path):
    engine = open_results(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        first = ingest_file(engine, path)
        assert first.added > 0 and first.skipped == 0
        assert ingest_file(engine, path).added == 0
    finally:
        engine.dispose()


SWEEP_FULL = ROOT / "benchmarks" / "results" / "cpu" / "2026-12-06-nmt-list" / "uptrain-full.json"


def test_the_recorded_sweep_full_gives_table_5(tmp_path):
    """make sweep-full's results, committed as the sweep record it wrote: ingested into a fresh
    database, Table 5 has every variant at its paper base, both d_k and the seven α, each cell over
    three seeds, with the no-attention floor beside them; the observations judge all three."""
    from flurka.results import quality_tables

    engine = open_results(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        assert ingest_file(engine, SWEEP_FULL).added > 0
        table = quality_tables.uptraining_table(engine, benchmark="nmt-list-small", metric="bleu")
        obs = quality_tables.uptraining_observations(engine, benchmark="nmt-list-small", metric="bleu")
    finally:
        engine.dispose()
    assert list(table.index) == [(v, b, d) for v, b in (("flurka-performer", "low-rank"), ("flurka-rnn", "kernel"),
                                                         ("flurka-eva", "low-rank")) for d in (8, 16)]
    assert list(table.columns) == ["kernel constituent", "kernel", "low-rank",
                                   *(f"{a:g}%" for a in (12.5, 25, 37.5, 50, 62.5, 75, 87.5)), "no attention"]
    cells = table.drop(columns="kernel constituent").to_numpy().ravel()
    assert all("(n=3)" in c for c in cells)
    assert [line[:4] for line in quality_tables.observation_lines(obs)] == ["(1) ", "(2) ", "(3) "]
    assert "not judged" not in quality_tables.observation_lines(obs)[2]
