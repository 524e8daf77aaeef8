"""Benchmarks and data: ``get_dataset(name)`` for every set in the paper plus small offline ones.

See ``core`` for the batch contract (batch ``k`` is a pure function of
``(seed, k)``) and ``registry`` for the names.
"""

from flurka.data.core import DataNotFoundError, Dataset, DatasetInfo, resolve_data_dir
from flurka.data.registry import DATASETS, SMALL_DATASETS, generation_plan, get_dataset

__all__ = [
    "DATASETS",
    "SMALL_DATASETS",
    "DataNotFoundError",
    "Dataset",
    "DatasetInfo",
    "generation_plan",
    "get_dataset",
    "resolve_data_dir",
]
