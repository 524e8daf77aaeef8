"""The tables a sweep prints at its end: the speed table only where its database holds speed
measurements, and then without a line of complaint about the others."""

from __future__ import annotations

from flurka.results import ingest_file, open_results
from flurka.sweeps.runner import _tables
from flurka.sweeps.spec import SweepSpec, validate
from testsupport import RECORDED


def test_speed_table_only_where_speed_was_measured(tmp_path, capsys):
    spec = validate(SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.5,),
                              steps=8, run_dir=str(tmp_path / "run")))
    engine = open_results(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        assert "speed" not in _tables(engine, spec, "no-such-sweep")
        assert "speed table" not in capsys.readouterr().err        # a sweep's own database: not a fault
        ingest_file(engine, RECORDED / "h100-2026-11-28" / "n-sweep.json")
        speed = _tables(engine, spec, "no-such-sweep")["speed"]
    finally:
        engine.dispose()
    assert {"flurka-rnn", "linformer", "performer"} <= set(speed.columns) and 55_500 in speed.index
