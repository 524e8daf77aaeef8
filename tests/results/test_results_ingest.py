"""Ingestion: validated up front, idempotent, and all-or-nothing, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math

import pytest
import sqlalchemy as sa

from flurka.results import (SweepRecord, TrialRecord, ingest, ingest_file, ingest_speed, ingest_sweep, models,
                           trial_from_result)


def counts(engine) -> dict[str, int]:
    tables = [models.Environment, models.Sweep, models.Trial, models.Metric, models.CurvePoint, models.SpeedMeasurement]
    with engine.connect() as conn:
        return {t.__tablename__: conn.scalar(sa.select(sa.func.count()).select_from(t)) for t in tables}


def test_ingesting_a_sweep_twice_adds_nothing(engine, sweep_dict):
    n = len(sweep_dict["trials"])
    first = ingest_sweep(engine, sweep_dict)
    assert (first.added, first.skipped) == (n, 0)
    after = counts(engine)
    assert after["sweeps"] == 1 and after["environments"] == 1 and after["trials"] == n
    assert after["metrics"] == sum(len(t["metrics"]) for t in sweep_dict["trials"])
    assert after["curve_points"] == sum(2 * len(t["curve"]) for t in sweep_dict["trials"])  # loss + train_flops
    second = ingest_sweep(engine, sweep_dict)
    assert (second.added, second.skipped) == (0, n)
    assert counts(engine) == after


def test_growing_sweep_adds_only_new_trials(engine, sweep_dict, make_trial):
    ingest_sweep(engine, {**sweep_dict, "trials": sweep_dict["trials"][:3]})
    report = ingest_sweep(engine, {**sweep_dict, "trials": sweep_dict["trials"][:3] + [
        make_trial("new", "eva", "nmt-small", {"bleu": 3.5})]})
    assert (report.added, report.skipped) == (1, 3)
    with engine.connect() as conn:
        row = conn.execute(sa.select(models.Trial.attention, models.Metric.value)
                           .join(models.Metric).where(models.Trial.trial_key == "new")).one()
    assert tuple(row) == ("eva", 3.5)


def test_round_trip_of_a_trial(engine, sweep_dict):
    ingest_sweep(engine, sweep_dict)
    with engine.connect() as conn:
        t = conn.execute(sa.select(models.Trial).where(models.Trial.trial_key == "fe-a3")).one()
        pts = conn.execute(sa.select(models.CurvePoint.step, models.CurvePoint.name, models.CurvePoint.value)
                           .where(models.CurvePoint.trial_id == t.id).order_by("step", "name")).all()
        sweep = conn.execute(sa.select(models.Sweep)).one()
    assert (t.attention, t.benchmark, t.alpha, t.base, t.d_k, t.status) == \
        ("flurka-eva", "nmt-wmt14-ende", 0.375, "low-rank", 64, "ok")
    assert [tuple(p) for p in pts] == [(1, "loss", 0.6), (1, "train_flops", 0.5e18),
                                       (2, "loss", 0.24), (2, "train_flops", 1.0e18)]
    assert sweep.external_id == "paper-2024-05-01" and sweep.git_commit == "f5764a2"
    assert sweep.created_at.replace(tzinfo=None).isoformat() == "2024-05-01T12:00:00"


def test_each_record_column_is_a_trials_column_and_round_trips(engine, sweep_dict):
    """A trial record's scalar fields are the trials table's own columns, one to one, so that a new
    field is stored without touching ingestion (and a field without its column fails here)."""
    from flurka.results.records import TRIAL_COLUMNS

    own = {c.name for c in models.Trial.__table__.columns} - {"id", "sweep_id"}
    assert set(TRIAL_COLUMNS) == own
    trial = {**sweep_dict["trials"][0], "node": "node-5", "device": "cpu", "device_count": 2,
             "peak_host_bytes": 6_100_000_000.0, "wall_time_s": 12.5, "config": {"steps": 3}}
    record = TrialRecord.from_dict(trial)
    ingest_sweep(engine, {**sweep_dict, "trials": [trial]})
    with engine.connect() as conn:
        row = conn.execute(sa.select(models.Trial)).one()._mapping
    assert {name: row[name] for name in TRIAL_COLUMNS} == {name: getattr(record, name) for name in TRIAL_COLUMNS}
    assert row["peak_host_bytes"] == 6_100_000_000 and row["config"] == {"steps": 3}


def test_invalid_third_trial_writes_nothing(engine, sweep_dict):
    sweep_dict["trials"][2]["attention"] = "softmax"
    with pytest.raises(ValueError, match=r"trials\[2\] 'p2': attention 'softmax' is not one of full, flash, linformer"):
        ingest_sweep(engine, sweep_dict)
    assert set(counts(engine).values()) == {0}


def test_failure_mid_transaction_leaves_no_partial_sweep(engine, sweep_dict, monkeypatch):
    real, calls = ingest._add_trial, []

    def failing_third(session, sweep, t):
        calls.append(t.trial_key)
        if len(calls) == 3:
            raise RuntimeError("disk full")
        real(session, sweep, t)

    monkeypatch.setattr(ingest, "_add_trial", failing_third)
    with pytest.raises(RuntimeError, match="disk full"):
        ingest_sweep(engine, sweep_dict)
    assert len(calls) == 3
    assert set(counts(engine).values()) == {0}
    monkeypatch.setattr(ingest, "_add_trial", real)
    assert ingest_sweep(engine, sweep_dict).added == len(sweep_dict["trials"])


def test_database_error_mid_sweep_rolls_back(engine, sweep_dict, monkeypatch):
    """A constraint the database itself enforces (NOT NULL) failing at the 3rd trial aborts the sweep."""
    ingest_sweep(engine, {**sweep_dict, "sweep_id": "other", "trials": sweep_dict["trials"][:1]})
    before = counts(engine)
    real, third = ingest._add_trial, sweep_dict["trials"][2]["trial_key"]

    def with_orphan_metric(session, sweep, t):
        real(session, sweep, t)
        if t.trial_key == third:
            session.add(models.Metric(trial_id=None, name="x", value=1.0))
            session.flush()

    monkeypatch.setattr(ingest, "_add_trial", with_orphan_metric)
    with pytest.raises(sa.exc.IntegrityError):
        ingest_sweep(engine, sweep_dict)
    assert counts(engine) == before


def test_validation_errors_are_one_readable_line(make_trial, sweep_dict):
    cases = [
        ({"metrics": {"accuracy": 91.0}}, "must be a fraction in [-1, 1], not percent"),
        ({"benchmark": "glue-foo"}, "benchmark 'glue-foo' is not one of nmt-wmt14-ende"),
        ({"alpha": 1.5}, "alpha must be in [0, 1]"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"metrics": {"bleu": math.nan}}, "metric 'bleu' must be a finite number"),
        ({"colour": "red"}, "unknown colour"),
    ]
    for change, message in cases:
        d = {**sweep_dict, "trials": [{**make_trial("k", "eva", "glue-cola", {"matthews": 0.1}), **change}]}
        with pytest.raises(ValueError) as info:
            SweepRecord.from_dict(d)
        assert message in str(info.value) and "\n" not in str(info.value)
    dup = {**sweep_dict, "trials": sweep_dict["trials"][:2] * 2}
    with pytest.raises(ValueError, match=r"repeated trial_key \['l0', 'p0'\]|repeated trial_key \['p0', 'p1'\]"):
        SweepRecord.from_dict(dup)


def test_trial_from_training_result(engine, sweep_dict):
    result = {"status": "diverged at step 812", "benchmark": "nmt-small", "attention": "flurka-rnn", "seed": 3,
              "steps": 812, "final_metrics": {"bleu": 0.4, "perplexity": math.inf, "accuracy": None},
              "history": [{"step": 100, "loss": 4.0, "train_flops": 1e12}, {"step": 200, "loss": math.nan,
                                                                            "train_flops": 2e12}],
              "train_flops": 2e12, "wall_time_s": 12.5,
              "config": {"alpha": 0.25, "base": "kernel", "attention_options": {"d_k": 32, "num_features": 16}}}
    t = trial_from_result("trial_00003", result)
    assert (t.attention, t.benchmark, t.seed, t.status, t.alpha, t.base, t.d_k, t.num_features) == \
        ("flurka-rnn", "nmt-small", 3, "diverged at step 812", 0.25, "kernel", 32, None)  # elu: no features
    assert t.metrics == {"bleu": 0.4}
    assert t.curve == [{"step": 100, "loss": 4.0, "train_flops": 1e12}, {"step": 200, "train_flops": 2e12}]
    record = SweepRecord.from_dict({**sweep_dict, "trials": [t]})
    assert ingest_sweep(engine, record).added == 1


def test_trial_records_where_it_ran(sweep_dict):
    """A result's placement (the trainable's) is the trial's node, device and peak memory; a
    result or file from before has none; a bad one is a one-line error naming the field."""
    base = {"status": "ok", "benchmark": "nmt-small", "attention": "rnn", "seed": 0, "steps": 10, "config": {}}
    placement = {"node": "gpu-node-2", "node_ip": "10.0.0.2", "node_id": "abcdef01", "device": "NVIDIA H100 80GB HBM3",
                 "platform": "gpu", "device_count": 1, "peak_host_bytes": 6_100_000_000,
                 "peak_device_bytes": 42_000_000_000.0}
    t = trial_from_result("g", {**base, "placement": placement})
    assert (t.node, t.device, t.device_count, t.peak_host_bytes, t.peak_device_bytes) == \
        ("gpu-node-2", "NVIDIA H100 80GB HBM3", 1, 6_100_000_000, 42_000_000_000)
    old = trial_from_result("old", base)
    assert (old.node, old.device, old.device_count, old.peak_host_bytes, old.peak_device_bytes) == (None,) * 5
    assert TrialRecord.from_dict(sweep_dict["trials"][0]).node is None        # a file without the fields
    with pytest.raises(ValueError, match=r"peak_host_bytes must be an int >= 0, got -1$"):
        TrialRecord.from_dict({**sweep_dict["trials"][0], "peak_host_bytes": -1})


@pytest.mark.parametrize("attention, d_k, num_features", [
    ("performer", None, 16), ("rnn", None, None), ("eva", None, None), ("full", None, None),
    ("linformer", 32, None), ("flurka-performer", 32, 16), ("flurka-eva", 32, None)])
def test_trial_records_only_the_knobs_its_mechanism_has(attention, d_k, num_features):
    """Every benchmark config carries d_k and num_features; a trial records the ones its mechanism
    uses (its settings in flurka.catalogue.mechanisms), so a kernel baseline is no "performer d_k=16" in the
    tables, figures and SQL, and EVA (chunks, no feature count) no "num_features=16"."""
    config = {"alpha": 0.0, "attention_options": {"d_k": 32, "num_features": 16}}
    t = trial_from_result("t", {"status": "ok", "benchmark": "nmt-small", "attention": attention, "seed": 0,
                                "steps": 10, "config": config})
    assert (t.d_k, t.num_features) == (d_k, num_features)
    assert t.config["attention_options"] == {"d_k": 32, "num_features": 16}   # the config keeps them


def test_trial_base_is_spelled_as_the_cli_spells_it(sweep_dict):
    """The record's base is --base's word; a baseline's config default ("low-rank") is no base at
    all (it was not up-trained); files that named the base model's mechanism still read."""
    config = {"alpha": 0.0, "base": "low-rank", "attention_options": {"d_k": 16}}
    baseline = trial_from_result("lin", {"status": "ok", "benchmark": "nmt-small", "attention": "linformer",
                                         "seed": 0, "steps": 10, "config": config})
    assert baseline.base is None
    trial = sweep_dict["trials"][0]
    for old, new in (("linformer", "low-rank"), ("performer", "kernel"), ("low-rank", "low-rank")):
        assert TrialRecord.from_dict({**trial, "alpha": 0.25, "base": old}).base == new
    for bad, why in (("flurka-rnn", "no up-training base"), ("sparse", "base 'sparse' is not one of low-rank, kernel")):
        with pytest.raises(ValueError, match=why):
            TrialRecord.from_dict({**trial, "alpha": 0.25, "base": bad})


