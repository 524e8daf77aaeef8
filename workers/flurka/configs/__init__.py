"""Named benchmark configs (paper Table 6), configs as code: ``get_config(name, **overrides)``.

Families: ``lra`` (lra-listops/text/retrieval/image/pathfinder), ``glue`` (glue-cola ... glue-rte),
``mlm`` (mlm-wikitext103), ``nmt`` (nmt-wmt14-ende/enfr, nmt-ablation-ende), ``imagenet``, and
``small`` (lra-listops-small, lra-image-small, mlm-small, nmt-small, nmt-list-small: minutes on a
CPU). Each registers itself with the paper table and columns it fills (:func:`register`).
"""

from flurka.configs.model import ModelConfig
from flurka.configs.base import (BASES, BENCHMARKS, FIELDS, SCHEDULES, TABLES, TASKS, Benchmark, TrainConfig,
                                 char_bleu, family_benchmarks, get_config, metric_label, primary_metric, register, switch_step,
                                 table_columns, validate)
# Registration order is the order of a table's columns and of the benchmarks everywhere:
# the paper's (Table 4: NMT, ImageNet, WikiText-103; glue imports mlm).
from flurka.configs import nmt, imagenet, glue, lra, mlm, small  # noqa: F401  (registration)

__all__ = ["BENCHMARKS", "Benchmark", "TrainConfig", "ModelConfig", "get_config", "validate", "register", "table_columns",
           "family_benchmarks", "char_bleu", "metric_label", "primary_metric", "switch_step",
           "FIELDS", "TASKS", "SCHEDULES", "BASES", "TABLES"]
