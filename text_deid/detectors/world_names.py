"""World names: given names and surnames of many countries (`mappings/data/world-names.txt.gz`, from faker's
locales), found where the US lists of the gazetteer and the NER's training notes never looked.

A listed word is a NAME when it is no English, clinical or drug word and no abbreviation (`unknown_words`'
`is_known_word`) and no stop word, and
* it is shaped like a proper noun ("Okonkwo", "Søndergaard", "NGUYỄN" outside an all-caps text), or
* it stands in lower case after a name cue ("my neighbour okonkwo", "dear siobhán") or beside another listed
  word ("maría gonzález").
After a place cue ("born in", "lives in") it is a GEOGRAPHIC_LOCATION (many towns bear a family's name).
A capitalized word alone gets a lower confidence than one with context, for the review queue.
"""
from __future__ import annotations

import gzip
from functools import lru_cache
from importlib import resources
from typing import Sequence

import regex

from text_deid import budget
from text_deid.detectors.unknown_words import (
    _NAME_CUE, _NAME_CUE_AFTER, _POSSESSIVE, _STRONG_NAME_CUE, _STRONG_PLACE_CUE, _WORD, _proper_shape,
    is_known_word, is_upper_text,
)
from text_deid.spans import KnownIdentifier, Span

NAME, PLACE = "NAME", "GEOGRAPHIC_LOCATION"
IN_CONTEXT, ALONE = 0.8, 0.6
BUDGET_EVERY = 1024  # words between looks at the record's deadline
_GAP = regex.compile(r"[ \t]{1,2}(?:\p{L}\.?[ \t]{1,2})?")  # "maría gonzález", "leidy t muris"
# Clinical abbreviations written in lower case that are also someone's name somewhere ("gerd", "tia").
STOP_WORDS = frozenset({"gerd", "tia", "ami", "ros", "iban", "nad", "ana", "ena", "mas", "abi", "ama"})


@lru_cache(maxsize=1)
def world_names() -> frozenset[str]:
    """The list's words, lower case, read once."""
    data = resources.files("mappings.data").joinpath("world-names.txt.gz").read_bytes()
    lines = gzip.decompress(data).decode("utf-8").splitlines()
    return frozenset(w for w in lines if w and not w.startswith("#"))


@lru_cache(maxsize=65536)
def _listed(word: str) -> bool:
    low = word.lower()
    return low in world_names() and low not in STOP_WORDS and not is_known_word(word)


class WorldNameDetector:
    """NAME spans from the world's given names and surnames."""

    name = "world-names"
    version = "1"
    text_bound = True  # CPU work in proportion to the text: in the calling thread on a short record

    def __init__(self) -> None:
        world_names()
        is_known_word("the")

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        upper_text = is_upper_text(text)
        found = []  # (start, end, proper)
        for i, m in enumerate(_WORD.finditer(text)):
            if i % BUDGET_EVERY == 0:
                budget.check(self.name)
            word = _POSSESSIVE.sub("", m.group()) if m.group()[-1] in "sS'’" else m.group()
            if len(word) < 3 or not _listed(word):
                if word is not m.group() and _listed(m.group()):
                    word = m.group()  # a name that ends in s ("Vargas")
                else:
                    continue
            found.append((m.start(), m.start() + len(word), _proper_shape(word, upper_text)))
        spans = []
        for k, (start, end, proper) in enumerate(found):
            before = text[max(0, start - 40):start]
            place = bool(_STRONG_PLACE_CUE.search(before))
            named = bool(_STRONG_NAME_CUE.search(before) or _NAME_CUE.search(before)
                         or _NAME_CUE_AFTER.match(text, end))
            beside = any(_beside(text, found[j], (start, end)) for j in (k - 1, k + 1) if 0 <= j < len(found))
            if not (proper or named or beside):
                continue
            context = named or beside or place
            spans.append(Span(start, end, PLACE if place and not named else NAME, self.name,
                              IN_CONTEXT if context else ALONE))
        return spans


def _beside(text: str, other: tuple[int, int, bool], span: tuple[int, int]) -> bool:
    """Two listed words with only spaces, or an initial, between them: a given name and a surname."""
    a, b = sorted(((other[0], other[1]), span))
    return bool(_GAP.fullmatch(text, a[1], b[0]))
