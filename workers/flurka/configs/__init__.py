"""Named benchmark configs (paper Table 6), configs as code: ``get_config(name, **overrides)``.

Families: ``lra`` (lra-listops/text/retrieval/image/pathfinder), ``glue`` (glue-cola ... glue-rte),
``mlm`` (mlm-wikitext103), ``nmt`` (nmt-wmt14-ende/enfr, nmt-ablation-ende), ``imagenet``, and
``small`` (lra-listops-small, lra-image-small, mlm-small, nmt-small: minutes on a CPU).
"""

from flurka.configs.base import (BASES, BENCHMARKS, FIELDS, METRICS, SCHEDULES, TASKS, TrainConfig,
                                 get_config, register, validate)
from flurka.configs import glue, imagenet, lra, mlm, nmt, small  # noqa: F401  (registration)

__all__ = ["BENCHMARKS", "TrainConfig", "get_config", "validate", "register",
           "FIELDS", "TASKS", "SCHEDULES", "METRICS", "BASES"]
