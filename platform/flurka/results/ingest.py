"""Writing records into the results database: idempotent and all-or-nothing.

Each call is one transaction. Rows are found by their natural keys first, so ingesting the same
sweep (or speed or theory file) twice adds nothing, and a growing sweep re-ingested adds only its new
trials; an existing trial is never rewritten (first write wins). Any failure rolls the whole
call back, so no partial sweep is ever visible.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from flurka.results.models import (ApproximationError, CurvePoint, Environment, KernelRank, Metric,
                                    SpeedMeasurement, Sweep, TheoryRun, Trial)
from flurka.results.records import (TRIAL_COLUMNS, EnvironmentRecord, SpeedRecord, SweepRecord, TheoryRecord,
                                     TrialRecord, is_theory_document, measured_config, speed_records_from_document)


@dataclasses.dataclass(frozen=True)
class IngestReport:
    added: int  # trials (speed measurements, theory rows) written by this call
    skipped: int  # already present, left as they were
    updated: int = 0  # speed measurements stored before, their FLOP-model fields re-derived since


def _environment(session: Session, env: EnvironmentRecord) -> Environment:
    row = session.scalar(sa.select(Environment).where(Environment.fingerprint == env.fingerprint))
    if row is None:
        row = Environment(fingerprint=env.fingerprint, device=env.device, host=env.host, versions=env.versions)
        session.add(row)
    return row


def _add_trial(session: Session, sweep: Sweep, t: TrialRecord) -> None:
    trial = Trial(
        sweep=sweep, **{name: getattr(t, name) for name in TRIAL_COLUMNS},
        metrics=[Metric(name=k, value=v) for k, v in t.metrics.items()],
        curve=[CurvePoint(step=p["step"], name=k, value=v) for p in t.curve for k, v in p.items() if k != "step"],
    )
    session.add(trial)
    session.flush()  # surface constraint errors here, inside the transaction


def ingest_sweep(engine: Engine, record: SweepRecord | Mapping[str, Any]) -> IngestReport:
    """Add a sweep and its trials; returns how many trials were added and how many already existed."""
    if not isinstance(record, SweepRecord):
        record = SweepRecord.from_dict(record)  # validate everything before touching the database
    added = skipped = 0
    with Session(engine) as session, session.begin():
        sweep = session.scalar(sa.select(Sweep).where(Sweep.external_id == record.sweep_id))
        if sweep is None:
            sweep = Sweep(external_id=record.sweep_id, name=record.name, created_at=record.created_at,
                          git_commit=record.git_commit, environment=_environment(session, record.environment))
            session.add(sweep)
            session.flush()
            existing: set[str] = set()
        else:
            existing = set(session.scalars(sa.select(Trial.trial_key).where(Trial.sweep_id == sweep.id)))
        for t in record.trials:
            if t.trial_key in existing:
                skipped += 1
            else:
                _add_trial(session, sweep, t)
                added += 1
    return IngestReport(added, skipped)


def _rederived(session: Session, r: SpeedRecord) -> SpeedMeasurement | None:
    """The stored row that ``r`` is with its FLOP-model fields re-derived: the same environment,
    configuration, run (or none stored) and median step time, and its config but for those
    fields (:func:`flurka.results.records.measured_config`)."""
    if r.status != "ok" or r.median_s is None:
        return None
    rows = session.scalars(
        sa.select(SpeedMeasurement).join(Environment, Environment.id == SpeedMeasurement.environment_id)
        .where(Environment.fingerprint == r.environment.fingerprint, SpeedMeasurement.mechanism == r.mechanism,
               SpeedMeasurement.mode == r.mode, SpeedMeasurement.scope == r.scope, SpeedMeasurement.seq_len == r.N,
               SpeedMeasurement.dtype == r.dtype, SpeedMeasurement.median_s == r.median_s,
               sa.or_(SpeedMeasurement.run == r.run, SpeedMeasurement.run.is_(None))))
    return next((row for row in rows if measured_config(row.config) == measured_config(r.config)), None)


def ingest_speed(engine: Engine, records: Iterable[SpeedRecord | Mapping[str, Any]]) -> IngestReport:
    """Add speed measurements (records, or the dicts of a speed benchmark's JSON file). A
    measurement already stored is skipped, its run filled in if it was stored without one
    (before revision 0003): ingesting a document again lets old rows pair within their run. One
    stored with other FLOP-model fields (a document re-derived since,
    ``flurka.speed.bench.rederive``) takes the new ones (``updated``), never a second row."""
    parsed = [r if isinstance(r, SpeedRecord) else SpeedRecord.from_dict(r, f"speed records[{i}]")
              for i, r in enumerate(records)]
    added = skipped = updated = 0
    with Session(engine) as session, session.begin():
        seen = set(session.scalars(sa.select(SpeedMeasurement.key).where(
            SpeedMeasurement.key.in_([r.key for r in parsed]))))
        stored: dict[str, list[str]] = {}   # run -> keys already stored, whose run may be unknown
        for r in parsed:
            if r.key in seen:
                skipped += 1
                if r.run is not None:
                    stored.setdefault(r.run, []).append(r.key)
                continue
            seen.add(r.key)
            old = _rederived(session, r)
            if old is not None:
                old.key, old.flops, old.config, old.run = r.key, r.flops, r.config, old.run or r.run
                session.flush()
                updated += 1
                continue
            session.add(SpeedMeasurement(
                key=r.key, environment=_environment(session, r.environment), mechanism=r.mechanism,
                mode=r.mode, scope=r.scope, seq_len=r.N, d_model=r.d_model, heads=r.heads, d_k=r.d_k,
                num_features=r.m, batch=r.batch, dtype=r.dtype, status=r.status, median_s=r.median_s, spread_s=r.spread_s, flops=r.flops,
                config=r.config, run=r.run))
            session.flush()
            added += 1
        for run, keys in stored.items():   # one statement a run (a document has one, or one a task)
            session.execute(sa.update(SpeedMeasurement)
                            .where(SpeedMeasurement.key.in_(keys), SpeedMeasurement.run.is_(None))
                            .values(run=run))
    return IngestReport(added, skipped, updated)


def ingest_theory(engine: Engine, record: TheoryRecord | Mapping[str, Any]) -> IngestReport:
    """Add a ``flurka.theory`` document as one theory run with its error and rank rows; the
    counts are rows. A document already ingested (same time, device and config) adds nothing."""
    if not isinstance(record, TheoryRecord):
        record = TheoryRecord.from_dict(record)  # every row validated before touching the database
    rows = len(record.errors) + len(record.ranks)
    with Session(engine) as session, session.begin():
        if session.scalar(sa.select(TheoryRun.id).where(TheoryRun.key == record.key)) is not None:
            return IngestReport(0, rows)
        session.add(TheoryRun(
            key=record.key, environment=_environment(session, record.environment), created_at=record.created_at,
            config=record.config,
            errors=[ApproximationError(**dataclasses.asdict(r)) for r in record.errors],
            ranks=[KernelRank(**dataclasses.asdict(r)) for r in record.ranks]))
        session.flush()
    return IngestReport(rows, 0)


def load_json(path: str | Path) -> Any:
    """A sweep record or document (object) or speed records (list) from a JSON file, with a
    one-line error."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read results JSON {path}: {e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read results JSON {path}: not UTF-8 text") from None
    except RecursionError:
        raise ValueError(f"cannot read results JSON {path}: nested deeper than Python's JSON reader "
                         "follows; no results file is") from None