def test_speed_json_file_is_idempotent(engine, speed_dicts, tmp_path):
    path = tmp_path / "speed.json"
    path.write_text(json.dumps(speed_dicts))
    first = ingest_file(engine, path)
    assert (first.added, first.skipped) == (len(speed_dicts), 0)
    after = counts(engine)
    assert after["speed_measurements"] == len(speed_dicts) and after["environments"] == 2  # H100 and cpu
    assert ingest_file(engine, path) == ingest.IngestReport(0, len(speed_dicts))
    assert counts(engine) == after
    with engine.connect() as conn:
        oom = conn.execute(sa.select(models.SpeedMeasurement).where(models.SpeedMeasurement.status == "oom")).one()
    assert (oom.mechanism, oom.seq_len, oom.median_s) == ("full", 4096, None)


def test_ingesting_again_fills_in_the_run_of_old_rows(engine, speed_dicts):
    """Rows stored without a run (before revision 0003) get it when their document is ingested
    again; a row that has a run keeps it, and nothing is added."""
    assert ingest_speed(engine, speed_dicts).added == len(speed_dicts)
    again = ingest_speed(engine, [dict(r, run="2026-11-28T03:02:00+00:00") for r in speed_dicts])
    assert (again.added, again.skipped) == (0, len(speed_dicts))
    ingest_speed(engine, [dict(r, run="2026-11-29T00:00:00+00:00") for r in speed_dicts])
    with engine.connect() as conn:
        runs = conn.scalars(sa.select(models.SpeedMeasurement.run)).all()
    assert runs == ["2026-11-28T03:02:00+00:00"] * len(speed_dicts)


