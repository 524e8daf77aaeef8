"""Subword vocabularies (flurka.data.subword): SentencePiece tokenizers, their cache, the paper-scale
text benchmarks trained 2 steps through their real loaders on them, and BLEU on detokenized text.

Vocabularies here are tiny (64-200 pieces, via the ``vocab_size`` option) and their training text
a few hundred lines, so each trains in well under a second."""

from __future__ import annotations

import io
import math
import pickle
import sysconfig
import warnings
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import sentencepiece as spm
import tensorflow_datasets as tfds
from num2words import num2words
from training_helpers import TINY

from flurka.configs import get_config
from flurka.data import DataNotFoundError, get_dataset, subword
from flurka.data.registry import GLUE_TASKS
from flurka.data.tokenizers import BYTES, SentencePieceTokenizer
from flurka.training import run
from flurka.training.metrics import bleu

VOCAB = 160          # pieces of the tests' trained vocabularies
LEN = 24             # tokens per sequence in the end-to-end runs


def _stdlib_lines(n: int = 600) -> list[str]:
    """Real English-ish text on every machine: docstring and comment lines of CPython's sources."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    lines = []
    for path in sorted(lib.glob("*.py"))[:40]:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = " ".join(line.strip().lstrip("#").split())   # one space between words: SentencePiece collapses runs
            words = line.split()
            if len(words) >= 6 and line[0].isalpha() and all(w.strip(",.;:'()").isalpha() for w in words):
                lines.append(line)
    return lines[:n]


TEXTS = _stdlib_lines()


def write_wikitext(root: Path, lines: list[str] = TEXTS) -> Path:
    folder = root / "wikitext-103-raw"
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n".join(f" {line} " for line in lines) + "\n"
    for split in ("train", "valid", "test"):
        (folder / f"wiki.{split}.raw").write_text(text if split == "train" else text[: len(text) // 4], encoding="utf-8")
    return root


@pytest.fixture
def trained_calls(monkeypatch) -> list[str]:
    """The families whose vocabulary was trained (not read from the cache), in order."""
    calls, real = [], subword._train

    def spy(family, texts, options, **kw):
        calls.append(family)
        return real(family, texts, options, **kw)

    monkeypatch.setattr(subword, "_train", spy)
    return calls


# ---------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------
def test_sentencepiece_tokenizer_round_trips_text(tmp_path):
    tok = subword.sentencepiece_vocab("test", TEXTS, data_dir=tmp_path, vocab_size=VOCAB)
    assert (tok.vocab_size, tok.piece_size) == (VOCAB, VOCAB)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.mask_id, tok.cls_id, tok.sep_id) == (0, 1, 2, 3, 4, 5, 6)
    texts = TEXTS[:50] + ["Return the value of the attribute, and raise an error."]
    for text in texts:
        ids = tok.encode(text)
        assert ids.dtype == np.int32 and (ids >= tok.first_piece_id).all() and (ids < VOCAB).all()
        assert tok.decode(ids) == text
    # subwords, even of 160 pieces: well under one token per byte
    assert sum(len(tok.encode(t)) for t in texts) < 0.7 * sum(len(t.encode()) for t in texts)
    # decode drops padding and control ids and stops at EOS, as ByteTokenizer's does
    a, b = tok.encode("the first part"), tok.encode("never shown")
    assert tok.decode(np.concatenate([[tok.cls_id], a, [tok.sep_id, tok.eos_id], b, [0, 0]])) == "the first part"
    assert tok.encode("a long sentence of text", max_tokens=3).shape == (3,)
    assert tok.encode(b"bytes are read as UTF-8").tolist() == tok.encode("bytes are read as UTF-8").tolist()
    clone = pickle.loads(pickle.dumps(tok))             # worker processes get the same tokenizer
    assert clone == tok and clone.decode(clone.encode(TEXTS[0])) == TEXTS[0] and clone.source == tok.source


def test_byte_fallback_makes_unseen_characters_lossless(tmp_path):
    """With room for 256 byte pieces (vocab_size >= 1024), a character the training text never had
    decodes back to itself instead of <unk>."""
    tok = subword.sentencepiece_vocab("test", TEXTS, data_dir=tmp_path, vocab_size=1100)
    text = "Prices in € and ¥, 日本語 and ✓"
    assert tok.decode(tok.encode(text)) == text and tok.unk_id not in tok.encode(text).tolist()
    small = subword.sentencepiece_vocab("test", TEXTS, data_dir=tmp_path, vocab_size=VOCAB)
    assert small.unk_id in small.encode("日本").tolist()       # no room: unknown


def _t5_layout_model(texts) -> bytes:
    """A model laid out as T5's vocabularies are: pad 0, eos 1, unk 2, no bos, no control pieces."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=out, vocab_size=100, pad_id=0, eos_id=1,
                                   unk_id=2, bos_id=-1, minloglevel=2)
    return out.getvalue()


