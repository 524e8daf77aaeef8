"""Theory documents (``python -m flurka.theory``) as rows of the results database, on SQLite
and PostgreSQL: validated up front, idempotent, all-or-nothing, and read back by the report exactly
as it reads the same document from a file."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pandas as pd
import pytest
import sqlalchemy as sa

from flurka.cli import main
from flurka.results import TheoryRecord, ingest_file, ingest_theory, models
from flurka.results.ingest import IngestReport

THEORY_TABLES = [models.Environment, models.TheoryRun, models.ApproximationError, models.KernelRank]
ERROR_FIELDS = ["mechanism", "d_k", "m", "seed", "layer", "rel_error", "inf_error", "kernel_term", "lowrank_term"]
RANK_FIELDS = ["mechanism", "seed", "example", "head", "layer", "rank", "max_rank", "d_k", "m", "trained"]


def counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t.__tablename__: conn.scalar(sa.select(sa.func.count()).select_from(t)) for t in THEORY_TABLES}


def stored(engine, model, fields) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            sa.select(*(getattr(model, f) for f in fields)).order_by(model.id))]


def n_rows(doc) -> int:
    return len(doc["approximation_errors"]) + len(doc["ranks"])


def test_document_round_trips(engine, theory_doc_of):
    doc = theory_doc_of(captured=True)
    assert ingest_theory(engine, doc) == IngestReport(n_rows(doc), 0)
    assert counts(engine) == {"environments": 1, "theory_runs": 1, "approximation_errors": 18, "kernel_ranks": 16}
    want = [{f: r.get(f) for f in ERROR_FIELDS} for r in doc["approximation_errors"]]
    assert stored(engine, models.ApproximationError, ERROR_FIELDS) == want
    assert {r["mechanism"] for r in want} == {"full", "flash", "linformer", "performer", "rnn", "eva",
                                              "flurka-performer", "flurka-rnn", "flurka-eva"}
    assert stored(engine, models.KernelRank, RANK_FIELDS) == [{f: r.get(f) for f in RANK_FIELDS} for r in doc["ranks"]]
    assert {r["layer"] for r in stored(engine, models.KernelRank, RANK_FIELDS)} == {0, 1}
    assert {(r["mechanism"], r["trained"]) for r in stored(engine, models.KernelRank, RANK_FIELDS)} == {
        ("performer", False), ("flurka-rnn", True)}  # the trained layer's own ranks stay marked
    with engine.connect() as conn:
        run = conn.execute(sa.select(models.TheoryRun)).one()
        env = conn.execute(sa.select(models.Environment)).one()
    config = run.config if isinstance(run.config, dict) else json.loads(run.config)
    assert config == doc["config"] and list(config) == list(doc["config"])  # opaque, order kept (captions)
    assert config["source"]["step"] == 40
    created = run.created_at if run.created_at.tzinfo else run.created_at.replace(tzinfo=dt.timezone.utc)
    assert created == dt.datetime(2026, 11, 26, 9, tzinfo=dt.timezone.utc)
    assert (env.device, env.host, env.versions) == ("cpu", "laptop", {"jax": "0.10.0", "python": "3.11.9"})
    assert run.environment_id == env.id and len(run.key) == 64


def test_same_document_twice_adds_nothing(engine, theory_doc, theory_doc_of):
    n = n_rows(theory_doc)
    assert ingest_theory(engine, theory_doc) == IngestReport(n, 0)
    after = counts(engine)
    assert ingest_theory(engine, theory_doc) == IngestReport(0, n)
    assert ingest_theory(engine, {**theory_doc, "created": "2026-11-26T10:00:00+01:00"}) == IngestReport(0, n)
    assert counts(engine) == after
    # Another run (later, or other inputs) on the same machine: new rows, the same environment row.
    assert ingest_theory(engine, theory_doc_of(created="2026-11-27T10:00:00+00:00")).added == n
    assert ingest_theory(engine, theory_doc_of(captured=True)).added == 2 * n
    assert counts(engine) == {"environments": 1, "theory_runs": 3, "approximation_errors": 9 * 4,
                              "kernel_ranks": 8 * 4}


def _without(row: dict, field: str) -> dict:
    return {k: v for k, v in row.items() if k != field}


@pytest.mark.parametrize("change, message", [
    (lambda d: d["approximation_errors"].__setitem__(2, _without(d["approximation_errors"][2], "rel_error")),
     "theory document approximation_errors[2]: missing rel_error"),
    (lambda d: d.__setitem__("schema", "flurka.theory/2"),
     "theory document: schema 'flurka.theory/2' is not 'flurka.theory/1'"),
    (lambda d: d["ranks"][-1].__setitem__("rank", -3),
     "theory document ranks[7]: rank must be an int >= 0, got -3"),
    (lambda d: d["ranks"][0].__setitem__("rank", 99), "theory document ranks[0]: rank 99 exceeds max_rank 16"),
    (lambda d: d["ranks"][1].__setitem__("layer", -1), "theory document ranks[1]: layer must be an int >= 0"),
    (lambda d: d["ranks"][1].__setitem__("trained", "yes"), "theory document ranks[1]: trained must be true or false"),
    (lambda d: d["approximation_errors"][0].__setitem__("inf_error", float("nan")),
     "approximation_errors[0]: inf_error must be a finite number"),
    (lambda d: d["approximation_errors"][4].__setitem__("mechanism", "softmax"),
     "approximation_errors[4]: mechanism 'softmax' is not one of full, flash"),
    (lambda d: d["approximation_errors"][0].__setitem__("colour", "red"), "approximation_errors[0]: unknown colour"),
    (lambda d: d.__setitem__("created", "yesterday"), "theory document: created must be an ISO 8601 time"),
    (lambda d: d.__setitem__("config", [1, 2]), "theory document: config must be a JSON object, got list"),
    (lambda d: d.__setitem__("device", {"platform": "cpu"}), "theory document: device must be a non-empty string"),
    (lambda d: d.update(approximation_errors=[], ranks=[]), "holds no approximation_errors or ranks rows"),
])
def test_bad_document_is_one_line_and_writes_nothing(engine, theory_doc, change, message):
    change(theory_doc)
    with pytest.raises(ValueError) as info:
        ingest_theory(engine, theory_doc)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert set(counts(engine).values()) == {0}


def test_database_error_mid_document_rolls_back(engine, theory_doc):
    """A row the database itself refuses (NOT NULL), past validation, aborts the whole run."""
    record = TheoryRecord.from_dict(theory_doc)
    broken = dataclasses.replace(record, ranks=[*record.ranks[:-1], dataclasses.replace(record.ranks[-1], head=None)])
    with pytest.raises(sa.exc.IntegrityError):
        ingest_theory(engine, broken)
    assert set(counts(engine).values()) == {0}
    assert ingest_theory(engine, record).added == n_rows(theory_doc)


def test_deleting_a_run_deletes_its_rows(engine, theory_doc, theory_doc_of):
    ingest_theory(engine, theory_doc)
    ingest_theory(engine, theory_doc_of(captured=True))
    with engine.begin() as conn:
        conn.execute(sa.delete(models.TheoryRun).where(models.TheoryRun.id == 1))
    assert counts(engine) == {"environments": 1, "theory_runs": 1, "approximation_errors": 18, "kernel_ranks": 16}


def test_ingest_file_routes_theory_documents(engine, theory_doc, tmp_path):
    path = tmp_path / "theory.json"
    path.write_text(json.dumps(theory_doc))
    assert ingest_file(engine, path) == IngestReport(n_rows(theory_doc), 0)
    assert ingest_file(engine, path) == IngestReport(0, n_rows(theory_doc))
    # Without a schema, theory rows still make it a theory document (not a sweep record).
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({**_without(theory_doc, "schema"), "created": "2026-12-01T00:00:00"}))
    assert ingest_file(engine, bare).added == n_rows(theory_doc)
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"schema": "flurka.theory/9", "created": "2026-12-02T00:00:00", "rows": []}))
    with pytest.raises(ValueError, match=r"future\.json: theory document: schema 'flurka.theory/9' is not 'flurka.theory/1'$"):
        ingest_file(engine, future)
    assert counts(engine)["theory_runs"] == 2


def test_flurka_ingest_command(db_url, theory_doc, tmp_path, capsys):
    path = tmp_path / "theory.json"
    path.write_text(json.dumps(theory_doc))
    n = n_rows(theory_doc)
    assert main(["ingest", "--db", db_url, str(path)]) == 0
    assert f"theory.json: added {n}, already present 0" in capsys.readouterr().out
    assert main(["ingest", "--db", db_url, str(path)]) == 0
    assert f"theory.json: added 0, already present {n}" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**theory_doc, "ranks": [{**theory_doc["ranks"][0], "rank": -1}]}))
    assert main(["ingest", "--db", db_url, str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "ranks[0]: rank must be an int >= 0" in err and "\n" not in err


def test_report_reads_the_database_as_it_reads_the_file(engine, theory_doc, theory_doc_of, tmp_path):
    """The report's frames from the database equal those from the same documents as files (but
    for where they came from); a file already ingested counts once."""
    from flurka.reports import sources

    docs = [theory_doc, theory_doc_of(captured=True)]
    paths = []
    for i, doc in enumerate(docs):
        ingest_theory(engine, doc)
        paths.append(tmp_path / f"theory-{i}.json")
        paths[-1].write_text(json.dumps(doc))
    from_db, from_files = sources.stored_theory(engine), sources.load_theory(paths)
    for got, want in ((from_db.errors, from_files.errors), (from_db.ranks, from_files.ranks)):
        assert len(got) == len(want) > 0
        assert got["source"].str.startswith("results DB (theory run of 2026-11-26 09:00 UTC)").all()
        pd.testing.assert_frame_equal(got.drop(columns="source"), want.drop(columns="source"))
    assert set(from_db.ranks["config"]) == {
        "seq_len=16, d_model=16, num_heads=2, batch=2, seeds=[0], d_k=[8], m=[4], inputs=standard normal, "
        "matmul_precision=highest, rank_d_k=8, rank_m=4",
        "seq_len=16, d_model=16, num_heads=2, batch=2, seeds=[0], d_k=[8], m=[4], inputs=captured: listops-rnn "
        "(lra-listops-small, flurka-rnn, step 40), matmul_precision=highest, rank_d_k=8, rank_m=4, "
        "source={'run_dir': '/runs/listops-rnn', 'step': 40, 'benchmark': 'lra-listops-small', "
        "'attention': 'flurka-rnn'}"}
    both = sources.with_stored(engine, from_files)
    assert len(both.errors) == len(from_db.errors) and len(both.ranks) == len(from_db.ranks)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(theory_doc_of(created="2026-11-28T00:00:00+00:00")))
    more = sources.with_stored(engine, sources.load_theory([other]))
    assert len(more.errors) == len(from_db.errors) + len(theory_doc["approximation_errors"])
    assert set(more.errors["source"]) == {"other.json", *from_db.errors["source"]}
