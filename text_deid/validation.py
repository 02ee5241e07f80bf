"""Validation layer: second thoughts on the spans of list- and model-based detectors, before the union merge.

* Medical look-alikes (`data/medical_lookalikes.txt`): a gazetteer or NER span that is only an eponym,
  drug or device ("Parkinson", "Foley", "Lasix"), or lies inside a clinical phrase ("Wells score",
  "New York Heart Association"), is dropped unless the text gives it name context ("Dr. Parkinson").
* Clinical terms (`clinical/terms.py`, the clinical vocabulary under `mappings/data/`): a name or place span
  that is a clinical word ("Hemoglobin", "Cardiology") or an eponym or place before a clinical head word
  ("Lynch syndrome", "Glasgow Coma Scale") is dropped unless the text marks a person or place ("Dr.",
  "lives in", "seen at").
* Common words: a span that is one lowercase word of the name stop list (`data/name_stop_words.txt`:
  "of", "our", "month", "clinic") is a model's slip at the edge of a real span, not PHI.
* Sources of guidance: a location span that names a hospital as the source of a guideline or study
  ("recommendations from Mayo Clinic", "Mayo Clinic criteria") says nothing about where the patient was,
  and is dropped, as the gazetteer already does for its own matches.
* Conflicts: spans of protected detectors (known identifiers, patterns) are never dropped and always
  win: an overlapping weaker span keeps only its parts outside them. Among the others, a name or
  organization overlapping a facility becomes part of one location span; otherwise the longer span wins.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import ahocorasick

from text_deid.clinical.terms import is_clinical_term, marks_person_or_place
from text_deid.detectors.gazetteer import SOURCE_AFTER_RE, SOURCE_CUE_RE
from text_deid.spans import Span

PROTECTED = frozenset({"known", "patterns"})
TITLE_BEFORE_RE = re.compile(r"\b(?:Dr|Mr|Mrs|Ms|Miss|Mx|Prof|Doctor|Professor|Nurse)\.?\s*$")
TITLE_START_RE = re.compile(r"^(?:Dr|Mr|Mrs|Ms|Miss|Mx|Prof|Doctor|Professor|Nurse)\b\.?\s")
POSSESSIVE_RE = re.compile(r"(?:['’]s|s['’]|['’])$")
FACILITY_RE = re.compile(r"\b(?:Hospital|Hosp|Clinic|Medical|Med|Center|Centre|Health|Healthcare|Infirmary|"
                         r"Memorial|General|Institute|VA)\b", re.IGNORECASE)
WORD_RE = re.compile(r"[^\W_]")  # a letter or digit of any script: ИВАНОВ is a name too


@dataclass(frozen=True)
class Lookalikes:
    alone: frozenset[str]  # lowercase: eponyms, drugs, devices that are medical on their own
    before_head: frozenset[str]  # eponyms that are medical only before a head word
    heads: frozenset[str]
    phrases: re.Pattern
    starts: Any  # an Aho-Corasick automaton of how each phrase can begin (its first word, case-folded)


def _data_path(name: str) -> Path:
    return Path(str(resources.files("text_deid") / "data" / name))


@lru_cache(maxsize=1)
def lookalikes() -> Lookalikes:
    """The whitelist, loaded once."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in _data_path("medical_lookalikes.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("["):
            current = line.strip("[] ")
            continue
        sections.setdefault(current, []).append(line.strip())

    def words(name: str) -> frozenset[str]:
        return frozenset(w.lower() for line in sections.get(name, []) for w in line.split())

    alone = words("eponyms") | words("drugs") | words("devices")
    before_head = alone | words("eponyms-before-head")
    heads = words("heads")
    eponym_alt = "|".join(sorted((re.escape(w) for w in before_head), key=len, reverse=True))
    head_alt = "|".join(sorted((re.escape(w) for w in heads), key=len, reverse=True))
    phrase_alt = "|".join(re.escape(p).replace(r"\ ", r"[\s-]+").replace("'", "['’]") for p in
                          sorted(sections.get("phrases", []), key=len, reverse=True))
    phrases = re.compile(
        rf"\b(?:{phrase_alt}|(?:{eponym_alt})(?:['’]s|s['’]|['’])?(?:[\s-]+(?:{eponym_alt})(?:['’]s)?)*"
        rf"(?:\s+[a-z]+)?\s+(?:{head_alt}))\b", re.IGNORECASE)
    starts = ahocorasick.Automaton()
    for word in before_head | {p.split()[0].lower() for p in sections.get("phrases", []) if p.split()}:
        needle = re.split(r"['’-]", word.casefold(), maxsplit=1)[0]  # the part every spelling starts with
        if needle:
            starts.add_word(needle, needle)
    starts.make_automaton()
    return Lookalikes(alone, before_head, heads, phrases, starts)


def lookalike_regions(text: str) -> list[tuple[int, int]]:
    """Where the clinical phrases of the whitelist lie: `phrases.finditer`, tried only where a phrase can
    start (the alternation of some 700 words is slow to try at every position of every text)."""
    found = lookalikes()
    folded = text.casefold()
    if len(folded) != len(text):  # a letter that folds to two ("ß"): offsets would not line up, try them all
        return [(m.start(), m.end()) for m in found.phrases.finditer(text)]
    regions, reached = [], 0
    for start in sorted({end - len(needle) + 1 for end, needle in found.starts.iter(folded)}):
        if start < reached:
            continue
        m = found.phrases.match(text, start)
        if m:
            regions.append((m.start(), m.end()))
            reached = m.end()
    return regions