def test_a_given_model_file_gets_extra_ids_for_what_it_lacks(tmp_path):
    path = tmp_path / "t5-like.model"
    path.write_bytes(_t5_layout_model(TEXTS))
    tok = SentencePieceTokenizer.load(path)
    assert (tok.pad_id, tok.eos_id, tok.unk_id, tok.first_piece_id) == (0, 1, 2, 3)
    assert (tok.bos_id, tok.mask_id, tok.cls_id, tok.sep_id, tok.vocab_size) == (100, 101, 102, 103, 104)
    assert tok.decode(tok.encode(TEXTS[3])) == TEXTS[3]
    # a loader takes it as ``vocab``: no training, its own size
    write_wikitext(tmp_path)
    ds = get_dataset("mlm-wikitext103", data_dir=str(tmp_path), vocab=str(path), max_len=LEN)
    assert ds.info.vocab_size == 104 and ds.info.mask_id == 101
    assert not list((tmp_path / "vocabularies").glob("*.model"))   # nothing trained
    with pytest.raises(ValueError, match="vocab_size and vocab_model_type are for vocab='sentencepiece'"):
        get_dataset("mlm-wikitext103", data_dir=str(tmp_path), vocab=str(path), vocab_size=64)


def test_bad_model_files_are_one_line_errors_naming_the_file(tmp_path, capfd):
    missing = tmp_path / "nowhere.model"
    with pytest.raises(DataNotFoundError, match=f"no SentencePiece model file at {missing}"):
        SentencePieceTokenizer.load(missing)
    cases = {"garbage.model": b"not a model at all", "empty.model": b"",
             "half.model": _t5_layout_model(TEXTS)[:200]}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError) as err:
            SentencePieceTokenizer.load(tmp_path / name)
        message = str(err.value)
        assert message.startswith(f"{tmp_path / name} is not a SentencePiece model"), message
        assert "\n" not in message and ".cc(" not in message, message
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_writer=out, vocab_size=100, minloglevel=2)
    (tmp_path / "pad-minus-one.model").write_bytes(out.getvalue())      # sentencepiece's default: no padding id
    with pytest.raises(ValueError, match=r"pad-minus-one.model pads with id -1; this platform pads with 0"):
        SentencePieceTokenizer.load(tmp_path / "pad-minus-one.model")
    write_wikitext(tmp_path)
    with pytest.raises(DataNotFoundError, match="no SentencePiece model file at .*nowhere.model"):
        get_dataset("mlm-wikitext103", data_dir=str(tmp_path), vocab=str(missing))
    assert capfd.readouterr().err == ""     # nothing of sentencepiece's C++ logging reached the terminal


