"""The LRA loaders' decoded-array cache (flurka.data.cache): the same batches as the per-example
decode, built once, reused, and built again when its inputs change or its files are damaged."""

import os
import threading
import time
import types
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds
from flurka.data import get_dataset, local_sets, tfds_sets
from flurka.data.cache import cached_arrays, cached_memmaps, entry_path
from flurka.data.core import pack_sequences, pad_to, unpack_sequences
from PIL import Image

MOCK_EXAMPLES = 12


@pytest.fixture
def mock():
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        yield


def write_aan(root, rows):
    tsv = root / "lra_release" / "tsv_data"
    tsv.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"{label}\tid{i}a\tid{i}b\t{a}\t{b}\n" for i, (label, a, b) in enumerate(rows))
    for split in ("train", "eval", "test"):
        (tsv / f"new_aan_pairs.{split}.tsv").write_text(lines, encoding="utf-8")
    return tsv


AAN_ROWS = [(i % 2, f"paper {i} über Aufmerksamkeit — 注意 " * (i + 1), f"cited work {i}" if i != 3 else "")
            for i in range(9)]


def write_pathfinder(root, n=10):
    folder = root / "lra_release" / "pathfinder32" / "curv_contour_length_14"
    (folder / "imgs" / "0").mkdir(parents=True, exist_ok=True)
    (folder / "metadata").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8)).save(folder / "imgs" / "0" / f"s{i}.png")
        lines.append(f"imgs/0 s{i}.png 0 {i % 2} 1 2\n")
    (folder / "metadata" / "0.npy").write_text("".join(lines))
    return folder


def assert_same(a, b):
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def assert_same_dataset(cached, reference, batch_size):
    """Training batches for several (seed, k), the eval pass, the describe digest and the labels."""
    for k in (0, 1, 2, 7):
        assert_same(cached.train_batch(k, batch_size), reference.train_batch(k, batch_size))
    for a, b in zip(cached.eval_batches(batch_size), reference.eval_batches(batch_size), strict=True):
        assert_same(a, b)
    assert cached.describe() == reference.describe()
    np.testing.assert_array_equal(cached.labels("train"), reference.labels("train"))
    np.testing.assert_array_equal(cached.labels("eval"), reference.labels("eval"))


CASES = {   # case -> (benchmark, options, batch size); the TFDS sets under mock_data, the others as local files
    "lra-text": ("lra-text", {}, 5),
    "lra-text-cut": ("lra-text", {"max_len": 9}, 5),
    "lra-image": ("lra-image", {}, 5),
    "lra-image-validation": ("lra-image", {"eval_split": "validation"}, 4),
    "lra-retrieval": ("lra-retrieval", {"max_len": 40}, 4),
    "lra-retrieval-test": ("lra-retrieval", {"max_len": 300, "eval_split": "test"}, 3),
    "lra-pathfinder": ("lra-pathfinder", {}, 3),
    "imagenet": ("imagenet", {}, 3),   # resized pixels, a memory map written in place
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 5])
def test_cached_batches_are_the_per_example_decodes(mock, tmp_path, case, seed, check_batch):
    name, options, bs = CASES[case]
    write_aan(tmp_path, AAN_ROWS)
    write_pathfinder(tmp_path)
    cached = get_dataset(name, seed=seed, data_dir=str(tmp_path), **options)
    assert entries(tmp_path)   # built and kept
    reference = get_dataset(name, seed=seed, data_dir=str(tmp_path), cache=False, **options)
    assert cached.info == reference.info
    check_batch(cached.train_batch(0, bs), cached.info, bs)
    assert_same_dataset(cached, reference, bs)
    # a fresh build reads the entries back (memory-mapped) and gives the same again
    assert_same_dataset(get_dataset(name, seed=seed, data_dir=str(tmp_path), **options), reference, bs)


def test_cache_false_writes_nothing(mock, tmp_path):
    write_aan(tmp_path, AAN_ROWS)
    write_pathfinder(tmp_path)
    for name in ("lra-text", "lra-image", "lra-retrieval", "lra-pathfinder", "imagenet"):
        get_dataset(name, data_dir=str(tmp_path), cache=False).train_batch(0, 2)
    assert not (tmp_path / "arrays").exists()


class Counter:
    """Wraps a module's function and counts its calls."""

    def __init__(self, monkeypatch, module, name):
        self.calls, real = 0, getattr(module, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)


