"""nmt-small: English -> German number words and CLDR names, character level.

Real parallel text that ships with packages: ``num2words`` spells 0..9999 in
both languages (21 -> "twenty-one" / "einundzwanzig"), and babel's CLDR data
names territories, languages, scripts, currencies, months and weekdays in both.
10% of the pairs are held out by a fixed permutation.
"""

from __future__ import annotations

import functools
import json
import os
from importlib.metadata import version
from pathlib import Path

from babel import Locale
from num2words import num2words

from flurka.data.core import ArrayExamples, Dataset, DatasetInfo, encode_translation, split_indices, stack_examples
from flurka.data.tokenizers import CharTokenizer

EVAL_FRACTION = 0.1


def number_pairs(max_number: int = 9999) -> list[tuple[str, str]]:
    return [(num2words(n, lang="en"), num2words(n, lang="de")) for n in range(max_number + 1)]


def cldr_pairs() -> list[tuple[str, str]]:
    """(English, German) display names sharing a CLDR code, sorted by category and code."""
    en, de = Locale("en"), Locale("de")
    pairs = []
    for attr in ("territories", "languages", "scripts", "currencies"):
        a, b = getattr(en, attr), getattr(de, attr)
        pairs += [(a[k], b[k]) for k in sorted(set(a) & set(b))]
    for attr in ("months", "days"):
        a, b = getattr(en, attr)["format"]["wide"], getattr(de, attr)["format"]["wide"]
        pairs += [(a[k], b[k]) for k in sorted(set(a) & set(b))]
    return pairs


@functools.lru_cache(maxsize=2)
def load_pairs(max_number: int = 9999, max_chars: int = 62) -> tuple[tuple[str, str], ...]:
    """All pairs whose two sides fit in ``max_chars`` characters, de-duplicated in order.

    num2words takes seconds for 10k numbers, so the pairs are cached on disk per
    package versions (``$FLURKA_CACHE_DIR``, else ``~/.cache/flurka``).
    """
    cache = _cache_dir() / f"nmt_small-{version('num2words')}-{version('babel')}-{max_number}.json"
    try:
        pairs = [tuple(p) for p in json.loads(cache.read_text(encoding="utf-8"))]
    except (OSError, ValueError):
        pairs = number_pairs(max_number) + cldr_pairs()
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(pairs, ensure_ascii=False), encoding="utf-8")
            tmp.replace(cache)
        except OSError:
            pass  # read-only home: recompute next time
    return tuple(dict.fromkeys(p for p in pairs if max(map(len, p)) <= max_chars))


def _cache_dir() -> Path:
    return Path(os.environ.get("FLURKA_CACHE_DIR") or Path.home() / ".cache" / "flurka")


def build(*, seed: int = 0, data_dir=None, max_number: int = 9999, max_len: int = 64) -> Dataset:
    del data_dir  # ships with num2words and babel
    pairs = load_pairs(max_number, max_len - 2)
    tok = CharTokenizer.build(s for p in pairs for s in p)
    info = DatasetInfo(
        name="nmt-small",
        task="translation",
        vocab_size=tok.vocab_size,
        max_len=max_len,
        num_classes=0,
        target_vocab_size=tok.vocab_size,
        target_max_len=max_len,
        pad_id=tok.pad_id,
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
    )

    def encode(idx):
        return ArrayExamples(
            stack_examples(
                [
                    encode_translation(
                        tok.encode(pairs[i][0]),
                        tok.encode(pairs[i][1]),
                        max_len=max_len,
                        target_max_len=max_len,
                        bos_id=tok.bos_id,
                        eos_id=tok.eos_id,
                    )
                    for i in idx
                ]
            )
        )

    train, eval = split_indices(len(pairs), EVAL_FRACTION, seed=0)
    return Dataset(info, encode(train), encode(eval), seed=seed, decode=tok.decode)
