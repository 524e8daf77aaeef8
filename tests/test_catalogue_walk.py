"""Every registered benchmark and every mechanism, through every layer: config -> train -> record -> table.

For each benchmark in ``flurka.configs.BENCHMARKS`` (one mechanism each, rotating through
``flurka.catalogue.mechanisms.MECHANISMS`` so each appears) and for every mechanism on one cheap benchmark:

1. config: ``get_config(name, **tiny)``, the registered config shrunk to a 1-layer, d_model 16
   model and one training step, with an evaluation at its end on one batch;
2. train: ``flurka.training.run`` on the benchmark's own data path, offline
   (tests/support/offline_benchmarks.py: TFDS mocks, tiny files in the documented layouts, the
   small sets that ship);
3. record: the result, JSON round-tripped as a Tune trial carries it, made a trial record by the
   sweep's own ``flurka.results.trial_from_result`` and ingested (its own sweep) into one SQLite
   results database for the module;
4. table: read back through the quality tables: every metric the config lists as a cell of
   ``metric_stats``, the paper's table that shows the benchmark (``glue_table``, ``lra_table``,
   ``collective_table``; ``uptraining_stats`` for Table 5's ablation benchmark, whose trial is
   up-trained) — each cell there with n = 1 and a finite value.

A benchmark registered in configs but unknown to the records, a metric a run never records, a
paper-table column no run can fill: each fails here, naming the benchmark and mechanism.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from model_helpers import tiny_options
from offline_benchmarks import offline, source_of, write_local_sets

from flurka import training
from flurka.configs import BENCHMARKS, get_config
from flurka.configs.overrides import nested
from flurka.catalogue.mechanisms import FLURKA, MECHANISMS

# the shrunk run: one layer, d_model 16, one step, one eval batch at the end, greedy decoding
TINY = dict(batch_size=4, steps=1, eval_every=0, eval_batches=1, bleu_batches=1, beam_size=1, log_every=1,
            checkpoint_every=0, model=dict(d_model=16, num_heads=2, num_layers=1, d_ff=32))
SHORT = 32   # the sequence length of the data sets whose length is an option
SHORT_DATASETS = ("glue-cola", "glue-sst2", "glue-mrpc", "glue-stsb", "glue-qqp", "glue-mnli", "glue-qnli", "glue-rte",
                  "lra-text", "lra-retrieval", "nmt-wmt14-ende", "nmt-wmt14-enfr", "mlm-wikitext103", "mlm-small",
                  "nmt-small")
# Table 5 (up-training α) is the ablation benchmark's table: its trial is up-trained, one base step then one variant step
UPTRAINED = ("nmt-ablation-ende",)
CHEAP = "lra-image-small"   # every mechanism on it


def _benchmark_cases() -> list:
    cases = []
    for i, name in enumerate(BENCHMARKS):
        mechanism = MECHANISMS[i % len(MECHANISMS)]
        if name in UPTRAINED and mechanism not in FLURKA:
            mechanism = FLURKA[i % len(FLURKA)]
        cases.append(pytest.param(name, mechanism, id=f"{name}-{mechanism}"))
    return cases


def tiny_overrides(name: str, mechanism: str, data_dir: str) -> dict:
    """``get_config`` overrides that shrink benchmark ``name`` to a one-step run of ``mechanism``."""
    config = get_config(name)
    o = nested(TINY, {"model.attention": mechanism, "model.attention_options": tiny_options(mechanism),
                      "data_dir": data_dir})
    if config.task == "translation":
        o["model"]["num_decoder_layers"] = 1
    if config.dataset in SHORT_DATASETS:
        o.update(max_len=SHORT, dataset_options={"max_len": SHORT})
    if name in UPTRAINED:
        # one Linformer step, then one of the variant: the base is built from the variant's
        # attention_options (EVA's windows too), which it ignores
        o.update(steps=2, alpha=0.5, base="low-rank")
    return o


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return str(write_local_sets(tmp_path_factory.mktemp("offline-data")))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """One migrated SQLite results database for the module's trials (each in its own sweep)."""
    from flurka.results import open_results

    eng = open_results(f"sqlite:///{tmp_path_factory.mktemp('results') / 'results.db'}")
    yield eng
    eng.dispose()


def _environment() -> dict:
    import jax

    device = jax.devices()[0]
    return {"device": getattr(device, "device_kind", device.platform), "host": "catalogue-walk",
            "versions": {"jax": jax.__version__}}


def _walk(name: str, mechanism: str, data_dir: str, engine, sweep: str) -> tuple:
    """Config -> train -> record -> ingest; returns the config and the trial's result."""
    from flurka.data import generation_plan
    from flurka.results import SweepRecord, ingest_sweep, trial_from_result

    overrides = tiny_overrides(name, mechanism, data_dir)
    config = get_config(name, **overrides)
    assert (config.benchmark, config.model.attention, config.steps) == (name, mechanism, overrides["steps"])
    with offline(config.dataset):
        plan = generation_plan(config.dataset, data_dir)
        assert plan is None, f"{name}: its data would first be generated ({plan}): the offline files are missing"
        result = training.run(config, progress=False)
    assert result["status"] == "ok", f"{name} {mechanism}: {result['status']}"
    assert result["steps"] == config.steps and result["benchmark"] == name and result["attention"] == mechanism
    final = result["final_metrics"]
    bad = {m: final.get(m) for m in config.metrics
           if not isinstance(final.get(m), (int, float)) or not math.isfinite(final[m])}
    assert not bad, f"{name} {mechanism}: metrics the config lists came back missing or not finite: {bad} (all: {final})"

    result = json.loads(json.dumps(result))   # what a Tune trial hands the sweep's driver
    trial = trial_from_result(f"{name}/{mechanism}/seed{config.seed}", result)
    assert (trial.benchmark, trial.attention, trial.status) == (name, mechanism, "ok")
    assert set(config.metrics) <= set(trial.metrics), f"{name}: the record dropped {set(config.metrics) - set(trial.metrics)}"
    record = SweepRecord.from_dict({"sweep_id": sweep, "name": "catalogue walk",
                                    "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
                                    "environment": _environment(), "trials": [trial]})
    report = ingest_sweep(engine, record)
    assert (report.added, report.skipped) == (1, 0)
    return config, result