def entries(root):
    return sorted(p.name for p in (root / "arrays").iterdir() if p.is_dir())


def test_lra_image_decodes_once_then_reuses_and_rebuilds_for_other_data(tmp_path, monkeypatch):
    gray = Counter(monkeypatch, tfds_sets, "rgb_to_grayscale")
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        first = get_dataset("lra-image", data_dir=str(tmp_path))
        assert gray.calls == 2 * MOCK_EXAMPLES   # train[:90%] and test, each image once
        made = {p: p.stat().st_mtime_ns for p in (tmp_path / "arrays").rglob("*.npy")}
        again = get_dataset("lra-image", data_dir=str(tmp_path))
        assert gray.calls == 2 * MOCK_EXAMPLES   # nothing decoded
        assert {p: p.stat().st_mtime_ns for p in (tmp_path / "arrays").rglob("*.npy")} == made
        assert_same(first.train_batch(3, 4), again.train_batch(3, 4))
    with tfds.testing.mock_data(num_examples=7):   # another split: another key, decoded again
        get_dataset("lra-image", data_dir=str(tmp_path))
    assert gray.calls == 2 * MOCK_EXAMPLES + 2 * 7 and len(entries(tmp_path)) == 4


class PreparedSplit(Sequence):
    """A ``tfds.data_source`` split as a prepared data set gives it: ``dataset_info`` naming real
    shard files (the cache's key: cifar10's train and test, two shards each) and examples by index."""

    def __init__(self, root, split, examples):
        from tensorflow_datasets.core import naming
        from tensorflow_datasets.core import splits as splits_lib

        infos = []
        for name in ("train", "test"):
            template = naming.ShardedFileTemplate(data_dir=str(root), dataset_name="cifar10", split=name,
                                                  filetype_suffix="array_record")
            half = len(examples) // 2
            infos.append(splits_lib.SplitInfo(name=name, shard_lengths=[half, len(examples) - half], num_bytes=0,
                                              filename_template=template))
            for instruction in infos[-1].file_instructions:
                if not Path(instruction.filename).exists():
                    Path(instruction.filename).write_bytes(b"shard")
        self.dataset_info = types.SimpleNamespace(full_name="cifar10/3.0.2", data_dir=str(root),
                                                  splits=splits_lib.SplitDict(infos))
        self.split = split
        self.examples = [examples[f.skip + i + (len(examples) // 2 if "00001-of" in f.filename else 0)]
                         for f in self.dataset_info.splits[split].file_instructions for i in range(f.take)]

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[int(i)]


def test_a_prepared_tfds_split_is_keyed_by_its_files(tmp_path, monkeypatch):
    """lra-image on a split whose dataset_info names shard files: decoded once, reused, and decoded
    again when a shard file is rewritten (TFDS prepared again)."""
    rng = np.random.default_rng(1)
    examples = [{"image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "label": i % 10} for i in range(20)]
    splits = {s: PreparedSplit(tmp_path, s, examples) for s in ("train[:90%]", "train[90%:]", "test")}
    monkeypatch.setattr(tfds_sets, "tfds_source", lambda name, split, data_dir=None: splits[split])
    fingerprint = tfds_sets.source_fingerprint(splits["train[90%:]"])
    assert fingerprint["dataset"] == "cifar10/3.0.2" and fingerprint["examples"] == 2
    assert [f[:3] for f in fingerprint["files"]] == [["cifar10-train.array_record-00001-of-00002", 8, 2]]
    assert [e["label"] for e in splits["train[90%:]"].examples] == [8, 9]
    assert fingerprint["files"][0][3][0] == len(b"shard")   # size, mtime
    gray = Counter(monkeypatch, tfds_sets, "rgb_to_grayscale")
    cached = get_dataset("lra-image", seed=4, data_dir=str(tmp_path / "data"))
    assert gray.calls == 18 + 20
    assert_same_dataset(cached, get_dataset("lra-image", seed=4, data_dir=str(tmp_path), cache=False), 4)
    gray.calls = 0   # the reference decodes on every access
    get_dataset("lra-image", seed=4, data_dir=str(tmp_path / "data"))
    assert gray.calls == 0
    shard = Path(splits["test"].dataset_info.splits["train"].file_instructions[0].filename)
    shard.write_bytes(b"prepared again")   # train[:90%] reads it; test does not
    get_dataset("lra-image", seed=4, data_dir=str(tmp_path / "data"))
    assert gray.calls == 18 and len(entries(tmp_path / "data")) == 3


def test_lra_text_encodes_once_per_max_len(mock, tmp_path, monkeypatch):
    encode = Counter(monkeypatch, tfds_sets, "lra_text_ids")
    get_dataset("lra-text", data_dir=str(tmp_path))
    get_dataset("lra-text", data_dir=str(tmp_path))
    assert encode.calls == 2 * MOCK_EXAMPLES
    get_dataset("lra-text", data_dir=str(tmp_path), max_len=16)   # other options: another entry
    assert encode.calls == 4 * MOCK_EXAMPLES and len(entries(tmp_path)) == 4


def test_lra_retrieval_reads_its_tsv_once_and_again_when_it_changes(tmp_path, monkeypatch):
    reads = Counter(monkeypatch, local_sets, "read_aan_tsv")
    tsv = write_aan(tmp_path, AAN_ROWS)
    get_dataset("lra-retrieval", data_dir=str(tmp_path), max_len=40)
    assert reads.calls == 2
    ds = get_dataset("lra-retrieval", data_dir=str(tmp_path), max_len=40)
    assert reads.calls == 2 and ds.decode(ds.eval.get(np.arange(1))["inputs2"][0]) == "cited work 0"
    rows = [(1 - label, b, a) for label, a, b in AAN_ROWS]   # the train file rewritten: read again
    write_aan(tmp_path, rows)
    os.utime(tsv / "new_aan_pairs.train.tsv", ns=(1, 1))   # even with an old mtime: the size changed
    ds = get_dataset("lra-retrieval", data_dir=str(tmp_path), max_len=40)
    assert reads.calls == 4
    assert ds.decode(ds.train.get(np.arange(1))["inputs"][0]) == "cited work 0"
    np.testing.assert_array_equal(ds.labels("train"), [1 - r[0] for r in AAN_ROWS])


def test_pathfinder_decodes_once_and_again_when_its_metadata_changes(tmp_path, monkeypatch):
    reads = Counter(monkeypatch, local_sets, "read_pathfinder")
    folder = write_pathfinder(tmp_path)
    assert get_dataset("lra-pathfinder", data_dir=str(tmp_path)).info.num_train == 8
    assert get_dataset("lra-pathfinder", data_dir=str(tmp_path), eval_split="validation").info.num_eval == 1
    assert reads.calls == 1
    with open(folder / "metadata" / "0.npy", "a") as f:
        f.write("".join(f"imgs/0 s{i}.png 0 1 1 2\n" for i in range(10)))
    assert get_dataset("lra-pathfinder", data_dir=str(tmp_path)).info.num_train == 16
    assert reads.calls == 2


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-7])


def _extend(path):
    path.write_bytes(path.read_bytes() + b"\0" * 16)


def _garbage(path):
    path.write_bytes(b"not an array")


def _drop(path):
    path.unlink()


@pytest.mark.parametrize("damage", [_truncate, _extend, _garbage, _drop])
@pytest.mark.parametrize("target", ["ids.npy", "manifest.json"])
def test_a_damaged_entry_is_built_again(tmp_path, monkeypatch, damage, target):
    reads = Counter(monkeypatch, local_sets, "read_aan_tsv")
    write_aan(tmp_path, AAN_ROWS)
    reference = get_dataset("lra-retrieval", seed=2, data_dir=str(tmp_path), max_len=40, cache=False)
    get_dataset("lra-retrieval", seed=2, data_dir=str(tmp_path), max_len=40)
    assert reads.calls == 2 + 2
    (train,) = [p for p in (tmp_path / "arrays").iterdir() if p.name.startswith("aan-train-")]
    damage(train / target)
    with pytest.warns(UserWarning, match="damaged; building them again"):
        rebuilt = get_dataset("lra-retrieval", seed=2, data_dir=str(tmp_path), max_len=40)
    assert reads.calls == 4 + 1   # the train file only
    assert_same_dataset(rebuilt, reference, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # whole again: read back silently
        get_dataset("lra-retrieval", seed=2, data_dir=str(tmp_path), max_len=40)
    assert reads.calls == 5


def test_an_unwritable_data_dir_keeps_the_arrays_in_memory(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    calls = []

    def build():
        calls.append(1)
        return {"x": np.arange(5)}

    for _ in range(2):
        with pytest.warns(UserWarning, match="kept in memory"):
            out = cached_arrays("t", {"a": 1}, build, data_dir=blocked)
        np.testing.assert_array_equal(out["x"], np.arange(5))
    assert len(calls) == 2


def test_processes_building_one_entry_at_once_build_it_once(tmp_path):
    calls = []

    def build():
        calls.append(1)
        time.sleep(0.3)
        return {"x": np.arange(1000, dtype=np.int16).reshape(10, 100)}

    out = [None] * 3
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, cached_arrays("t", {"a": 1}, build,
                                                                                    data_dir=tmp_path)))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    for arrays in out:
        np.testing.assert_array_equal(arrays["x"], np.arange(1000).reshape(10, 100))
        assert arrays["x"].dtype == np.int16 and not arrays["x"].flags.writeable   # read-only map
    assert [p.name for p in (tmp_path / "arrays").iterdir() if not p.name.startswith(".")] == \
        [entry_path("t", {"a": 1}, tmp_path).name]   # no temporary folder left


def test_packed_sequences_unpack_to_pad_to():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 200, n) for n in (0, 3, 7, 12)]
    rows, lengths = pack_sequences(iter(seqs), 4, 10)
    assert rows.dtype == np.uint8 and rows.shape == (4, 10) and lengths.tolist() == [0, 3, 7, 10]
    seqs.append(np.array([5, 300, 70_000]))   # ids past a byte widen the rows
    rows, lengths = pack_sequences(iter(seqs), 5, 10)
    assert rows.dtype == np.uint32
    idx = np.array([4, 1, 1, 3])
    ids, mask = unpack_sequences(rows[idx], lengths[idx], 10)
    for i, j in enumerate(idx):
        want_ids, want_mask = pad_to(seqs[j], 10)
        np.testing.assert_array_equal(ids[i], want_ids)
        np.testing.assert_array_equal(mask[i], want_mask)
    assert ids.dtype == np.int32 and mask.dtype == np.bool_
    narrow, _ = pack_sequences(iter([[1, 2], [3]]), 2, 10)
    assert narrow.shape == (2, 2)   # as wide as the longest
    with pytest.raises(ValueError, match="expected 3 sequences"):
        pack_sequences(iter([[1]]), 3, 4)