Parsed = SweepRecord | TheoryRecord | list[SpeedRecord]


def sweep_spec_line(path: str | Path, state: Mapping[str, Any]) -> str:
    """The one line for a run dir's ``sweep.json`` given as a results file: it is the sweep's spec
    (what ``--resume`` reads back), and the sweep has written its trials to its database already."""
    spec = state.get("spec") if isinstance(state.get("spec"), Mapping) else {}
    results = spec.get("results_db") or str(Path(path).parent / "results.db")
    return (f"{path} is sweep {state.get('sweep_id')}'s spec (its sweep.json, read back by --resume), not a "
            f"results file: the sweep wrote its trials to {results} already; read them with "
            f"`flurka tables --db {results} --table uptraining`")


def parse_file(path: str | Path) -> Parsed:
    """Read and validate one results file, writing nothing: a list is speed records, a
    ``flurka.theory/1`` object (or one with ``approximation_errors``/``ranks``) a
    ``flurka.theory`` document, an object with ``results`` a ``flurka.speed`` document, one
    with ``sweep_id`` or ``trials`` a sweep record. Errors name the file: a lease's folder also
    holds JSON that is none of these (its card checks, the fused kernels' tuning)."""
    data = load_json(path)
    if isinstance(data, dict) and "spec" in data and "sweep_id" in data and "trials" not in data:
        raise ValueError(sweep_spec_line(path, data))
    try:
        if is_theory_document(data):
            return TheoryRecord.from_dict(data)
        if isinstance(data, list):
            return [SpeedRecord.from_dict(r, f"speed records[{i}]") for i, r in enumerate(data)]
        if isinstance(data, dict) and "results" in data:
            return speed_records_from_document(data)
        if isinstance(data, dict) and data.keys() & {"sweep_id", "trials"}:
            return SweepRecord.from_dict(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    raise ValueError(f"{path}: not a results file (a flurka.speed or flurka.theory document, a list "
                     "of speed records or a sweep record)")


def ingest_parsed(engine: Engine, parsed: Parsed) -> IngestReport:
    """Write what :func:`parse_file` read (one transaction)."""
    if isinstance(parsed, TheoryRecord):
        return ingest_theory(engine, parsed)
    if isinstance(parsed, SweepRecord):
        return ingest_sweep(engine, parsed)
    return ingest_speed(engine, parsed)


def ingest_file(engine: Engine, path: str | Path) -> IngestReport:
    """:func:`parse_file`, then :func:`ingest_parsed`."""
    return ingest_parsed(engine, parse_file(path))
