"""Shared fixtures for the data tests: contract checkers for batches."""

import numpy as np
import pytest


def _check_batch(batch: dict, info, batch_size: int) -> None:
    """Assert the keys, dtypes and shapes the data contract promises for ``info.task``."""
    B, N = batch_size, info.max_len
    if info.task == "image":
        # uint8 pixels where the data set says how the device normalises them, else float images
        dtype = np.uint8 if info.pixel_mean else np.float32
        assert batch["image"].dtype == dtype and batch["image"].shape == (B, *info.image_shape)
        assert batch["label"].dtype == np.int32 and batch["label"].shape == (B,)
        return
    assert batch["inputs"].dtype == np.int32 and batch["inputs"].shape == (B, N)
    assert batch["mask"].dtype == np.bool_ and batch["mask"].shape == (B, N)
    assert (batch["inputs"] >= 0).all() and (batch["inputs"] < info.vocab_size).all()
    # padding positions are False and hold pad_id; real tokens come first
    assert (batch["inputs"][~batch["mask"]] == info.pad_id).all()
    assert (np.diff(batch["mask"].astype(int), axis=1) <= 0).all()
    assert batch["mask"].any(axis=1).all()
    if info.task in ("classification", "regression"):
        dtype = np.float32 if info.task == "regression" else np.int32
        assert batch["label"].dtype == dtype and batch["label"].shape == (B,)
        if info.task == "classification":
            assert (batch["label"] >= 0).all() and (batch["label"] < info.num_classes).all()
        if info.cls_id is not None:
            assert (batch["inputs"][:, 0] == info.cls_id).all()
        if info.pair == "concat":
            assert batch["segments"].dtype == np.int32 and batch["segments"].shape == (B, N)
        if info.pair == "two-tower":
            assert batch["inputs2"].dtype == np.int32 and batch["inputs2"].shape == (B, N)
            assert batch["mask2"].dtype == np.bool_ and batch["mask2"].shape == (B, N)
    elif info.task == "mlm":
        assert batch["targets"].dtype == np.int32 and batch["targets"].shape == (B, N)
        assert batch["weights"].dtype == np.float32 and batch["weights"].shape == (B, N)
        assert ((batch["weights"] == 0) | (batch["weights"] == 1)).all()
        # unchosen positions are untouched
        same = batch["weights"] == 0
        assert (batch["inputs"][same] == batch["targets"][same]).all()
    elif info.task == "translation":
        M = info.target_max_len
        assert batch["targets"].dtype == np.int32 and batch["targets"].shape == (B, M)
        assert batch["targets_mask"].dtype == np.bool_ and batch["targets_mask"].shape == (B, M)
        assert (batch["targets"][:, 0] == info.bos_id).all()
        lengths = batch["targets_mask"].sum(1)
        assert (batch["targets"][np.arange(B), lengths - 1] == info.eos_id).all()
        assert (batch["targets"][~batch["targets_mask"]] == info.pad_id).all()
    else:
        raise AssertionError(f"unknown task {info.task}")


def _assert_batches_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture
def check_batch():
    """Asserts a batch's keys, dtypes, shapes and masks against the data contract."""
    return _check_batch


@pytest.fixture
def assert_batches_equal():
    return _assert_batches_equal