def test_a_rederived_document_updates_its_rows(engine, tmp_path):
    """The recorded H100 N-sweep as first written (its training floors counted at 3 × forward),
    then as re-derived since: the five training rows take the new FLOPs and floors, nothing is
    added, every other row is left as it was; ingesting the re-derived file again changes
    nothing (SQLite and PostgreSQL)."""
    from testsupport import RECORDED

    doc = json.loads((RECORDED / "h100" / "2026-11-28" / "n-sweep.json").read_text())
    train = [i for i, r in enumerate(doc["results"]) if r["mode"] == "train" and r["status"] == "ok"]
    first = json.loads(json.dumps(doc))
    for i in train:   # as the lease wrote them: 3 × forward, its floor and ratio with it
        r = first["results"][i]
        r["flops"] = r["flops"] * 1.25
        r["floor_s"] = r["compute_floor_s"] = r["compute_floor_s"] * 1.25
        r["ratio_to_floor"] = r["median_s"] / r["floor_s"]
    paths = {name: tmp_path / f"{name}.json" for name in ("first", "rederived")}
    paths["first"].write_text(json.dumps(first))
    paths["rederived"].write_text(json.dumps(doc))
    rows = len([r for r in doc["results"]])
    assert ingest_file(engine, paths["first"]).added == rows
    assert ingest_file(engine, paths["rederived"]) == ingest.IngestReport(0, rows - len(train), len(train))
    assert ingest_file(engine, paths["rederived"]) == ingest.IngestReport(0, rows)
    assert counts(engine)["speed_measurements"] == rows
    with engine.connect() as conn:
        stored = {(m.mechanism, m.mode, m.config.get("align"), m.config.get("fused")): m for m in
                  conn.execute(sa.select(models.SpeedMeasurement)).all()}
    for r in doc["results"]:
        if r["status"] != "ok":
            continue
        m = stored[(r["mechanism"], r["mode"], r.get("align"), r.get("fused"))]
        assert m.flops == r["flops"] and m.config["floor_s"] == r["floor_s"]
        assert m.run == doc["created"]


