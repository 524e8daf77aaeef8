"""TFDS loaders under ``tfds.testing.mock_data`` (random examples, no TensorFlow, no files)."""

import numpy as np
import pytest
import tensorflow_datasets as tfds
from flurka.data import get_dataset
from flurka.data.core import train_indices
from flurka.data.tfds_sets import _encode_imagenet, tfds_source
from flurka.data.tokenizers import BYTES


@pytest.fixture
def mock():
    with tfds.testing.mock_data(num_examples=12):
        yield


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


@pytest.mark.parametrize(
    "task, pair, kind",
    [
        ("cola", None, "classification"),
        ("mrpc", "concat", "classification"),
        ("stsb", "concat", "regression"),
        ("mnli", "concat", "classification"),
    ],
)
def test_glue(mock, tmp_path, task, pair, kind, check_batch, assert_batches_equal):
    ds = get_dataset(f"glue-{task}", seed=1, data_dir=str(tmp_path))
    assert (ds.info.task, ds.info.pair, ds.info.num_eval) == (kind, pair, 12)
    batch = next(ds.train_batches(5))
    check_batch(batch, ds.info, 5)
    check_batch(next(ds.eval_batches(5)), ds.info, 5)
    assert_batches_equal(batch, next(get_dataset(f"glue-{task}", seed=1, data_dir=str(tmp_path)).train_batches(5)))
    # byte level: [CLS] a [SEP] (b [SEP]); segments switch after the first [SEP]
    ex = ds.eval.source[0]
    b = next(ds.eval_batches(12))
    ids, mask = b["inputs"][0], b["mask"][0]
    fields = [k for k in ("sentence", "sentence1", "sentence2", "premise", "hypothesis") if k in ex]
    expected = [BYTES.cls_id]
    for f in fields:
        expected += list(BYTES.encode(_text(ex[f]))) + [BYTES.sep_id]
    np.testing.assert_array_equal(ids[mask], expected)
    if pair:
        first_sep = list(ids).index(BYTES.sep_id)
        np.testing.assert_array_equal(
            b["segments"][0][mask], [0] * (first_sep + 1) + [1] * (mask.sum() - first_sep - 1)
        )
    if kind == "regression":
        np.testing.assert_allclose(b["label"][0], ex["label"], rtol=1e-6)


def test_wmt14_ende(mock, tmp_path, check_batch):
    ds = get_dataset("nmt-wmt14-ende", data_dir=str(tmp_path))
    batch = next(ds.eval_batches(4))
    check_batch(batch, ds.info, 4)
    ex = ds.eval.source[0]
    assert ds.decode(batch["inputs"][0]) == _text(ex["en"])
    assert ds.decode(batch["targets"][0][1:]) == _text(ex["de"])


def test_lra_text_is_byte_level(mock, tmp_path, check_batch):
    ds = get_dataset("lra-text", data_dir=str(tmp_path))
    assert ds.info.max_len == 4000 and ds.info.num_classes == 2
    batch = next(ds.eval_batches(3))
    check_batch(batch, ds.info, 3)
    text = _text(tfds_source("imdb_reviews/plain_text", "test", str(tmp_path))[1]["text"]).encode()
    np.testing.assert_array_equal(batch["inputs"][1][1 : 1 + len(text)], np.frombuffer(text, np.uint8) + BYTES.offset)
    assert ds.decode(batch["inputs"][1]) == text.decode()


def test_lra_image_is_grayscale_pixels(mock, tmp_path, check_batch):
    ds = get_dataset("lra-image", data_dir=str(tmp_path))
    assert ds.info.max_len == 1024 and ds.info.vocab_size == 257
    batch = next(ds.eval_batches(4))
    check_batch(batch, ds.info, 4)
    source = tfds_source("cifar10", "test", str(tmp_path))
    for i in range(4):
        rgb = source[i]["image"].astype(np.float64)
        expected = np.floor(rgb @ [0.2989, 0.5870, 0.1140] / 255.0 * 255.5).reshape(-1) + 1
        diff = np.abs(batch["inputs"][i] - expected)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99


