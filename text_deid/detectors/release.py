"""A release's known identifiers: those of every patient of a bulk export, looked for in every record of it.

A name of another patient of the release is still a name. Each record is de-identified with its own
known identifiers; this matcher tells which identifiers of the rest of the release a record's texts hold,
and they join the record's own (masked by the known-identifier detector, checked by the leak guard).
Two Aho-Corasick automata find them in one pass each, however many patients the release holds: name words
in the lowercased text, at word edges (a word of a name that is an English word, "Young", "Mark", counts
only where it is capitalized), and the other identifiers (phones, ids, addresses) in the projected text
(`known_identifiers.project`; the detector's forms decide where they are written). Dates are left out:
birth dates of thousands of patients would cover most days of a note.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

import ahocorasick

from text_deid.detectors.english_words import is_english_word
from text_deid.detectors.known_identifiers import TITLES, _needle_words, project
from text_deid.normal_form import Folded, fold, fold_value
from text_deid.spans import KnownIdentifier

SHORTEST_NEEDLE = 4  # identifiers of three characters or fewer are not PHI under Safe Harbor
# a name's words (group 2) and their digits a generator appends (group 1: "Larue605"), that may not be written
_NAME_WORD = re.compile(r"(?<![^\W_])(([^\W\d_]{2,})\d*)(?![^\W_])")


class ReleaseMatcher:
    """The known identifiers of all patients of a release (dates excluded), compiled once for all its records."""

    def __init__(self, known: Iterable[KnownIdentifier]):
        # name word -> (is an English word, the name identifiers it adds); needle -> the identifiers it adds
        names: dict[str, tuple[bool, set[KnownIdentifier]]] = {}
        others: dict[str, set[KnownIdentifier]] = {}
        for k in set(known):
            if k.category == "DATE":
                continue
            if k.category == "NAME":
                for token, word in _NAME_WORD.findall(fold_value(k.value)):
                    if word not in TITLES:  # the word as written in the note, and with its digits
                        ids = names.setdefault(word, (is_english_word(word), set()))[1]
                        ids.update(KnownIdentifier(w, "NAME") for w in {token, word})
                continue
            for needle in _needle_words(KnownIdentifier(fold_value(k.value), k.category)):
                if len(needle := project(needle)) >= SHORTEST_NEEDLE:
                    others.setdefault(needle, set()).add(k)
        self.size = len(names) + len(others)
        self._names = _automaton({w: (len(w), english, tuple(ids)) for w, (english, ids) in names.items()})
        self._others = _automaton({n: tuple(ids) for n, ids in others.items()})

    def known_in(self, texts: Sequence[str]) -> set[KnownIdentifier]:
        """The release's identifiers that `texts` hold (compared in normal form)."""
        found: set[KnownIdentifier] = set()
        for text in texts:
            folded = fold(text)
            if self._names is not None:
                self._find_names(folded, text, found)
            if self._others is not None:
                for _, ids in self._others.iter(project(folded.text)):
                    found.update(ids)
        return found

    def _find_names(self, folded: Folded, text: str, found: set[KnownIdentifier]) -> None:
        lower = folded.text.lower()
        if len(lower) != len(folded.text):  # a letter that lowercases to two ("İ"): keep offsets, leave it as written
            lower = "".join(c.lower() if len(c.lower()) == 1 else c for c in folded.text)
        for end, (length, english, ids) in self._names.iter(lower):
            start = end - length + 1
            if start > 0 and lower[start - 1].isalnum() or end + 1 < len(lower) and lower[end + 1].isalpha():
                continue  # inside a longer word (digits may follow: "Larue605")
            if english and not _capitalized(folded, text, start, end + 1):
                continue  # "young", "mark": the English word, not the name
            found.update(ids)


def _capitalized(folded: Folded, text: str, start: int, end: int) -> bool:
    """Whether the word at [start, end) of the folded text is written with a capital. The fold keeps case in
    ASCII; elsewhere the original's first letter is read (none, an escape such as "&#75;": taken as a capital)."""
    if folded.text is folded.decoded:
        return folded.text[start].isupper()
    first, last = folded.original(start, end)
    letter = next((c for c in text[first:last] if c.isalpha()), "A")
    return letter.isupper()


def _automaton(values: dict) -> ahocorasick.Automaton | None:
    if not values:
        return None
    automaton = ahocorasick.Automaton()
    for key, value in values.items():
        automaton.add_word(key, value)
    automaton.make_automaton()  # never changed from here on: threads share it (each search has its own iterator)
    return automaton