def has_name_context(text: str, span: Span) -> bool:
    """A title right before the span or at its start: "Dr. Parkinson"."""
    return bool(TITLE_BEFORE_RE.search(text[max(0, span.start - 12):span.start])
                or TITLE_START_RE.match(text[span.start:span.end]))


def is_lookalike(text: str, span: Span, regions: list[tuple[int, int]]) -> bool:
    """The span is a medical term on its own, or lies inside a clinical phrase, and has no name or place
    context ("Dr. Parkinson", "lives in Glasgow")."""
    if has_name_context(text, span) or marks_person_or_place(text, span, weak=False):
        return False
    covered = POSSESSIVE_RE.sub("", text[span.start:span.end].strip()).lower()
    if covered in lookalikes().alone or all(w in lookalikes().alone for w in re.split(r"[\s-]+", covered) if w):
        return True
    return any(s <= span.start and span.end <= e for s, e in regions)


@lru_cache(maxsize=1)
def common_words() -> frozenset[str]:
    """Lowercase words that are never PHI on their own (the gazetteer's name stop list)."""
    return frozenset(w for line in _data_path("name_stop_words.txt").read_text(encoding="utf-8").splitlines()
                     if not line.startswith("#") for w in line.split())


def is_common_word(text: str, span: Span) -> bool:
    """The span is a single lowercase common word ("of" before a date, "our" before a city)."""
    covered = text[span.start:span.end]
    return covered.islower() and covered.isalpha() and covered in common_words()


def is_source_of_guidance(text: str, span: Span) -> bool:
    """A location named as where a guideline, study or criteria come from, not where the patient was."""
    return span.category == "GEOGRAPHIC_LOCATION" and bool(
        SOURCE_CUE_RE.search(text[max(0, span.start - 40):span.start]) or SOURCE_AFTER_RE.match(text[span.end:]))


def _is_facility(text: str, span: Span) -> bool:
    return span.category == "GEOGRAPHIC_LOCATION" and bool(FACILITY_RE.search(text[span.start:span.end]))


def _outside(span: Span, blockers: list[Span], text: str) -> list[Span]:
    """The parts of `span` not covered by `blockers`, keeping only parts with a letter or digit."""
    pieces = [(span.start, span.end)]
    for b in blockers:
        pieces = [p for s, e in pieces for p in ((s, min(e, b.start)), (max(s, b.end), e)) if p[1] > p[0]]
    out = []
    for s, e in pieces:
        while s < e and not text[s].isalnum():
            s += 1
        while e > s and not text[e - 1].isalnum() and text[e - 1] != ".":
            e -= 1
        if e > s and WORD_RE.search(text[s:e]) and (e - s > 1):
            out.append(Span(s, e, span.category, span.detector, span.confidence))
    return out


def validate(spans: list[Span], text: str) -> list[Span]:
    """Spans after the whitelist and conflict rules; protected detectors' spans pass unchanged."""
    protected = [s for s in spans if s.detector in PROTECTED]
    others = [s for s in spans if s.detector not in PROTECTED]
    if not others:
        return list(spans)
    regions = lookalike_regions(text)
    others = [s for s in others if not (is_lookalike(text, s, regions) or is_common_word(text, s)
                                        or is_source_of_guidance(text, s) or is_clinical_term(text, s))]
    others = _resolve(others, text)
    blocked = _disjoint(protected)
    starts = [b.start for b in blocked]
    trimmed = []
    for s in others:  # the disjoint blocked intervals overlapping s lie just before bisect(starts, s.end)
        i = j = bisect.bisect_left(starts, s.end)
        while i > 0 and blocked[i - 1].end > s.start:
            i -= 1
        trimmed.extend(_outside(s, blocked[i:j], text))
    return sorted(protected + trimmed)


def _disjoint(spans: list[Span]) -> list[Span]:
    """The intervals the spans cover, joined where they overlap, sorted (their categories do not matter here)."""
    out: list[Span] = []
    for s in sorted(spans):
        if out and s.start < out[-1].end:
            out[-1] = Span(out[-1].start, max(out[-1].end, s.end), s.category, s.detector)
        else:
            out.append(s)
    return out


def _resolve(spans: list[Span], text: str) -> list[Span]:
    """Overlapping weaker spans: a facility absorbs what overlaps it; a span inside a longer one is dropped
    (partial overlaps are left to the union merge, so no character is lost)."""
    facilities = [s for s in spans if _is_facility(text, s)]
    grown = []
    for f in facilities:
        parts = [s for s in spans if s.start < f.end and f.start < s.end]
        grown.append(Span(min(p.start for p in parts), max(p.end for p in parts), f.category, f.detector,
                          max(p.confidence for p in parts)))
    rest = [s for s in spans if not any(s.start < g.end and g.start < s.end for g in grown)]
    # No kept span lies inside another, so sorted by start their ends rise too: the only kept span that can
    # hold s is the last one starting at or before it.
    kept: list[Span] = []
    for s in sorted(grown + rest, key=lambda s: (-(s.end - s.start), -s.confidence, s.start, s.detector)):
        i = bisect.bisect_right(kept, s.start, key=lambda k: k.start)
        if not (i and kept[i - 1].end >= s.end):
            kept.insert(i, s)
    return kept