def test_imagenet_crops_uint8_pixels_of_each_resize(mock, tmp_path, check_batch, assert_batches_equal):
    """Training batches: a 224 window of each image's 256 resize, flipped or not; eval: the
    centre; uint8, with the mean/std the device normalises by."""
    ds = get_dataset("imagenet", seed=2, data_dir=str(tmp_path))
    assert ds.info.task == "image" and ds.info.image_shape == (224, 224, 3)
    assert ds.info.pixel_mean == pytest.approx((0.485, 0.456, 0.406)) and len(ds.info.pixel_std) == 3
    batch = next(ds.train_batches(3))
    check_batch(batch, ds.info, 3)
    assert_batches_equal(batch, ds.train_batch(0, 3))
    assert not np.array_equal(ds.train_batch(0, 3)["image"], ds.train_batch(4, 3)["image"])
    source = tfds_source("imagenet2012", "train", str(tmp_path))
    for crop, i in zip(batch["image"], train_indices(2, 0, 3, len(source))):
        full = _encode_imagenet(source[int(i)])["image"]
        windows = [(t, x, f) for t in range(33) for x in range(33) for f in (False, True)
                   if np.array_equal(crop, full[t:t + 224, x:x + 224][:, ::-1] if f else full[t:t + 224, x:x + 224])]
        assert windows, "a training crop is no 224 window of its image's resize"
    eval_batch = next(ds.eval_batches(5))
    check_batch({k: v for k, v in eval_batch.items() if k != "example_weight"}, ds.info, 5)
    source = tfds_source("imagenet2012", "validation", str(tmp_path))
    np.testing.assert_array_equal(eval_batch["image"][0], _encode_imagenet(source[0])["image"][16:240, 16:240])


def test_mnli_evaluates_its_mismatched_dev_set_beside_the_matched_one(mock, tmp_path, monkeypatch, check_batch):
    """glue-mnli reads TFDS's validation_mismatched as its extra eval split "mismatched" (recorded as
    accuracy_mismatched, Table 2's MNLI-mm); the other tasks, and an explicit eval_split, have none."""
    from flurka.data import tfds_sets
    from flurka.data.core import split_metric

    read, real = [], tfds_sets.tfds_source

    def spy(name, split, data_dir=None):   # the mock's splits are identical: make mismatched its own
        read.append((name, split))
        source = real(name, split, data_dir)
        if split != "validation_mismatched":
            return source
        return [dict(source[i], label=(int(source[i]["label"]) + 1) % 3) for i in range(7)]

    monkeypatch.setattr(tfds_sets, "tfds_source", spy)
    ds = get_dataset("glue-mnli", data_dir=str(tmp_path))
    assert read == [("glue/mnli", "train"), ("glue/mnli", "validation_matched"), ("glue/mnli", "validation_mismatched")]
    assert list(ds.extra_evals) == ["mismatched"] and split_metric("accuracy", "mismatched") == "accuracy_mismatched"
    assert (ds.describe()["num_eval"], ds.describe()["num_eval_mismatched"]) == (12, 7)
    matched, mismatched = next(ds.eval_batches(12)), list(ds.eval_batches(5, "mismatched"))
    assert [b["example_weight"].tolist() for b in mismatched] == [[1.0] * 5, [1.0] * 2 + [0.0] * 3]
    for b in mismatched:
        check_batch(b, ds.info, 5)
    got = np.concatenate([b["label"][b["example_weight"] > 0] for b in mismatched])
    np.testing.assert_array_equal(got, [(int(ds.eval.source[i]["label"]) + 1) % 3 for i in range(7)])
    np.testing.assert_array_equal(np.concatenate([b["inputs"][:5] for b in mismatched])[:7], matched["inputs"][:7])
    with pytest.raises(ValueError, match="no extra eval split 'matched'"):
        next(ds.eval_batches(5, "matched"))
    # only MNLI has one, and only beside its default eval split
    assert get_dataset("glue-cola", data_dir=str(tmp_path)).extra_evals == {}
    assert get_dataset("glue-mnli", data_dir=str(tmp_path), eval_split="validation_mismatched").extra_evals == {}
    assert "num_eval_mismatched" not in get_dataset("glue-rte", data_dir=str(tmp_path)).describe()
