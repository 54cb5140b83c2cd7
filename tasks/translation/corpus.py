"""Tiny English->German parallel corpus built from packaged resources, and sentence stacking.

The vocabulary comes from packages, not from us: numbers from num2words (German writes the
units before the tens, ``einundzwanzig``, and compounds whole numbers into one word), dates
from Babel's CLDR data (``March 17, 2021`` vs ``17. März 2021``), country, language and
currency names and weekdays from Babel's locale tables. A handful of sentence frames glue
them together; each frame was chosen because German reorders it (verb-second after a
fronted adverbial, verb-final subordinate clauses, participle at the end), so that copying
or word-by-word mapping is not enough and attention must find *where* each piece goes.

Everything is drawn from seeded RNGs, so the corpus is identical on every machine with
the same package versions; it is cached as plain text in the paper layout. Validation and
test hold only sentences that no earlier split has (``build_unseen_pairs``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pe_bench.harness.data import package_version

Pair = tuple[str, str]


@dataclass(frozen=True)
class Lexicon:
    """Aligned English/German entries from Babel (only entries both locales name)."""

    countries: list[Pair]
    languages: list[Pair]
    currencies: list[Pair]
    weekdays: list[Pair]


@cache
def lexicon(tgt: str = "de") -> Lexicon:
    from babel import Locale

    en, de = Locale("en"), Locale(tgt)

    def aligned(a: dict, b: dict, keep: Callable[[str], bool]) -> list[Pair]:
        # Single-token-ish names keep sentences short; sorted keys keep the order stable.
        keys = sorted(k for k in a if k in b and keep(str(k)))
        return [(a[k], b[k]) for k in keys if len(a[k].split()) <= 2 and len(b[k].split()) <= 2]

    # Two-letter territory codes are countries (three digits are regions like "Europe").
    countries = aligned(en.territories, de.territories, lambda k: len(k) == 2 and k.isalpha())
    # Plain two-letter language codes, not variants such as "en_GB".
    languages = aligned(en.languages, de.languages, lambda k: len(k) == 2)
    currencies = aligned(en.currencies, de.currencies, lambda k: True)
    fmt = "wide"
    weekdays = [(en.days["format"][fmt][i], de.days["format"][fmt][i]) for i in range(7)]
    return Lexicon(countries, languages, currencies, weekdays)


def number(value: int, tgt: str = "de") -> Pair:
    from num2words import num2words

    return num2words(value, lang="en"), num2words(value, lang=tgt)


def date(day: datetime.date, tgt: str = "de") -> Pair:
    from babel.dates import format_date

    return format_date(day, "long", locale="en"), format_date(day, "long", locale=tgt)


def _draw(rng: random.Random, lex: Lexicon, tgt: str = "de") -> Pair:
    """One sentence pair from a randomly chosen frame (English, target language)."""
    country = rng.choice(lex.countries)
    language = rng.choice(lex.languages)
    currency = rng.choice(lex.currencies)
    weekday = rng.choice(lex.weekdays)
    n = number(rng.randint(2, 999), tgt)
    day = date(datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randrange(365 * 30)), tgt)
    frame = rng.randrange(7)
    if tgt == "fr":
        return _french(frame, country, language, currency, weekday, n, day)
    if frame == 0:  # fronted adverbial -> verb second
        return f"On {weekday[0]} we fly to {country[0]}.", f"Am {weekday[1]} fliegen wir nach {country[1]}."
    if frame == 1:  # subordinate clause -> verb final; the number gives it unseen sentences to test
        return (
            f"I know that {n[0]} people speak {language[0]}.",
            f"Ich weiß, dass {n[1]} Menschen {language[1]} sprechen.",
        )
    if frame == 2:
        return f"The price is {n[0]} {currency[0]}.", f"Der Preis beträgt {n[1]} {currency[1]}."
    if frame == 3:  # separable verb: "findet ... statt"
        return f"The meeting takes place on {day[0]}.", f"Das Treffen findet am {day[1]} statt."
    if frame == 4:  # fronted locative -> subject after the verb
        return f"{n[0].capitalize()} people live in {country[0]}.", f"In {country[1]} leben {n[1]} Menschen."
    if frame == 5:  # perfect tense -> participle at the end
        return (
            f"Yesterday I saw {n[0]} birds in {country[0]}.",
            f"Gestern habe ich in {country[1]} {n[1]} Vögel gesehen.",
        )
    return (
        f"They paid {n[0]} {currency[0]} on {day[0]}.",
        f"Sie haben am {day[1]} {n[1]} {currency[1]} bezahlt.",
    )


def _french(frame: int, country: Pair, language: Pair, currency: Pair, weekday: Pair, n: Pair, day: Pair) -> Pair:
    """The same frames in French: closer to English word order, but the noun-adjective
    order of Babel's names ("dollar américain") and the date order still differ."""
    if frame == 0:
        return f"On {weekday[0]} we fly to {country[0]}.", f"Le {weekday[1]}, nous partons pour {country[1]}."
    if frame == 1:
        return f"I know that {n[0]} people speak {language[0]}.", f"Je sais que {n[1]} personnes parlent {language[1]}."
    if frame == 2:
        return f"The price is {n[0]} {currency[0]}.", f"Le prix est de {n[1]} {currency[1]}."
    if frame == 3:
        return f"The meeting takes place on {day[0]}.", f"La réunion a lieu le {day[1]}."
    if frame == 4:
        return (
            f"{n[0].capitalize()} people live in {country[0]}.",
            f"{n[1].capitalize()} personnes vivent ici : {country[1]}.",
        )
    if frame == 5:
        return f"Yesterday I saw {n[0]} birds in {country[0]}.", f"Hier, j'ai vu {n[1]} oiseaux ici : {country[1]}."
    return f"They paid {n[0]} {currency[0]} on {day[0]}.", f"Le {day[1]}, ils ont payé {n[1]} {currency[1]}."