def _check_cell(row, what: str) -> None:
    assert int(row["n"]) == 1, f"{what}: n = {row['n']}, expected 1"
    assert math.isfinite(float(row["mean"])), f"{what}: mean {row['mean']}"


def _check_metric_cells(engine, config, mechanism: str, sweep: str) -> None:
    """Every metric the config lists is a cell of the generic quality table (the sweep's own
    ``quality`` table, over the reported metrics, is this with fewer columns)."""
    from flurka.results import quality_tables as qt

    name = config.benchmark
    columns = [(f"{name}: {qt.metric_label(m, name)}", name, m) for m in config.metrics]
    stats = qt.metric_stats(engine, columns, sweep=sweep)
    for label, _, metric in columns:
        cell = stats[(stats["mechanism"] == mechanism) & (stats["column"] == label)]
        assert len(cell) == 1, f"{name} {mechanism}: no {metric!r} cell in metric_stats (has {sorted(set(stats['column']))})"
        _check_cell(cell.iloc[0], f"{name} {mechanism} {metric}")
    # the display form of the sweep's table over the reported metrics
    reported = [c for c in columns if c[2] in config.reported_metrics]
    table = qt.metric_table(engine, reported, sweep=sweep)
    for label, _, _ in reported:
        text = table.loc[mechanism, label]
        assert isinstance(text, str) and text, f"{name} {mechanism}: display cell {label!r} is {text!r}"


def _paper_tables():
    """(name, the table's function, its columns) for the paper's quality tables, Tables 2-4."""
    from flurka.results import quality_tables as qt

    return [("glue_table (Table 2)", qt.glue_table, qt.GLUE_COLUMNS),
            ("lra_table (Table 3)", qt.lra_table, qt.LRA_COLUMNS),
            ("lra_table(small=True)", lambda engine, **kw: qt.lra_table(engine, small=True, **kw), qt.LRA_SMALL_COLUMNS),
            ("collective_table (Table 4)", qt.collective_table, qt.COLLECTIVE_COLUMNS)]


def _check_paper_tables(engine, config, mechanism: str, sweep: str) -> int:
    """Every column of a paper table that names this benchmark has this trial's cell; returns how
    many columns name it."""
    name, shown, missing = config.benchmark, 0, []
    for title, table_fn, columns in _paper_tables():
        mine = [label for label, bench, _ in columns if bench == name]
        if not mine:
            continue
        table = table_fn(engine, sweep=sweep, numbers=True)
        for label in mine:
            shown += 1
            if f"{label} n" not in table.columns or mechanism not in table.index:
                metric = next(m for lab, b, m in columns if lab == label and b == name)
                missing.append(f"{title} column {label!r} ({name}, metric {metric!r}; the run recorded "
                               f"{sorted(config.metrics)} + loss)")
                continue
            _check_cell({"n": table.loc[mechanism, f"{label} n"], "mean": table.loc[mechanism, f"{label} mean"]},
                        f"{title} {label!r} {mechanism}")
    assert not missing, f"{name} {mechanism}: paper-table columns without a cell: {missing}"
    return shown


def _check_uptraining_table(engine, config, mechanism: str, sweep: str) -> None:
    from flurka.results import quality_tables as qt

    for metric in config.reported_metrics:
        stats = qt.uptraining_stats(engine, benchmark=config.benchmark, metric=metric, sweep=sweep)
        cell = stats[(stats["mechanism"] == mechanism) & (stats["alpha"] == config.alpha)]
        assert len(cell) == 1, f"{config.benchmark} {mechanism}: no α={config.alpha} cell for {metric!r}:\n{stats}"
        _check_cell(cell.iloc[0], f"uptraining_stats {config.benchmark} {mechanism} {metric}")
        qt.uptraining_table(engine, benchmark=config.benchmark, metric=metric, sweep=sweep)


def test_the_walk_covers_the_catalogue():
    """Every registered benchmark is walked, every mechanism appears, and each has an offline path."""
    cases = [p.values for p in _benchmark_cases()]
    assert [n for n, _ in cases] == list(BENCHMARKS) and len(BENCHMARKS) >= 23
    assert {m for _, m in cases} == set(MECHANISMS)
    for name in BENCHMARKS:
        source_of(get_config(name).dataset)   # LookupError naming the data set that has none


@pytest.mark.parametrize("name, mechanism", _benchmark_cases())
def test_benchmark_walk(name, mechanism, data_dir, engine):
    sweep = f"walk-{name}-{mechanism}"
    config, _ = _walk(name, mechanism, data_dir, engine, sweep)
    _check_metric_cells(engine, config, mechanism, sweep)
    if name in UPTRAINED:
        _check_uptraining_table(engine, config, mechanism, sweep)
    else:
        _check_paper_tables(engine, config, mechanism, sweep)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_mechanism_walk(mechanism, data_dir, engine):
    sweep = f"mechanisms-{CHEAP}-{mechanism}"
    config, _ = _walk(CHEAP, mechanism, data_dir, engine, sweep)
    _check_metric_cells(engine, config, mechanism, sweep)
    assert _check_paper_tables(engine, config, mechanism, sweep) >= 1, f"{CHEAP} is in no paper table"