def test_an_impossible_vocab_size_is_one_line(tmp_path):
    for size, words in ((5000, r"vocab_size=5000 is too large for the test vocabulary \(600 texts, \d+ characters\): "
                                r"it supports at most \d+ pieces; pass a smaller vocab_size"),
                        (12, r"vocab_size=12 is too small for the test vocabulary .*: it needs at least \d+ pieces")):
        with pytest.raises(ValueError, match=words) as err:
            subword.sentencepiece_vocab("test", TEXTS, data_dir=tmp_path, vocab_size=size)
        assert "\n" not in str(err.value) and ".cc(" not in str(err.value)
    for bad, words in ((0, "vocab_size must be a positive int"), ("32k", "vocab_size must be a positive int")):
        with pytest.raises(ValueError, match=words):
            subword.sentencepiece_vocab("test", TEXTS, data_dir=tmp_path, vocab_size=bad)
    with pytest.raises(ValueError, match="unknown vocab_model_type 'wordpiece'; valid: unigram, bpe"):
        subword.sentencepiece_vocab("test", TEXTS, data_dir=tmp_path, model_type="wordpiece")
    with pytest.raises(ValueError, match="vocab must be one of bytes, sentencepiece or a .model file's path"):
        get_dataset("mlm-wikitext103", data_dir=str(write_wikitext(tmp_path)), vocab=3)
    assert not list((tmp_path / "vocabularies").glob("*.model"))          # nothing half-made was cached
    # the default size (32k) on a text too small for it: as many pieces as it supports, said in a warning
    with pytest.warns(UserWarning, match=r"supports at most \d+ pieces, fewer than the default 32000"):
        tok = subword.sentencepiece_vocab("test", TEXTS[:100], data_dir=tmp_path)
    assert VOCAB < tok.vocab_size < 32_000


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------
def test_the_cache_is_reused_and_invalidated_when_its_inputs_change(tmp_path, trained_calls):
    def build(texts=TEXTS, size=VOCAB, model_type="unigram"):
        return subword.sentencepiece_vocab("fam", texts, data_dir=tmp_path, vocab_size=size, model_type=model_type)

    first = build()
    cached = sorted((tmp_path / "vocabularies").glob("*.model"))
    assert trained_calls == ["fam"] and len(cached) == 1
    path, mtime = cached[0], cached[0].stat().st_mtime_ns
    assert path.name.startswith(f"fam-unigram-{VOCAB}-") and path.with_suffix(".json").is_file()
    assert build() == first and trained_calls == ["fam"] and path.stat().st_mtime_ns == mtime   # reused
    assert build(TEXTS[:-1] + [TEXTS[-1] + " changed"]) != first and len(trained_calls) == 2   # the text changed
    build(size=VOCAB + 8)                                                                      # the size changed
    build(model_type="bpe")                                                                    # the model type
    assert len(trained_calls) == 4 and len(list(path.parent.glob("*.model"))) == 4
    assert build() == first and len(trained_calls) == 4 and path.stat().st_mtime_ns == mtime
    # a corrupt or cut-short cache file is never used: trained again, written whole
    for data in (path.read_bytes()[: path.stat().st_size // 2], b""):
        path.write_bytes(data)
        with pytest.warns(UserWarning, match="is not usable"):
            assert build() == first
        assert SentencePieceTokenizer.load(path) == first
    assert len(trained_calls) == 6
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]     # no temporary files left


def test_a_loader_trains_its_family_vocabulary_once(tmp_path, trained_calls):
    """mlm-wikitext103 through the registry: the first build trains and encodes, the second reads
    both caches; a changed train file trains anew."""
    write_wikitext(tmp_path)
    options = dict(data_dir=str(tmp_path), vocab="sentencepiece", vocab_size=VOCAB, max_len=LEN)
    first = get_dataset("mlm-wikitext103", **options)
    files = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "vocabularies").iterdir()}
    again = get_dataset("mlm-wikitext103", **options)
    assert trained_calls == ["wikitext103"]
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "vocabularies").iterdir()} == files
    np.testing.assert_array_equal(first.train.arrays["ids"], again.train.arrays["ids"])
    write_wikitext(tmp_path, TEXTS[::-1])
    get_dataset("mlm-wikitext103", **options)
    assert trained_calls == ["wikitext103", "wikitext103"]


# ---------------------------------------------------------------------------------------------
# The loaders on subwords
# ---------------------------------------------------------------------------------------------
N_PAIRS = 48
NMT_VOCAB = 80       # what 48 sentence pairs support
WORDS = {"de": ("Der Zug fährt um {} Uhr ab.", "de"), "fr": ("Le train part à {} heures.", "fr")}


def _pairs(target: str, split: str) -> list[dict]:
    """WMT'14-shaped examples: English and German/French sentences around number words (the eval
    splits: the same sentences in another order, so every character is one the vocabulary saw)."""
    template, lang = WORDS[target]
    numbers = range(N_PAIRS) if str(split) == "train" else range(N_PAIRS - 1, -1, -1)
    return [{"en": f"The train leaves at {num2words(n)} o'clock.", target: template.format(num2words(n, lang=lang))}
            for n in numbers]