def test_bad_speed_record_writes_nothing(engine, speed_dicts):
    speed_dicts[3] = {**speed_dicts[3], "median_s": None}
    with pytest.raises(ValueError, match=r"speed records\[3\]: status 'ok' needs median_s"):
        ingest_speed(engine, speed_dicts)
    assert counts(engine)["speed_measurements"] == 0
    with pytest.raises(ValueError, match="mode 'backward' is not one of forward, train"):
        ingest_speed(engine, [{**speed_dicts[0], "mode": "backward"}])


@pytest.mark.parametrize("change, message", [
    ({"schema": "flurka.speed/99"}, "schema 'flurka.speed/99' is not one the results database reads"),
    ({"schema": "flurka.aot/1"}, "schema 'flurka.aot/1' is not one the results database reads"),
    ({"median_s": -0.004}, r"results\[0\]: median_s must be >= 0, got -0.004"),
    ({"flops": -1.0}, r"results\[0\]: flops must be >= 0"),
])
def test_a_document_it_cannot_read_is_one_line_and_writes_nothing(engine, tmp_path, change,
                                                                  message):
    row = {"mechanism": "rnn", "mode": "forward", "scope": "layer", "seq_len": 64, "d_model": 32,
           "num_heads": 2, "dtype": "float32", "status": "ok", "median_s": 0.004, "flops": 1e6}
    doc = {"schema": "flurka.speed/1", "created": "2026-12-02T00:00:00+00:00",
           "device": {"name": "cpu", "host": "h"}, "versions": {}, "results": [row]}
    for key, value in change.items():
        (doc if key == "schema" else row)[key] = value
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message) as err:
        ingest_file(engine, path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert counts(engine)["speed_measurements"] == 0


def test_the_plain_benchmarks_document_is_two_records_a_row(engine, tmp_path):
    """``flurka.speed.plain``: the layer and its plain form, one shape, paired by ``config.form``."""
    timing = {"median_s": 0.02, "p10_s": 0.019, "p90_s": 0.022, "repeats": 15}
    doc = {"schema": "flurka.speed.plain/1", "created": "2026-12-02T00:00:00+00:00",
           "device": {"name": "cpu", "host": "h"}, "versions": {"jax": "0.10.2"}, "results": [
               {"mechanism": "full", "mode": "forward", "size": "long", "batch": 1,
                "seq_len": 4096, "d_model": 256, "num_heads": 4, "d_k": 256, "num_features": 64,
                "padded": 0, "layer": {**timing, "median_s": 0.03}, "plain": timing,
                "ratio": {"mean": 1.5, "low": 1.4, "high": 1.6, "n": 15, "median": 1.5}}]}
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(doc))
    assert ingest_file(engine, path) == ingest.IngestReport(2, 0)
    assert ingest_file(engine, path) == ingest.IngestReport(0, 2)
    with engine.connect() as conn:
        rows = {r.config["form"]: r for r in conn.execute(sa.select(models.SpeedMeasurement))}
    assert rows["layer"].median_s == 0.03 and rows["plain"].median_s == 0.02
    assert rows["plain"].spread_s == pytest.approx(0.003)
    assert (rows["layer"].scope, rows["layer"].seq_len, rows["layer"].dtype) == ("layer", 4096,
                                                                               "float32")
    from flurka.results import speed_tables
    speed = speed_tables.speed_table(engine, mode="forward")   # the layer's time, not its plain form's
    assert speed.loc[4096].tolist() == [pytest.approx(30.0)]


