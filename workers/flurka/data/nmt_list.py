"""nmt-list-small: translate the one item written in capitals out of an English list, character level.

A source is a list of English numbers (0–999, spelled by ``num2words``) and CLDR names
(territories, months, weekdays, from babel), 96–126 characters, items separated by "; ", every
item in lower case but one, written in capitals; its target is that item in German:

    "NORWAY; three hundred and ninety-one; four hundred and eighty-six; ninety-two; laos;
     malawi; north macedonia; nauru"  ->  "Norwegen"          (the fourth training example)

So a model must find the marked item in a sequence about five times its length and translate
it: word identity is local (the characters of one item), and the rest of the list is context
that an attention layer has to see past. With d_k = 16 compressed rows over the 128 positions,
a row pools 8 characters. Every item of the pool occurs in training, so the eval split (examples
of the same distribution, disjoint sources) is learnable, unlike held-out words; a trivial output
scores little (:func:`trivial_outputs`).

Examples are drawn once from a fixed generator (``GENERATOR_SEED``): the data is the same on
every machine, whatever the run's seed (which orders the training batches).
"""

from __future__ import annotations

import collections
import functools

import numpy as np
from babel import Locale
from num2words import num2words

from flurka.data.core import ArrayExamples, Dataset, DatasetInfo, encode_translation, stack_examples
from flurka.data.tokenizers import CharTokenizer

GENERATOR_SEED = 20261206
NUM_TRAIN, NUM_EVAL = 20_000, 1_024
MIN_CHARS, MAX_CHARS = 96, 126          # a source's length (the encoder holds 128 with EOS)
MAX_NUMBER = 999
NAME_SHARE = 0.5                        # an item is a CLDR name with this probability, else a number
MAX_NAME = 20                           # longest name kept (characters, either language)
TERRITORIES = 60                        # territories in the pool (a fixed draw): each is a target ~70 times
SEPARATOR = "; "
SOURCE_LEN, TARGET_LEN = 128, 32      # the longest target is 29 characters: 32 holds it with BOS and EOS


@functools.lru_cache(maxsize=1)
def item_pool() -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """(numbers, names): (English, German) pairs. Numbers 0..MAX_NUMBER as words; the names of
    months, weekdays and TERRITORIES territories (a fixed draw among those with letter codes), each
    fitting MAX_NAME and holding no separator: few enough that 600 training steps see every name
    as a target often, so a wrong name is a model's failure to find or read it, not to memorise it."""
    numbers = tuple((num2words(n, lang="en"), num2words(n, lang="de")) for n in range(MAX_NUMBER + 1))
    en, de = Locale("en"), Locale("de")
    def fits(pair):
        return max(map(len, pair)) <= MAX_NAME and not any(c in pair[0] + pair[1] for c in ";,")

    codes = [k for k in sorted(set(en.territories) & set(de.territories))
             if not k.isdigit() and fits((en.territories[k], de.territories[k]))]
    drawn = np.random.default_rng(GENERATOR_SEED).choice(len(codes), TERRITORIES, replace=False)
    names = [(en.territories[codes[i]], de.territories[codes[i]]) for i in sorted(drawn)]
    for attr, keys in (("months", range(1, 13)), ("days", range(7))):
        a, b = getattr(en, attr)["format"]["wide"], getattr(de, attr)["format"]["wide"]
        names += [(a[k], b[k]) for k in keys]
    return numbers, tuple(p for p in dict.fromkeys(names) if fits(p))


def draw_example(rng: np.random.Generator, numbers, names) -> tuple[str, str] | None:
    """One (source, target), or None where the drawn list is too short (the caller draws again):
    items appended while the joined list fits MAX_CHARS; one of them, uniformly, in capitals."""
    items: list[tuple[str, str]] = []
    length = -len(SEPARATOR)
    while True:
        pool = names if rng.random() < NAME_SHARE else numbers
        item = pool[int(rng.integers(len(pool)))]
        if length + len(SEPARATOR) + len(item[0]) > MAX_CHARS:
            break
        items.append(item)
        length += len(SEPARATOR) + len(item[0])
    if len(items) < 2 or length < MIN_CHARS:
        return None
    marked = int(rng.integers(len(items)))
    source = SEPARATOR.join(en.upper() if i == marked else en.lower() for i, (en, _) in enumerate(items))
    return source, items[marked][1]


@functools.lru_cache(maxsize=1)
def examples() -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """(train, eval) pairs: NUM_TRAIN + NUM_EVAL distinct sources from the fixed generator, the
    last NUM_EVAL drawn being the eval split."""
    numbers, names = item_pool()
    rng = np.random.default_rng(GENERATOR_SEED)
    seen: dict[str, str] = {}
    while len(seen) < NUM_TRAIN + NUM_EVAL:
        pair = draw_example(rng, numbers, names)
        if pair is not None and pair[0] not in seen:
            seen[pair[0]] = pair[1]
    pairs = tuple(seen.items())
    return pairs[:NUM_TRAIN], pairs[NUM_TRAIN:]


def trivial_outputs(train, eval) -> dict[str, list[str]]:
    """What an output that reads nothing, or reads without translating, scores: per kind, one
    hypothesis per eval example — empty; the source copied; the most frequent training target;
    a random training target (fixed draw)."""
    most = collections.Counter(t for _, t in train).most_common(1)[0][0]
    pick = np.random.default_rng(0).integers(len(train), size=len(eval))
    return {"empty": [""] * len(eval), "copy of the source": [s for s, _ in eval],
            "most frequent target": [most] * len(eval),
            "random training target": [train[int(i)][1] for i in pick]}


def build(*, seed: int = 0, data_dir=None) -> Dataset:
    del data_dir  # generated from num2words and babel
    train, eval = examples()
    tok = CharTokenizer.build(s for pairs in (train, eval) for p in pairs for s in p)
    info = DatasetInfo(name="nmt-list-small", task="translation", vocab_size=tok.vocab_size,
                       max_len=SOURCE_LEN, num_classes=0, target_vocab_size=tok.vocab_size,
                       target_max_len=TARGET_LEN, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)

    def encode(pairs):
        return ArrayExamples(stack_examples([
            encode_translation(tok.encode(s), tok.encode(t), max_len=SOURCE_LEN, target_max_len=TARGET_LEN,
                               bos_id=tok.bos_id, eos_id=tok.eos_id) for s, t in pairs]))

    return Dataset(info, encode(train), encode(eval), seed=seed, decode=tok.decode)