def build_pairs(count: int, seed: int, tgt: str = "de") -> list[Pair]:
    """``count`` English->``tgt`` pairs ("de" or "fr") from one seeded RNG."""
    rng, lex = random.Random(seed), _lexicon_of(tgt)
    return [_draw(rng, lex, tgt) for _ in range(count)]


#: draws allowed per requested unseen pair before giving up: the smallest frames run out of
#: new sentences, the others have thousands to millions, so one in a few draws is kept
UNSEEN_DRAWS_PER_PAIR = 100


def build_unseen_pairs(
    count: int, seed: int, seen: set[str], tgt: str = "de", draws_per_pair: int = UNSEEN_DRAWS_PER_PAIR
) -> list[Pair]:
    """``count`` pairs none of whose sentences (either side) is in ``seen`` or repeats within them.

    Evaluation splits are drawn this way: independent draws from the same frames repeat
    training sentences wherever a frame has few (stop 64 found 51 of 200 test pairs copied
    from training, 37 of them "I know that she speaks X", one sentence per language, a frame
    that has had a number since), and a copied pair measures recall, which every encoding
    manages. A frame whose every sentence was seen in training would not appear in evaluation.
    ``seen`` is extended with the pairs drawn, so a later split is disjoint from this one too.
    """
    rng, lex = random.Random(seed), _lexicon_of(tgt)
    pairs: list[Pair] = []
    for _ in range(count * draws_per_pair):
        if len(pairs) == count:
            break
        src, ref = _draw(rng, lex, tgt)
        if src not in seen and ref not in seen:
            seen.update((src, ref))
            pairs.append((src, ref))
    if len(pairs) < count:
        raise ValueError(
            f"the tiny en-{tgt} corpus gave {len(pairs)} of {count} evaluation pairs unseen in the earlier splits "
            f"in {count * draws_per_pair} draws: ask for smaller splits (data.train_size, data.valid_size, "
            "data.test_size)"
        )
    return pairs


def _lexicon_of(tgt: str) -> Lexicon:
    if tgt not in ("de", "fr"):
        raise ValueError(f"the tiny corpus has English->German and English->French frames, not {tgt!r}")
    return lexicon(tgt)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def stack_pairs(pairs: Sequence[Pair], min_target_words: int) -> list[Pair]:
    """Concatenate consecutive pairs until each target has ``min_target_words`` words.

    As CAPE Section 5.3 builds its long test sets: the full stop at each junction becomes
    a comma and the next sentence's first letter is lower-cased, so a stacked pair reads
    like one long sentence. A short remainder at the end is dropped. (The paper counts
    subword tokens; words are a tokenizer-independent lower bound.)
    """
    stacked: list[Pair] = []
    src: list[str] = []
    tgt: list[str] = []
    words = 0
    for en, de in pairs:
        if src:
            src[-1], tgt[-1] = src[-1].rstrip(".") + ",", tgt[-1].rstrip(".") + ","
            en, de = _lower_first(en), _lower_first(de)
        src.append(en)
        tgt.append(de)
        words += len(de.split())
        if words >= min_target_words:
            stacked.append((" ".join(src), " ".join(tgt)))
            src, tgt, words = [], [], 0
    return stacked


def write_split(folder: Path, split: str, pairs: Sequence[Pair], src_lang: str, tgt_lang: str) -> None:
    for index, lang in ((0, src_lang), (1, tgt_lang)):
        path = folder / f"{split}.{lang}"
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(p[index] + "\n" for p in pairs), encoding="utf-8")
        tmp.replace(path)  # atomic: a concurrent run never reads half a file


def tiny_corpus(cache_root: Path, sizes: tuple[int, int, int], tgt: str = "de") -> Path:
    """Build (once) and return a folder with train/valid/test.{en,tgt} for the given sizes."""
    import babel

    # The key changes with the sizes and the resource versions, never silently reused.
    versions = {"babel": babel.__version__, "num2words": package_version("num2words")}
    # v 2: evaluation pairs unseen in training (build_unseen_pairs); v 1 drew them independently.
    meta = {"sizes": list(sizes), **versions, "v": 2, "tgt": tgt}
    key = hashlib.sha1(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:12]
    folder = cache_root / "translation" / f"tiny-en-{tgt}-{key}"
    if (folder / "meta.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    # Separate seeds per split; validation and test hold only sentences no earlier split has.
    train_size, valid_size, test_size = sizes
    train = build_pairs(train_size, 11, tgt)
    seen = {sentence for pair in train for sentence in pair}
    valid = build_unseen_pairs(valid_size, 12, seen, tgt)
    test = build_unseen_pairs(test_size, 13, seen, tgt)
    for split, pairs in (("train", train), ("valid", valid), ("test", test)):
        write_split(folder, split, pairs, "en", tgt)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder
