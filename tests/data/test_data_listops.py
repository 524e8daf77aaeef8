"""ListOps port: generated values checked by an independent evaluator of the token string."""

import statistics

import numpy as np
import pytest
from flurka.data import get_dataset, listops


def evaluate_tokens(tokens: list[str]) -> int:
    """Independent stack evaluator of the prefix token form ``[OP a b ... ]``."""
    stack: list = []
    for tok in tokens:
        if tok.startswith("["):
            stack.append([tok])
        elif tok == "]":
            op, *args = stack.pop()
            value = {
                "[MIN": lambda a: min(a),
                "[MAX": lambda a: max(a),
                "[MED": lambda a: int(statistics.median(a)),  # truncation, as LRA's int(np.median)
                "[SM": lambda a: sum(a) % 10,
            }[op](args)
            if not stack:
                return value
            stack[-1].append(value)
        else:
            stack[-1].append(int(tok))
    raise AssertionError("unterminated expression")


def test_generated_values_match_independent_evaluator():
    rows = listops.generate(300, max_depth=4, max_args=5, min_length=3, max_length=80, seed=1)
    assert len({s for s, _ in rows}) == 300  # de-duplicated
    for source, value in rows:
        tokens = source.replace("(", " ").replace(")", " ").split()
        assert 3 < len(tokens) < 80  # the generator's length counts exactly these tokens
        assert evaluate_tokens(tokens) == value


def _original_generate(num_samples, *, max_depth, max_args, min_length, max_length, seed):
    """LRA's generator as written there (a tuple tree, rendered and evaluated afterwards), with one
    ``rng.random()`` per draw where it calls ``random``."""
    rng = np.random.default_rng(seed)

    def tree(depth):
        r = rng.random() if depth < max_depth else 1
        if r > listops.VALUE_P:
            return listops.VALUES[int(rng.random() * 10)], 1
        length, values = 2, []
        for _ in range(2 + int(rng.random() * (max_args - 1))):
            sub_t, sub_l = tree(depth + 1)
            values.append(sub_t)
            length += sub_l
        t = (listops.OPERATORS[int(rng.random() * 4)], values[0])
        for value in values[1:]:
            t = (t, value)
        return (t, listops.END), length

    def to_string(t):
        return str(t) if not isinstance(t, tuple) else f"( {to_string(t[0])} {to_string(t[1])} )"

    def to_value(t):
        if not isinstance(t, tuple):
            return t
        left, right = to_value(t[0]), to_value(t[1])
        if left in listops.OPERATORS:
            return (left, [right])
        if right == listops.END:
            op, args = left
            return {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)),
                    "[SM": lambda a: int(np.sum(a) % 10)}[op](args)
        return (left[0], left[1] + [right])

    trees = {}
    while len(trees) < num_samples:
        t, length = tree(1)
        if min_length < length < max_length:
            trees.setdefault(t, None)
    return [(to_string(t), int(to_value(t))) for t in trees]


@pytest.mark.parametrize("kw", [dict(max_depth=3, max_args=5, min_length=8, max_length=40, seed=0),
                                dict(max_depth=6, max_args=8, min_length=10, max_length=300, seed=7)])
def test_generator_gives_the_originals_trees_in_its_order(kw):
    assert listops.generate(2000, **kw) == _original_generate(2000, **kw)


def test_median_truncates_like_lra():
    assert listops.APPLY[listops.MED]([1, 2, 5, 6]) == 3 == int(np.median([1, 2, 5, 6]))   # 3.5 -> 3
    assert listops.APPLY[listops.MED]([7, 0, 4]) == 4
    assert listops.APPLY[listops.SUM_MOD]([9, 8, 7]) == 4


def test_generator_is_seeded_and_respects_depth_and_args():
    a = listops.generate(50, max_depth=3, max_args=4, min_length=4, max_length=60, seed=5)
    b = listops.generate(50, max_depth=3, max_args=4, min_length=4, max_length=60, seed=5)
    c = listops.generate(50, max_depth=3, max_args=4, min_length=4, max_length=60, seed=6)
    assert a == b and a != c
    for source, _ in a:
        depth = max_depth = 0
        for tok in source.replace("(", " ").replace(")", " ").split():
            depth += tok.startswith("[") - (tok == "]")
            max_depth = max(max_depth, depth)
        assert max_depth <= 3 - 1 + 1  # root at depth 1, operators only below max_depth


def test_tokenizer_roundtrip_and_dataset_labels():
    ds = get_dataset("lra-listops-small", num_train=200, num_val=40, num_test=40)
    batch = next(ds.eval_batches(40))
    for ids, mask, label in zip(batch["inputs"], batch["mask"], batch["label"]):
        tokens = listops.TOKENIZER.decode(ids[mask][1:]).split()
        assert evaluate_tokens(tokens) == label
    assert ds.info.vocab_size == 17 and ds.info.num_classes == 10 and ds.info.cls_id == listops.TOKENIZER.cls_id
    dist = ds.class_distribution("train")
    assert dist.shape == (10,) and np.isclose(dist.sum(), 1.0)
    assert 0.1 <= ds.majority_baseline < 0.3  # near-balanced classes: chance is low


def test_validation_and_test_splits_differ():
    kw = dict(num_train=100, num_val=30, num_test=30)
    val = get_dataset("lra-listops-small", **kw)
    test = get_dataset("lra-listops-small", eval_split="test", **kw)
    assert not np.array_equal(val.eval.arrays["inputs"], test.eval.arrays["inputs"])
    with pytest.raises(ValueError, match="eval_split"):
        get_dataset("lra-listops-small", eval_split="dev", **kw)


def test_release_tsv_files_are_read(tmp_path):
    root = tmp_path / "lra_release" / "listops-1000"
    root.mkdir(parents=True)
    rows = listops.generate(30, max_depth=3, max_args=4, min_length=3, max_length=40, seed=2)
    for split, part in (("train", rows[:20]), ("val", rows[20:25]), ("test", rows[25:])):
        with open(root / f"basic_{split}.tsv", "w") as f:
            f.write("Source\tTarget\n" + "".join(f"{s}\t{v}\n" for s, v in part))
    ds = get_dataset("lra-listops", data_dir=str(tmp_path), eval_split="test")
    assert (ds.info.num_train, ds.info.num_eval, ds.info.max_len) == (20, 5, 2000)
    np.testing.assert_array_equal(ds.eval.arrays["label"], [v for _, v in rows[25:]])
    assert listops.read_tsv(root / "basic_val.tsv") == rows[20:25]
