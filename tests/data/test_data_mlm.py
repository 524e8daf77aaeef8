"""BERT masking statistics and the byte-level MLM sets."""

import numpy as np
from flurka.data import get_dataset
from flurka.data.mlm import chunk_bytes, mask_tokens
from flurka.data.stdlib_text import is_eval_file, stdlib_files
from flurka.data.tokenizers import BYTES


def test_mask_statistics_15_percent_80_10_10():
    rng = np.random.default_rng(0)
    ids = rng.integers(6, 262, (64, 512)).astype(np.int32)
    mask = np.ones(ids.shape, bool)
    mask[:, 400:] = False  # padding is never chosen
    out = mask_tokens(ids, mask, np.random.default_rng(1), mask_id=3, low=6, high=262)
    chosen = out["weights"] == 1
    assert not chosen[:, 400:].any()
    rate = chosen[:, :400].mean()
    assert abs(rate - 0.15) < 0.005
    n = chosen.sum()
    is_mask = (out["inputs"] == 3) & chosen
    kept = (out["inputs"] == ids) & chosen
    replaced = chosen & ~is_mask & ~kept
    assert abs(is_mask.sum() / n - 0.8) < 0.015
    # a random replacement equals the original 1/256 of the time: ~10% + 0.04% kept
    assert abs(kept.sum() / n - 0.1) < 0.01 and abs(replaced.sum() / n - 0.1) < 0.01
    assert (out["inputs"][replaced] >= 6).all()
    np.testing.assert_array_equal(out["targets"], ids)


def test_chunk_bytes_drops_ragged_tail():
    rows = chunk_bytes(b"abcdefghij", 4)
    assert rows.shape == (2, 4) and bytes(rows[1]) == b"efgh"


def test_mlm_small_is_python_source_and_split_by_file(check_batch):
    files = stdlib_files()
    assert len(files) > 100 and files == sorted(files)
    assert not any("site-packages" in f.parts or "test" in f.parts for f in files)
    held_out = [f for f in files if is_eval_file(f)]
    assert 0.03 < len(held_out) / len(files) < 0.2
    ds = get_dataset("mlm-small", max_train_bytes=50_000, max_eval_bytes=8_000)
    assert ds.info.vocab_size == BYTES.vocab_size == ds.info.num_classes and ds.info.mask_id == BYTES.mask_id
    batch = next(ds.train_batches(32))
    check_batch(batch, ds.info, 32)
    text = "".join(ds.decode(t) for t in batch["targets"])
    assert "def " in text or "import " in text or "return" in text
    # masking differs per step but is reproducible
    b1, b1_again, b2 = ds.train_batch(1, 32), ds.train_batch(1, 32), ds.train_batch(2, 32)
    np.testing.assert_array_equal(b1["weights"], b1_again["weights"])
    assert not np.array_equal(b1["weights"], b2["weights"])
