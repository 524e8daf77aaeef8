"""File-based sets read from the documented layout (tiny files written in tmp_path)."""

import numpy as np
from flurka.data import get_dataset
from PIL import Image


def test_wikitext103_raw_files(tmp_path, check_batch):
    root = tmp_path / "wikitext-103-raw"
    root.mkdir()
    text = " = Valkyria Chronicles = \n Senjō no Valkyria 3 is a tactical role @-@ playing game . \n" * 40
    for split in ("train", "valid", "test"):
        (root / f"wiki.{split}.raw").write_text(text if split == "train" else text[:1200], encoding="utf-8")
    ds = get_dataset("mlm-wikitext103", data_dir=str(tmp_path), max_len=64)
    assert ds.info.num_train == len(text.encode()) // 64 and ds.info.num_eval == 1200 // 64
    batch = next(ds.train_batches(4))
    check_batch(batch, ds.info, 4)
    assert all(ds.decode(t) in text for t in ds.eval.arrays["bytes"][:1].astype(int) + 6)


def test_lra_retrieval_two_towers(tmp_path, check_batch):
    root = tmp_path / "lra_release" / "tsv_data"
    root.mkdir(parents=True)
    rows = [f'{i % 2}.0\tid{i}a\tid{i}b\tpaper {i} about "attention"\tcited work {i}\n' for i in range(6)]
    for split in ("train", "eval", "test"):
        (root / f"new_aan_pairs.{split}.tsv").write_text("".join(rows))
    ds = get_dataset("lra-retrieval", data_dir=str(tmp_path), max_len=32)
    assert ds.info.pair == "two-tower" and ds.info.num_train == 6
    batch = next(ds.eval_batches(6))
    check_batch(batch, ds.info, 6)
    assert ds.decode(batch["inputs"][3]) == 'paper 3 about "attention"'
    assert ds.decode(batch["inputs2"][3]) == "cited work 3"
    np.testing.assert_array_equal(batch["label"], [0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(ds.labels("train"), [0, 1, 0, 1, 0, 1])


def test_lra_pathfinder_pngs_and_cache(tmp_path, check_batch):
    folder = tmp_path / "lra_release" / "pathfinder32" / "curv_contour_length_14"
    (folder / "imgs" / "0").mkdir(parents=True)
    (folder / "metadata").mkdir()
    rng = np.random.default_rng(0)
    images, lines = [], []
    for i in range(10):
        img = rng.integers(0, 256, (32, 32), dtype=np.uint8)
        Image.fromarray(img).save(folder / "imgs" / "0" / f"sample_{i}.png")
        images.append(img)
        lines.append(f"imgs/0 sample_{i}.png 0 {i % 2} 1 2\n")
    (folder / "metadata" / "0.npy").write_text("".join(lines))
    ds = get_dataset("lra-pathfinder", data_dir=str(tmp_path))
    assert (ds.info.max_len, ds.info.vocab_size, ds.info.num_train, ds.info.num_eval) == (1024, 257, 8, 1)
    batch = next(ds.eval_batches(1))
    check_batch(batch, ds.info, 1)
    np.testing.assert_array_equal(batch["inputs"][0], images[9].reshape(-1).astype(np.int32) + 1)
    assert batch["label"][0] == 1
    assert [p.name.rsplit("-", 1)[0] for p in (tmp_path / "arrays").iterdir() if p.is_dir()] == ["pathfinder32-hard"]
    cached = get_dataset("lra-pathfinder", data_dir=str(tmp_path), eval_split="validation")
    np.testing.assert_array_equal(next(cached.eval_batches(1))["inputs"][0], images[8].reshape(-1).astype(np.int32) + 1)
