"""The results package keeps its own copy of the mechanism names (reading a database must not
import JAX); it must match the attention package's."""

from flurka.results import records


def test_mechanism_names_match_the_attention_package():
    from flurka.attention import MECHANISMS

    assert records.MECHANISMS == tuple(MECHANISMS)


def test_benchmark_names_cover_the_paper_tables():
    from flurka.results import quality_tables

    used = {b for cols in (quality_tables.GLUE_COLUMNS, quality_tables.LRA_COLUMNS, quality_tables.LRA_SMALL_COLUMNS,
                           quality_tables.COLLECTIVE_COLUMNS) for _, b, _ in cols}
    assert used <= set(records.BENCHMARKS)


def test_every_registered_benchmark_can_be_stored():
    """The results records read the configs' registry: a benchmark a sweep can train is one it
    can store (nmt-ablation-ende once trained and was then refused)."""
    from flurka.configs import BENCHMARKS

    assert records.BENCHMARKS == tuple(BENCHMARKS)
    assert {"nmt-ablation-ende", "nmt-list-small"} <= set(records.BENCHMARKS)