@pytest.fixture
def wmt_mock():
    def as_data_source(builder, split=None, *args, **kwargs):
        return _pairs(builder.builder_config.name.split("-")[0], split)

    with tfds.testing.mock_data(num_examples=N_PAIRS, as_data_source_fn=as_data_source):
        yield


@pytest.mark.parametrize("target", ["de", "fr"])
def test_wmt14_on_a_shared_subword_vocabulary(wmt_mock, tmp_path, target, check_batch):
    ds = get_dataset(f"nmt-wmt14-en{target}", data_dir=str(tmp_path), vocab="sentencepiece", vocab_size=NMT_VOCAB, max_len=64)
    info = ds.info
    assert (info.vocab_size, info.target_vocab_size, info.bos_id, info.eos_id, info.pad_id) == (NMT_VOCAB, NMT_VOCAB, 1, 2, 0)
    assert [p.name.split("-unigram")[0] for p in (tmp_path / "vocabularies").glob("*.model")] == [f"wmt14-en{target}"]
    batch = next(ds.eval_batches(4))
    check_batch(batch, info, 4)
    for i in range(4):   # detokenized: the raw sentences back
        example = _pairs(target, "validation")[i]
        assert ds.decode(batch["inputs"][i]) == example["en"]
        assert ds.decode(batch["targets"][i][1:]) == example[target]
    assert int(batch["mask"][0].sum()) < len(_pairs(target, "validation")[0]["en"].encode())   # tokens, not bytes
    # the byte level stays the loaders' default
    assert get_dataset(f"nmt-wmt14-en{target}", data_dir=str(tmp_path)).info.vocab_size == BYTES.vocab_size


def test_glue_reuses_the_mlm_vocabulary(tmp_path, check_batch):
    """glue-* on sentencepiece is WikiText-103's vocabulary (MLM pre-training's): the same model
    file and ids, so --init-from keeps the embedding; without WikiText-103 it says what to do."""
    with tfds.testing.mock_data(num_examples=12):
        with pytest.raises(DataNotFoundError, match=r"glue-mrpc with vocab='sentencepiece' uses WikiText-103's "
                                                    r"vocabulary .* WikiText-103 not found.* Or pass vocab="):
            get_dataset("glue-mrpc", data_dir=str(tmp_path), vocab="sentencepiece")
        write_wikitext(tmp_path)
        options = dict(data_dir=str(tmp_path), vocab="sentencepiece", vocab_size=VOCAB)
        glue = get_dataset("glue-mrpc", **options)
        mlm = get_dataset("mlm-wikitext103", **options, max_len=LEN)
        assert len(list((tmp_path / "vocabularies").glob("*.model"))) == 1
        assert glue.info.vocab_size == mlm.info.vocab_size == VOCAB and glue.info.max_len == 128
        assert (glue.info.cls_id, glue.info.sep_id, glue.info.mask_id) == (5, 6, 4) == (5, 6, mlm.info.mask_id)
        batch = next(glue.eval_batches(4))
        check_batch(batch, glue.info, 4)
        ex = glue.eval.source[0]
        tok = SentencePieceTokenizer.load(next((tmp_path / "vocabularies").glob("*.model")))
        ids = batch["inputs"][0][batch["mask"][0]].tolist()
        a, b = tok.encode(ex["sentence1"]).tolist(), tok.encode(ex["sentence2"]).tolist()
        assert ids == [5, *a, 6, *b, 6]
        # MLM: masked windows of subword tokens, replacements drawn from ordinary pieces
        mb = mlm.train_batch(0, 8)
        check_batch(mb, mlm.info, 8)
        replaced = (mb["weights"] > 0) & (mb["inputs"] != mb["targets"]) & (mb["inputs"] != 4)
        assert (mb["inputs"][replaced] >= tok.first_piece_id).all() and (mb["targets"] >= tok.first_piece_id).all()
        # every task reads its fields on that vocabulary (two of them also train 2 steps below)
        for task in GLUE_TASKS:
            ds, as_bytes = get_dataset(f"glue-{task}", **options), get_dataset(f"glue-{task}", data_dir=str(tmp_path))
            assert ds.info.vocab_size == VOCAB and ds.describe()["digest"] != as_bytes.describe()["digest"]
            check_batch(next(ds.train_batches(4)), ds.info, 4)


