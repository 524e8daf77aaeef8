"""Benchmark name -> builder. Builders are imported on first use, so the small
offline sets never import TFDS."""

from __future__ import annotations

import importlib
import inspect

from flurka.data.core import Dataset
from flurka.data.listops import generation_plan as listops_plan

GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")

# name -> (module, function, fixed keyword arguments)
_BUILDERS: dict[str, tuple[str, str, dict]] = {
    "mlm-wikitext103": ("flurka.data.local_sets", "build_wikitext103", {}),
    **{f"glue-{t}": ("flurka.data.tfds_sets", "build_glue", {"task": t}) for t in GLUE_TASKS},
    "lra-listops": ("flurka.data.listops", "build_full", {}),
    "lra-text": ("flurka.data.tfds_sets", "build_lra_text", {}),
    "lra-retrieval": ("flurka.data.local_sets", "build_lra_retrieval", {}),
    "lra-image": ("flurka.data.tfds_sets", "build_lra_image", {}),
    "lra-pathfinder": ("flurka.data.local_sets", "build_lra_pathfinder", {}),
    "nmt-wmt14-ende": ("flurka.data.tfds_sets", "build_wmt14", {"target": "de"}),
    "nmt-wmt14-enfr": ("flurka.data.tfds_sets", "build_wmt14", {"target": "fr"}),
    "imagenet": ("flurka.data.tfds_sets", "build_imagenet", {}),
    # small sets: real data that ships, trainable on 2 CPU cores in minutes
    "lra-listops-small": ("flurka.data.listops", "build_small", {}),
    "lra-image-small": ("flurka.data.digits", "build", {}),
    "mlm-small": ("flurka.data.stdlib_text", "build", {}),
    "nmt-small": ("flurka.data.nmt_small", "build", {}),
    "nmt-list-small": ("flurka.data.nmt_list", "build", {}),
}

DATASETS: tuple[str, ...] = tuple(_BUILDERS)
SMALL_DATASETS: tuple[str, ...] = tuple(n for n in _BUILDERS if n.endswith("-small"))   # the ones that ship


def get_dataset(name: str, *, seed: int = 0, data_dir: str | None = None, **options) -> Dataset:
    """The benchmark ``name``; ``seed`` fixes the order of training batches and their masking.

    ``data_dir`` (else ``$FLURKA_DATA_DIR``, else ``~/flurka_data``) is where
    data that cannot ship lives; missing data raises ``DataNotFoundError``
    saying what to put where. Nothing is ever downloaded.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    module, function, fixed = _BUILDERS[name]
    builder = getattr(importlib.import_module(module), function)
    params = inspect.signature(builder).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        valid = sorted(set(params) - set(fixed) - {"seed", "data_dir"})
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"unknown options {unknown} for dataset {name!r}; valid: {valid}")
    return builder(seed=seed, data_dir=data_dir, **fixed, **options)


def generation_plan(name: str, data_dir: str | None = None) -> str | None:
    """What building ``name`` would generate (and write under the data root) before it can train,
    in words; None where it reads prepared files, ships or is small. Today: lra-listops without
    its LRA release files generates them (minutes)."""
    if name == "lra-listops":
        return listops_plan(data_dir)
    return None
