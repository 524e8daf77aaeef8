"""Every registered benchmark's data on a machine without its data sets: how the data tests get it.

Three kinds of source, as tests/data uses them:

- ``"tfds-mock"``: the TFDS sets (GLUE, WMT'14, IMDB for LRA text, CIFAR-10 for LRA image,
  ImageNet) under ``tfds.testing.mock_data`` (random examples, no TensorFlow, no files), as
  tests/data/test_data_tfds.py reads them.
- ``"local-files"``: the sets read from files in their documented layout under ``data_dir``
  (WikiText-103 raw, the LRA release's AAN pairs, Pathfinder PNGs, ListOps TSVs), written tiny by
  :func:`write_local_sets` with the same contents as tests/data/test_data_local_sets.py and
  tests/data/test_data_listops.py write them.
- ``"ships"``: the small sets, built from what the installed packages ship.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from flurka.data import SMALL_DATASETS

GLUE = tuple(f"glue-{t}" for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"))

# dataset name (a config's ``dataset``) -> where its examples come from offline
DATA_SOURCES: dict[str, str] = {
    **{name: "tfds-mock" for name in GLUE},
    "lra-text": "tfds-mock", "lra-image": "tfds-mock", "imagenet": "tfds-mock",
    "nmt-wmt14-ende": "tfds-mock", "nmt-wmt14-enfr": "tfds-mock",
    "mlm-wikitext103": "local-files", "lra-retrieval": "local-files", "lra-pathfinder": "local-files",
    "lra-listops": "local-files",
    **{name: "ships" for name in SMALL_DATASETS},
}
MOCK_EXAMPLES = 12   # per split, as tests/data/test_data_tfds.py mocks them


def write_local_sets(root: Path) -> Path:
    """The file-based sets under ``root`` (a ``data_dir``) in the layouts their loaders read."""
    from PIL import Image

    from flurka.data import listops

    # WikiText-103 raw (tests/data/test_data_local_sets.py::test_wikitext103_raw_files)
    wiki = root / "wikitext-103-raw"
    wiki.mkdir(parents=True, exist_ok=True)
    text = " = Valkyria Chronicles = \n Senjō no Valkyria 3 is a tactical role @-@ playing game . \n" * 40
    for split in ("train", "valid", "test"):
        (wiki / f"wiki.{split}.raw").write_text(text if split == "train" else text[:1200], encoding="utf-8")
    # LRA retrieval: AAN pairs (::test_lra_retrieval_two_towers)
    tsv = root / "lra_release" / "tsv_data"
    tsv.mkdir(parents=True, exist_ok=True)
    rows = [f'{i % 2}.0\tid{i}a\tid{i}b\tpaper {i} about "attention"\tcited work {i}\n' for i in range(6)]
    for split in ("train", "eval", "test"):
        (tsv / f"new_aan_pairs.{split}.tsv").write_text("".join(rows))
    # LRA pathfinder: 32x32 PNGs and their metadata (::test_lra_pathfinder_pngs_and_cache)
    folder = root / "lra_release" / "pathfinder32" / "curv_contour_length_14"
    (folder / "imgs" / "0").mkdir(parents=True, exist_ok=True)
    (folder / "metadata").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    lines = []
    for i in range(10):
        Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8)).save(folder / "imgs" / "0" / f"sample_{i}.png")
        lines.append(f"imgs/0 sample_{i}.png 0 {i % 2} 1 2\n")
    (folder / "metadata" / "0.npy").write_text("".join(lines))
    # LRA ListOps release TSVs (tests/data/test_data_listops.py::test_release_tsv_files_are_read)
    release = root / "lra_release" / "listops-1000"
    release.mkdir(parents=True, exist_ok=True)
    trees = listops.generate(30, max_depth=3, max_args=4, min_length=3, max_length=40, seed=2)
    for split, part in (("train", trees[:20]), ("val", trees[20:25]), ("test", trees[25:])):
        (release / f"basic_{split}.tsv").write_text("Source\tTarget\n" + "".join(f"{s}\t{v}\n" for s, v in part))
    return root


def source_of(dataset: str) -> str:
    """``dataset``'s offline source; a dataset without one is an error naming what to add."""
    if dataset not in DATA_SOURCES:
        raise LookupError(f"dataset {dataset!r} has no offline data path in tests/support/offline_benchmarks.py: "
                          f"add its mock or tiny files there (known: {', '.join(sorted(DATA_SOURCES))})")
    return DATA_SOURCES[dataset]


@contextlib.contextmanager
def offline(dataset: str) -> Iterator[str]:
    """Within it ``dataset`` loads offline (a TFDS set through ``tfds.testing.mock_data``); yields
    the source's kind."""
    source = source_of(dataset)
    if source != "tfds-mock":
        yield source
        return
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        yield source
