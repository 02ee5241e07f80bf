"""Name parts travel together: a NAME span grows over the parts joined to it by a hyphen, an apostrophe
or a particle, so that masking "Garcia" in "Garcia-Reyes" or "Dijk" in "van Dijk" leaves no half behind.

A span filter, run after the validation layer on every detector's spans (known identifiers included):
* a hyphen and a capitalized word on either side ("Garcia-Reyes", "Jean-Luc"),
* an apostrophe between a short prefix and a capitalized word ("O'Brien", "D'Angelo"; not a possessive),
* particles before the span ("van der Berg", "bin Salman", "Ó Briain"), or particles and a capitalized
  word after it ("Willemine ten Pas", "Ludwig van Beethoven").
"""
from __future__ import annotations

import re

from text_deid.spans import Span

NAME = "NAME"
# Lowercase particles of surnames in many languages, and the capitalized ones that are not English words.
PARTICLES = frozenset({
    "van", "von", "der", "den", "de", "del", "della", "degli", "di", "da", "das", "dos", "do", "du", "des", "la",
    "le", "lo", "ter", "ten", "te", "zu", "zur", "af", "av", "bin", "binti", "bint", "ibn", "ben", "bat", "al",
    "el", "abu", "ould", "st.", "mac", "mc", "ó", "ní", "nic", "ua", "uí", "mhic", "ap", "y",
})
_PART = r"[^\W\d_](?:[^\W\d_]|['’](?=[^\W\d_]))*"  # a word of letters, an inner apostrophe allowed
HYPHEN = "-\u2010\u2011"
APOSTROPHE = "'’"
_HYPHEN_AFTER = re.compile(rf"[{HYPHEN}]({_PART})")
_HYPHEN_BEFORE = re.compile(rf"({_PART})[{HYPHEN}]$")
_PREFIX_BEFORE = re.compile(rf"(?<![^\W\d_])(?:[OoDdLl]|Mc|Mac|Dell|Dall)[{APOSTROPHE}]$")
_WORD_BEFORE = re.compile(r"(\S+)[ \t]+$")
_PARTICLE_AFTER = re.compile(r"[ \t]+(\S+)(?=[ \t])")
_WORD_AFTER = re.compile(rf"[ \t]+({_PART})")
MAX_PARTICLES = 3


def _capitalized(word: str) -> bool:
    return bool(word) and word[0].isupper() and any(c.islower() for c in word[1:])


def _particle(word: str) -> bool:
    return word.lower() in PARTICLES


def _grow_right(text: str, end: int) -> int:
    while True:
        m = _HYPHEN_AFTER.match(text, end)
        if m and _capitalized(m.group(1)):
            end = m.end()
            continue
        pos, particles = end, 0
        while particles < MAX_PARTICLES:
            m = _PARTICLE_AFTER.match(text, pos)
            if not (m and _particle(m.group(1))):
                break
            pos, particles = m.end(), particles + 1
        if particles:
            m = _WORD_AFTER.match(text, pos)
            if m and _capitalized(m.group(1)):
                end = m.end()
                continue
        return end


def _grow_left(text: str, start: int) -> int:
    while True:
        before = text[max(0, start - 60):start]
        m = _HYPHEN_BEFORE.search(before)
        if m and _capitalized(m.group(1)):
            start -= len(m.group(0))
            continue
        m = _PREFIX_BEFORE.search(before)
        if m:
            start -= len(m.group(0))
            continue
        m = _WORD_BEFORE.search(before)
        if m and _particle(m.group(1)) and (m.group(1)[0].islower() or not m.group(1).isascii()):
            start -= len(m.group(0))
            continue
        return start


def join_name_parts(spans: list[Span], text: str) -> list[Span]:
    """NAME spans grown over the name parts joined to them; other spans unchanged."""
    out = []
    for s in spans:
        if s.category != NAME:
            out.append(s)
            continue
        start, end = _grow_left(text, s.start), _grow_right(text, s.end)
        out.append(s if (start, end) == (s.start, s.end) else Span(start, end, s.category, s.detector, s.confidence))
    return out
