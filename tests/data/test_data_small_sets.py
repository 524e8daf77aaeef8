"""nmt-small and lra-image-small content checks."""

import numpy as np
from flurka.data import get_dataset
from flurka.data.nmt_small import cldr_pairs, load_pairs, number_pairs
from flurka.data.tokenizers import CharTokenizer
from sklearn.datasets import load_digits


def test_number_words_pairs():
    pairs = dict(number_pairs(100))
    assert pairs["twenty-one"] == "einundzwanzig"
    assert pairs["seven"] == "sieben"
    assert pairs["one hundred"] in ("einhundert", "hundert")
    assert pairs["ninety-nine"] == "neunundneunzig"


def test_cldr_pairs_contain_known_names():
    pairs = dict(cldr_pairs())
    assert pairs["Germany"] == "Deutschland"
    assert pairs["French"] == "Französisch"
    assert pairs["Monday"] == "Montag"


def test_nmt_small_batches_decode_to_pairs():
    ds = get_dataset("nmt-small")
    known = dict(load_pairs())
    batch = next(ds.train_batches(32))
    for src, tgt, m in zip(batch["inputs"], batch["targets"], batch["mask"]):
        assert src[m.sum() - 1] == ds.info.eos_id
        assert known[ds.decode(src)] == ds.decode(tgt[1:])
    assert ds.info.vocab_size == ds.info.target_vocab_size and ds.info.task == "translation"
    n_pairs = len(load_pairs())
    assert ds.info.num_train + ds.info.num_eval == n_pairs and ds.info.num_eval == round(0.1 * n_pairs)


def test_char_tokenizer_roundtrip_and_unknown():
    tok = CharTokenizer.build(["abc", "ß"])
    ids = tok.encode("cabß")
    assert tok.decode(np.concatenate([ids, [tok.eos_id, 7]])) == "cabß"
    assert tok.encode("z")[0] == tok.unk_id


def test_digits_are_pixel_tokens_with_held_out_split():
    ds = get_dataset("lra-image-small")
    digits = load_digits()
    assert ds.info.num_train + ds.info.num_eval == len(digits.target)
    assert ds.info.max_len == 64 and ds.info.vocab_size == 18 and ds.info.cls_id is None
    train, eval = ds.train.arrays, ds.eval.arrays
    all_tokens = np.concatenate([train["inputs"], eval["inputs"]])
    expected = {(tuple(img.reshape(-1).astype(int) + 1), lab) for img, lab in zip(digits.images, digits.target)}
    got = {(tuple(t), lab) for t, lab in zip(all_tokens, np.concatenate([train["label"], eval["label"]]))}
    assert got == expected
    assert not {tuple(t) for t in train["inputs"]} >= {tuple(t) for t in eval["inputs"]}  # held out
    assert ds.majority_baseline < 0.15
