"""A fine-tuning trial's lineage (issue 57): ``init_from``, the trial key of the run it started
from, is stored and read back, ``flurka ingest``'s record carries it, a lone run's result gives its
pre-trained work dir; migration 0006 adds the column and takes it away again, the trials kept."""

import sqlalchemy as sa
from alembic import command

from flurka.results import db, ingest_sweep, models, trial_from_result
from flurka.results.records import SweepRecord


def test_migration_0006_keeps_each_trials_lineage(tmp_path, sweep_dict, make_trial):
    source = "branch/mlm-wikitext103/flurka-rnn/s0/T120000/dk64/a0-low-rank"
    trials = [{**make_trial("tuned", "flurka-rnn", "nmt-small", {"bleu": 70.0}, d_k=16), "init_from": source},
              make_trial("scratch", "rnn", "nmt-small", {"bleu": 69.0})]
    record = SweepRecord.from_dict({**sweep_dict, "trials": trials})
    assert SweepRecord.from_dict(record.to_dict()) == record
    engine = db.upgrade(f"sqlite:///{tmp_path / 'results.db'}")
    ingest_sweep(engine, record)

    def lineage() -> dict:
        with engine.connect() as conn:
            return dict(conn.execute(sa.select(models.Trial.trial_key, models.Trial.init_from)).all())

    assert lineage() == {"tuned": source, "scratch": None}
    cfg = db._alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0005")
    sa.inspect(engine).clear_cache()
    assert "init_from" not in {c["name"] for c in sa.inspect(engine).get_columns("trials")}
    db.upgrade(engine)
    assert lineage() == {"tuned": None, "scratch": None}
    engine.dispose()


def test_a_lone_runs_result_names_its_pretrained_work_dir():
    result = {"attention": "rnn", "benchmark": "nmt-small", "seed": 0, "status": "ok", "steps": 1,
              "config": {}, "init_from": {"workdir": "/runs/pre/work/x", "step": 8}}
    assert trial_from_result("k", result).init_from == "/runs/pre/work/x"
    assert trial_from_result("k", result, init_from="base/key").init_from == "base/key"
    assert trial_from_result("k", {**result, "init_from": None}).init_from is None
