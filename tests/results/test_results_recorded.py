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