def test_imagenet_decodes_once_on_threads_then_maps_the_pixels(tmp_path, monkeypatch):
    encoded = Counter(monkeypatch, tfds_sets, "_encode_imagenet")
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        first = get_dataset("imagenet", data_dir=str(tmp_path), threads=3)
        assert encoded.calls == 2 * MOCK_EXAMPLES   # train and validation, each image once
        again = get_dataset("imagenet", data_dir=str(tmp_path))
        assert encoded.calls == 2 * MOCK_EXAMPLES
        assert isinstance(again.train.arrays["image"].base, np.memmap)   # mapped, not read into memory
        assert_same(first.train_batch(5, 4), again.train_batch(5, 4))


def _fill_rows(arrays):
    arrays["x"][:] = np.arange(arrays["x"].size, dtype=np.int16).reshape(arrays["x"].shape)


def test_memmaps_that_cannot_be_kept_say_so_and_leave_the_decoding_to_the_caller(tmp_path, monkeypatch):
    layout = {"x": ((10, 100), "int16")}
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    with pytest.warns(UserWarning, match="cannot write under .*decoded per batch instead"):
        assert cached_memmaps("t", {"a": 1}, layout, _fill_rows, data_dir=blocked) is None
    import shutil
    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(free=1999, total=10**6, used=0))
    with pytest.warns(UserWarning, match=r"0\.0 GB free, the arrays need 0\.0 GB: the t examples are decoded"):
        assert cached_memmaps("t", {"a": 1}, layout, _fill_rows, data_dir=tmp_path) is None
    assert not (tmp_path / "arrays").exists() or not entries(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(free=2000, total=10**6, used=0))
    out = cached_memmaps("t", {"a": 1}, layout, _fill_rows, data_dir=tmp_path)
    np.testing.assert_array_equal(out["x"], np.arange(1000, dtype=np.int16).reshape(10, 100))
    assert out["x"].dtype == np.int16 and len(entries(tmp_path)) == 1