def test_unreadable_json_is_a_clear_error(engine, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read results JSON .*bad.json"):
        ingest_file(engine, tmp_path / "bad.json")


def test_speed_benchmark_document(engine, tmp_path):
    """The document flurka.speed writes: device/versions once, Point fields per result."""
    point = {"mode": "train", "scope": "model", "seq_len": 2048, "d_model": 256, "num_heads": 4, "d_k": 128,
             "num_features": 64, "layers": 6, "ffn": 512, "dtype": "bfloat16", "batch": 1}
    doc = {"schema": 1, "sweep": "seq-len", "created": "2024-05-01T12:00:00+00:00",
           "device": {"name": "NVIDIA H100 80GB HBM3", "platform": "gpu", "count": 1, "host": "node-3"},
           "versions": {"python": "3.12.3", "jax": "0.11.0", "cudnn": 91000, "missing": None},
           "settings": {}, "ceilings": None, "results": [
               {**point, "mechanism": "flurka-rnn", "status": "ok", "median_s": 0.004, "p10_s": 0.0039,
                "p90_s": 0.0042, "min_s": 0.0038, "flops": 3.0e11, "compile_s": 1.5},
               {**point, "mechanism": "rnn", "status": "ok", "median_s": 0.006, "p10_s": 0.0059, "p90_s": 0.0061,
                "flops": 4.0e11},
               {**point, "mechanism": "full", "status": "oom", "oom_source": "xla", "flops": 9.0e11},
               {**point, "mechanism": "eva", "status": "error", "error_type": "XlaRuntimeError", "error": "boom"},
           ]}
    path = tmp_path / "speed-seq-len.json"
    path.write_text(json.dumps(doc))
    assert ingest_file(engine, path) == ingest.IngestReport(4, 0)
    assert ingest_file(engine, path) == ingest.IngestReport(0, 4)
    with engine.connect() as conn:
        rows = {r.mechanism: r for r in conn.execute(sa.select(models.SpeedMeasurement))}
        env = conn.execute(sa.select(models.Environment)).one()
    assert (env.device, env.host, env.versions) == \
        ("NVIDIA H100 80GB HBM3", "node-3", {"cudnn": "91000", "jax": "0.11.0", "python": "3.12.3"})
    r = rows["flurka-rnn"]
    assert (r.scope, r.seq_len, r.heads, r.d_k, r.num_features, r.median_s, r.flops) == \
        ("model", 2048, 4, 128, 64, 0.004, 3.0e11)
    assert r.spread_s == pytest.approx(0.0003)
    assert r.config == {"layers": 6, "ffn": 512, "p10_s": 0.0039, "p90_s": 0.0042, "min_s": 0.0038, "compile_s": 1.5}
    assert (rows["full"].status, rows["eva"].status) == ("oom", "error")

    from flurka.results import speed_tables

    speed = speed_tables.speed_table(engine)  # the failed eva measurement is no data
    assert list(speed.columns) == ["full", "rnn", "flurka-rnn"]
    assert speed.loc[2048].tolist() == ["OOM", pytest.approx(6.0), pytest.approx(4.0)]
    up = speed_tables.speedup_table(engine)
    assert up.at[("flurka-rnn", 2048), "vs kernel"] == pytest.approx(1.5)
