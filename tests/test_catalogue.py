"""The catalogue: each mechanism's settings match what its layer takes, each benchmark's metrics
and table columns are ones the metric catalogue declares, and what tables derive from it."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from flurka.catalogue import metrics as M
from flurka.configs import BENCHMARKS, TABLES, char_bleu, family_benchmarks, get_config, primary_metric, table_columns
from flurka.catalogue.mechanisms import CATALOGUE, COMPRESSED, FAMILIES, MECHANISMS, SETTINGS, has_setting


def _keyword_options(cls) -> set[str]:
    return {p.name for klass in cls.__mro__ if "__init__" in vars(klass)
            for p in inspect.signature(klass.__init__).parameters.values() if p.kind is p.KEYWORD_ONLY}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_mechanisms_settings_are_what_its_layer_takes(mechanism):
    from flurka.attention import layer_class

    entry = CATALOGUE[mechanism]
    assert entry.family in FAMILIES
    taken = _keyword_options(layer_class(mechanism)) & set(SETTINGS)
    assert taken == set(entry.settings), f"{mechanism}: layer takes {sorted(taken)}, catalogue says {entry.settings}"


def test_each_mechanism_names_its_own_flop_count():
    """FLOP dispatch reads the catalogue: each entry's function counts that layer, so a new
    mechanism without one fails here, not as another mechanism's count."""
    from flurka.attention.flops import AttentionShape, flop_breakdown
    from flurka.catalogue.mechanisms import resolve

    shape = AttentionShape(batch=1, seq_len=64, d_model=32, num_heads=2, d_k=8)
    counts = {m: flop_breakdown(m, shape) for m in MECHANISMS}
    for m in MECHANISMS:
        assert callable(resolve(CATALOGUE[m].flops)) and counts[m]
        assert ("compression" in counts[m]) == has_setting(m, "d_k"), m   # E·X only where d_k exists
    assert counts["full"] == counts["flash"]       # same maths, whichever kernel runs it
    assert len({tuple(sorted(c.items())) for c in counts.values()}) == len(MECHANISMS) - 1


def test_settings_decide_who_gets_d_k_and_features():
    from flax import nnx

    from flurka.attention import make_attention

    assert COMPRESSED == ("linformer", "flurka-performer", "flurka-rnn", "flurka-eva")
    assert not has_setting("eva", "num_features") and has_setting("flurka-eva", "window_size")
    with pytest.raises(ValueError, match="unknown attention mechanism 'softmax'; valid: full, flash"):
        has_setting("softmax", "d_k")
    # every setting goes to whoever reads it; the rest ignore it (an up-training base and its variant)
    every = dict(d_k=4, e_init="gaussian", num_features=8, window_size=4, chunk_size=4)
    for mechanism in MECHANISMS:
        layer = make_attention(mechanism, d_model=16, num_heads=2, max_len=16, rngs=nnx.Rngs(0), **every)
        assert getattr(layer, "d_k", None) == (4 if has_setting(mechanism, "d_k") else None)


def test_metric_facts():
    assert M.LOWER_IS_BETTER == ("perplexity", "loss")
    assert set(M.FRACTION_METRICS) == {"accuracy", "top5", "exact_match", "matthews", "f1", "pearson", "spearman",
                                       "accuracy_mismatched", "majority_accuracy"}
    assert M.SEQUENCE_METRICS == ("bleu", "exact_match")
    assert M.CHANCE_OF == {"accuracy": "majority_accuracy"}
    assert M.label("bleu", char_bleu=True) == "BLEU (char, 0–100)" and M.label("bleu") == "BLEU (0–100)"
    assert M.label("exact_match") == "exact match (%)" and M.label("loss") == "eval loss"
    assert M.label("perplexity") == "perplexity" and M.unit("perplexity") == ""
    assert M.shown("accuracy", 0.25) == 25.0 and M.shown("bleu", 25.0) == 25.0
    assert (M.better("perplexity"), M.better("bleu")) == ("lower", "higher")
    assert (M.decimals("accuracy", 97.123), M.decimals("perplexity", 5.583)) == (1, 2)


def test_significant_decimals():
    assert M.significant_decimals(5.583) == 2
    assert M.significant_decimals(0.2512) == 3
    assert M.significant_decimals(123.4) == 0
    assert M.significant_decimals(19.68) == 1


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_a_benchmarks_metrics_and_columns_are_catalogued(benchmark):
    entry, config = BENCHMARKS[benchmark], get_config(benchmark)
    assert set(config.metrics) <= set(M.TASK_METRICS)
    assert primary_metric(benchmark) == config.metrics[0]
    assert char_bleu(benchmark) == (config.bleu_tokenize == "char")
    assert entry.table in (None, *TABLES)
    assert all(metric in M.METRICS for _, metric in entry.columns)


def test_tables_and_families_come_from_registration():
    assert [b for _, b, _ in table_columns("collective")] == [
        "nmt-wmt14-ende", "nmt-wmt14-enfr", "imagenet", "imagenet", "mlm-wikitext103"]
    assert [label for label, _, _ in table_columns("lra")] == [
        "ListOps (acc, %)", "Text (acc, %)", "Retrieval (acc, %)", "Image (acc, %)", "Pathfinder (acc, %)"]
    assert len(table_columns("glue")) == 12 and table_columns("lra-small")[0][1] == "lra-listops-small"
    assert family_benchmarks("small") == ("lra-listops-small", "lra-image-small", "mlm-small", "nmt-small",
                                          "nmt-list-small")
    assert not char_bleu("nmt-unknown") and primary_metric("nmt-unknown") == "accuracy"
    with pytest.raises(ValueError, match="unknown table 'glue2'; valid: glue, lra"):
        table_columns("glue2")


def test_the_catalogue_loads_without_jax():
    code = ("import sys, flurka.catalogue.mechanisms, flurka.catalogue.metrics, flurka.configs, flurka.results.records; "
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
