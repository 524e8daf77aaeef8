"""The batch contract on the small offline sets: determinism, resume, shapes, eval padding."""

import itertools
import time

import numpy as np
import pytest
from flurka.data import DATASETS, SMALL_DATASETS, DataNotFoundError, get_dataset
from flurka.data.core import ArrayExamples, Dataset, DatasetInfo, train_indices

SMALL_OPTIONS = {
    "lra-listops-small": {"num_train": 600, "num_val": 50, "num_test": 50},
    "lra-image-small": {},
    "mlm-small": {"max_train_bytes": 60_000, "max_eval_bytes": 10_000},
    "nmt-small": {},
    "nmt-list-small": {},
}


@pytest.fixture(scope="module", params=SMALL_DATASETS)
def small(request):
    name = request.param
    return name, get_dataset(name, seed=3, **SMALL_OPTIONS[name])


def test_every_paper_name_is_registered():
    expected = (
        ["mlm-wikitext103", "lra-listops", "lra-text", "lra-retrieval", "lra-image", "lra-pathfinder", "imagenet"]
        + [f"glue-{t}" for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")]
        + ["nmt-wmt14-ende", "nmt-wmt14-enfr"]
        + ["lra-listops-small", "lra-image-small", "mlm-small", "nmt-small", "nmt-list-small"]
    )
    assert sorted(DATASETS) == sorted(expected)


def test_shapes_dtypes_and_masks(small, check_batch):
    name, ds = small
    assert ds.info.name == name and ds.info.max_len <= 256
    check_batch(next(ds.train_batches(8)), ds.info, 8)
    check_batch(next(ds.eval_batches(8)), ds.info, 8)


def test_batch_is_pure_function_of_seed_and_step(small, assert_batches_equal):
    name, ds = small
    again = get_dataset(name, seed=3, **SMALL_OPTIONS[name])
    run = list(itertools.islice(ds.train_batches(16), 6))
    resumed = list(itertools.islice(again.train_batches(16, start_step=4), 2))
    for a, b in zip(run[4:], resumed):
        assert_batches_equal(a, b)
    other_seed = next(get_dataset(name, seed=4, **SMALL_OPTIONS[name]).train_batches(16))
    assert any(not np.array_equal(run[0][k], other_seed[k]) for k in run[0])


def test_eval_pass_is_finite_deterministic_and_padded(small, assert_batches_equal):
    _, ds = small
    n = ds.info.num_eval
    batches = list(ds.eval_batches(64))
    assert len(batches) == -(-n // 64)
    weights = np.concatenate([b["example_weight"] for b in batches])
    assert weights.dtype == np.float32 and weights.sum() == n and (weights[:n] == 1).all()
    for a, b in zip(batches, ds.eval_batches(64)):
        assert_batches_equal(a, b)


def test_epochs_cover_every_example_once():
    n = 10
    info = DatasetInfo(name="t", task="classification", vocab_size=20, max_len=1, num_classes=20)
    arrays = {
        "inputs": np.arange(n, dtype=np.int32)[:, None],
        "mask": np.ones((n, 1), bool),
        "label": np.arange(n, dtype=np.int32),
    }
    ds = Dataset(info, ArrayExamples(arrays), ArrayExamples(arrays), seed=7)
    seen = np.concatenate([b["label"] for b in itertools.islice(ds.train_batches(4), 5)])  # 20 = two epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert not np.array_equal(seen[:10], seen[10:])  # reshuffled per epoch
    np.testing.assert_array_equal(train_indices(7, 2, 4, n), seen[8:12])


def test_unknown_name_and_option_are_one_line_value_errors():
    with pytest.raises(ValueError, match="unknown dataset 'lra-foo'.*lra-listops-small"):
        get_dataset("lra-foo")
    with pytest.raises(ValueError, match=r"unknown options \['bogus'\].*valid"):
        get_dataset("lra-image-small", bogus=1)
    with pytest.raises(ValueError, match="batch_size"):
        next(get_dataset("lra-image-small").train_batches(0))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("mlm-wikitext103", "wikitext-103-raw/wiki"),
        ("lra-retrieval", "new_aan_pairs.train.tsv"),
        ("lra-pathfinder", "curv_contour_length_14/metadata"),
        ("glue-mrpc", "tfds build glue/mrpc"),
        ("lra-text", "tfds build imdb_reviews"),
        ("lra-image", "tfds build cifar10"),
        ("nmt-wmt14-ende", "tfds build wmt14_translate/de-en"),
        ("imagenet", "downloads/manual"),
    ],
)
def test_missing_data_is_a_clear_instant_error(tmp_path, monkeypatch, name, expected):
    monkeypatch.setenv("FLURKA_DATA_DIR", str(tmp_path / "from_env"))
    start = time.perf_counter()
    with pytest.raises(DataNotFoundError, match=expected) as err:
        get_dataset(name)
    assert time.perf_counter() - start < 10
    assert str(tmp_path / "from_env") in str(err.value)
    assert isinstance(err.value, FileNotFoundError)


def test_describe_names_the_data_not_the_seed(small):
    """The digest a tracker logs is the data's: every seed shares it, other data changes it."""
    name, ds = small
    d = ds.describe()
    assert d == {"name": name, "digest": d["digest"], "task": ds.info.task,
                 "num_train": ds.info.num_train, "num_eval": ds.info.num_eval}
    assert len(d["digest"]) == 16 and int(d["digest"], 16) >= 0
    assert get_dataset(name, seed=4, **SMALL_OPTIONS[name]).describe() == d
    first = ds.train.get(np.arange(1))
    changed = {k: v.copy() for k, v in first.items()}
    key = sorted(changed)[0]
    changed[key].flat[0] = changed[key].flat[0] + 1
    other = Dataset(ds.info, ArrayExamples(changed), ds.eval)
    assert other.describe()["digest"] != Dataset(ds.info, ArrayExamples(first), ds.eval).describe()["digest"]