# ---------------------------------------------------------------------------------------------
# Each paper text benchmark: 2 steps through its real loader on subwords, at a tiny model size
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def paper_data(tmp_path_factory) -> str:
    """WikiText-103 files (MLM's corpus and GLUE's vocabulary) under one data dir for the module."""
    return str(write_wikitext(tmp_path_factory.mktemp("paper-data")))


@pytest.mark.parametrize("name", ["nmt-wmt14-ende", "nmt-wmt14-enfr", "nmt-ablation-ende", "mlm-wikitext103",
                                  "glue-cola", "glue-mnli"])
def test_paper_text_benchmark_trains_two_steps_on_subwords(name, paper_data, wmt_mock):
    config = get_config(name)
    assert config.dataset_options["vocab"] == "sentencepiece" and config.max_len == config.dataset_options["max_len"]
    vocab = NMT_VOCAB if config.task == "translation" else VOCAB
    tiny = dict(TINY, steps=2, batch_size=4, eval_batches=1, bleu_batches=1, beam_size=1, max_len=LEN,
                dataset_options={"max_len": LEN, "vocab_size": vocab}, data_dir=paper_data, checkpoint_every=0)
    if config.task == "translation":
        tiny["model"] = {**tiny["model"], "num_decoder_layers": 1}
    if name.startswith("glue-"):
        with tfds.testing.mock_data(num_examples=12):   # GLUE's own mock text, the WikiText-103 vocabulary
            result = run(get_config(name, **tiny), progress=False)
    else:
        result = run(get_config(name, **tiny), progress=False)
    assert result["status"] == "ok" and result["steps"] == 2, result["status"]
    final = result["final_metrics"]
    assert all(math.isfinite(final[m]) for m in config.metrics), final
    family = {"nmt-wmt14-enfr": "wmt14-enfr"}.get(name, "wmt14-ende" if name.startswith("nmt") else "wikitext103")
    assert list(Path(paper_data, "vocabularies").glob(f"{family}-unigram-{vocab}-*.model"))
    if config.task == "translation":
        assert config.bleu_tokenize == "13a" and 0.0 <= final["bleu"] <= 100.0


def test_byte_level_stays_a_config_option(paper_data):
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # bytes: no vocabulary is trained
        ds = get_dataset("mlm-wikitext103", data_dir=paper_data,
                         **get_config("mlm-wikitext103", dataset_options={"vocab": "bytes"}).dataset_options)
    assert ds.info.vocab_size == BYTES.vocab_size and ds.info.max_len == 512 and "bytes" in ds.train.arrays


# ---------------------------------------------------------------------------------------------
# BLEU on detokenized text
# ---------------------------------------------------------------------------------------------
def test_bleu_is_sacrebleus_on_detokenized_text(tmp_path):
    tok = subword.sentencepiece_vocab("test", TEXTS, data_dir=tmp_path, vocab_size=VOCAB)
    refs = TEXTS[100:120]
    detokenized = [tok.decode(tok.encode(r)) for r in refs]
    assert bleu(detokenized, refs, tokenize="13a") == pytest.approx(100.0)
    hyps = ["The cat sat on the mat.", "It returns the value of the attribute, or None."]
    pair_refs = ["The cat is sitting on the mat.", "Return the value of the attribute, or None if it is absent."]
    expected = sacrebleu.corpus_bleu(hyps, [pair_refs], tokenize="13a").score
    assert bleu(hyps, pair_refs) == pytest.approx(expected, abs=1e-9) and 0 < expected < 100
    assert bleu([tok.decode(tok.encode(h)) for h in hyps], pair_refs) == pytest.approx(expected, abs=1e-9)
    # the small tasks keep their character BLEU
    assert get_config("nmt-small").bleu_tokenize == get_config("nmt-list-small").bleu_tokenize == "char"
    assert bleu(["achtzig"], ["achtzehn"], tokenize="char") == pytest.approx(
        sacrebleu.corpus_bleu(["achtzig"], [["achtzehn"]], tokenize="char").score)
