"""Build mappings/data/world-names.txt.gz: the given names and surnames of every faker locale, one word a line.

The word list of the `world-names` detector (`text_deid/detectors/world_names.py`). Source: `faker` 40.54.0's
person providers (MIT licence), every locale it ships: their first-name and last-name lists (male, female,
non-binary, unisex and the plain ones), romanized lists where a locale has them, and Cyrillic names also
in Latin letters. Multi-word names are split
into words; a word is kept when it has three letters or more, only letters (an inner apostrophe allowed), and
is no common English word (`wordfreq` Zipf frequency below 3.5, as `english_words.py` counts words): "rose",
"will" and "john" stay to the gazetteer, which asks for evidence. Lower case, sorted, gzip with a fixed
timestamp: the same inputs give the same bytes.

    pip install -e '.[names-build]'
    python scripts/build_world_names.py
"""
from __future__ import annotations

import gzip
import importlib
import io
import pkgutil
import re
from pathlib import Path

import faker
import faker.providers.person as person
from wordfreq import zipf_frequency

OUT = Path(__file__).resolve().parent.parent / "mappings" / "data" / "world-names.txt.gz"
ENGLISH_ZIPF = 3.5  # text_deid/detectors/english_words.py
MIN_LETTERS = 3
WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
LISTS = re.compile(r"^(?:(?:first|last)_names(?:_(?:male|female|nonbinary|unisex))?|(?:male|female|unisex)_"
                   r"(?:first|last)_names|first_romanized_names|last_romanized_names|"
                   r"first_names_(?:male|female)_romanized)$")


# Cyrillic names as English texts spell them (BGN/PCGN, simplified): "Булгаков" -> "bulgakov", "Ефремова" ->
# "yefremova" and "efremova", "Хаджиев" -> "khadzhiyev" and "khadzhiev".
CYRILLIC = dict(zip("абвгдзиклмнопрстуфыэ", "abvgdziklmnoprstufye")) | {
    "ж": "zh", "х": "kh", "ц": "ts", "ч": "ch", "ш": "sh", "щ": "shch", "ю": "yu", "я": "ya", "ё": "yo", "й": "y",
    "ь": "", "ъ": "", "і": "i", "ї": "yi", "є": "ye", "ґ": "g", "ў": "w"}
VOWELS = set("аеёиоуыэюяіїєь")


def romanized(word: str) -> set[str]:
    """A Cyrillic word's Latin spellings (two, differing in how "е" is written after a vowel or at the start)."""
    if not any("\u0400" <= c <= "\u04ff" for c in word):
        return set()
    plain, yotated = [], []
    for i, c in enumerate(word):
        if c == "е":
            plain.append("e")
            yotated.append("ye" if i == 0 or word[i - 1] in VOWELS else "e")
        elif c in CYRILLIC:
            plain.append(CYRILLIC[c])
            yotated.append(CYRILLIC[c])
        else:
            return set()
    out = {"".join(plain), "".join(yotated)}
    return {w for w in out if w.isascii()}


def _words(values) -> set[str]:
    out = set()
    for value in values:
        if isinstance(value, str):
            for m in WORD.finditer(value):
                word = m.group().lower()
                out.add(word)
                out |= romanized(word)
    return out


def names() -> tuple[set[str], list[str]]:
    """Every name word of every locale, and the locales read."""
    words: set[str] = set()
    locales = sorted(m.name for m in pkgutil.iter_modules(person.__path__))
    for locale in locales:
        provider = importlib.import_module(f"{person.__name__}.{locale}").Provider
        for attr in dir(provider):
            if LISTS.match(attr):
                values = getattr(provider, attr)
                if not isinstance(values, (dict, list, tuple)):
                    continue  # a property computed from the lists above
                words |= _words(values.keys() if isinstance(values, dict) else values)
    return words, locales


def kept(word: str) -> bool:
    letters = sum(c.isalpha() for c in word)
    return letters >= MIN_LETTERS and zipf_frequency(word, "en") < ENGLISH_ZIPF


def main() -> None:
    words, locales = names()
    chosen = sorted(w for w in words if kept(w))
    body = io.BytesIO()
    with gzip.GzipFile(fileobj=body, mode="wb", mtime=0) as gz:
        header = (f"# given names and surnames of faker {faker.VERSION}'s {len(locales)} person locales (MIT), "
                  f"common English words left out; scripts/build_world_names.py\n")
        gz.write(header.encode("utf-8"))
        gz.write("".join(w + "\n" for w in chosen).encode("utf-8"))
    OUT.write_bytes(body.getvalue())
    print(f"{len(chosen)} words from {len(locales)} locales ({len(words)} before filtering) -> {OUT}")


if __name__ == "__main__":
    main()
