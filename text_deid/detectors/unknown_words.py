"""A recall layer for words no dictionary knows (Philter's idea): a word shaped like a proper noun, or standing
where a name or a place stands, that is no English word, no clinical word, no drug and no abbreviation, is a
NAME or GEOGRAPHIC_LOCATION candidate at a lower confidence.

* **Known words**: an English word (`wordfreq`, `english_words.py`), a word of the clinical vocabulary
  (`clinical/terms.py`) or of the medical look-alikes (eponyms, drugs, devices), a drug name
  (the one-word names of the clinical-values filter's drug list), an abbreviation (upper case, five letters or fewer).
* **Context**: a name cue before the word ("Dear", "my name is", "seen with", "neighbour", "Mr.") or after it
  (", can I", "says"), a place cue before it ("lives in", "grew up in", "in", "from", "near"), or a second
  unknown capitalized word beside it (a first and a last name).
* `in_context_only` (the no-llm stack's `unknown-words-in-context`): only words with context; otherwise
  (`unknown-words`, in recall-first and balanced) also capitalized words alone, at confidence 0.5, which a
  review-enabled run holds for review and the balanced stack's second opinion may veto.
A word in lower case counts only after a name or place cue ("my name is bertram").
"""
from __future__ import annotations

import bisect
from functools import lru_cache
from typing import Sequence

import regex

from text_deid import budget
from text_deid.clinical.terms import vocabulary
from text_deid.clinical.values import drug_names
from text_deid.detectors.addresses import postcodes_and_countries
from text_deid.detectors.english_words import is_english_word, zipf
from text_deid.spans import KnownIdentifier, Span
from text_deid.validation import lookalikes

ONE_WORD = regex.compile(r"[a-zà-ÿ]{2,}(?:-[a-zà-ÿ]{2,})*")  # a drug name of one word (a hyphen allowed)

NAME, PLACE = "NAME", "GEOGRAPHIC_LOCATION"
IN_CONTEXT, ALONE = 0.7, 0.5  # confidences: with context, and a capitalized word alone
MIN_LETTERS = 3
ABBREVIATION_MAX = 5
PAIR_ZIPF = 3.0  # two capitalized words side by side are a name only if both are this rare ("Natriuretic Peptide" is not)
MAX_LIST = 12  # list mates taken from one text at most
BUDGET_EVERY = 1024  # words between looks at the record's deadline

_WORD = regex.compile(r"(?<![\w@./\\-])\p{L}[\p{L}'’]{0,40}(?:-\p{L}[\p{L}'’]{0,40}){0,3}(?![\w@/])")
_UPPER, _LOWER = regex.compile(r"\p{Lu}"), regex.compile(r"\p{Ll}")
_POSSESSIVE = regex.compile(r"['’]s?$")
_NEWLINE = regex.compile(r"\n")
_INITIAL = regex.compile(r"[ \t]{1,3}\p{Lu}\.?[ \t]{1,3}")
# Cues on the same line as the word. These make even a common capitalized word a name ("named him Frank").
_NAMING_CUE = regex.compile(
    r"(?i:\bmy[ \t]+name[ \t]+is|\bname[ \t]+is|\bname[ \t]*:|\bnamed(?:[ \t]+(?:him|her|them))?|"
    r"\bcall(?:s|ed)?[ \t]+(?:me|him|her))[ \t]{1,3}\Z")
# A strong cue names an unknown word a name even in lower case ("my name is bertram").
_STRONG_NAME_CUE = regex.compile(
    r"(?i:\bdear|\bmy[ \t]+name[ \t]+is|\bname[ \t]+is|\bname[ \t]*:|\bnamed(?:[ \t]+(?:him|her|them|it))?|"
    r"\bcall(?:s|ed)?[ \t]+(?:me|him|her)|\bI[ \t]+am|\bI['’]m|\bthis[ \t]+is)[ \t]{0,3}[:,]?[ \t]{0,3}\Z")
_NAME_CUE = regex.compile(
    r"(?i:\bcalled|\bseen[ \t]+with|\bwith[ \t]+(?:his|her|their|my|our)[ \t]+\p{L}{3,12}|\bneighbou?r|\bfriend|"
    r"\bwife|\bhusband|\bpartner|\bson|\bdaughter|\bbrother|\bsister|\bmother|\bfather|\bmom|\bmum|\bdad|\baunt|"
    r"\buncle|\bcousin|\bniece|\bnephew|\bgrand(?:son|daughter|mother|father)|\bboyfriend|\bgirlfriend|\bcaregiver|"
    r"\bguardian|\bunder|\bsays|\bsaid|\bwritten[ \t]+by|\bseen[ \t]+by|\bmet|\bmr|\bmrs|\bms|\bmiss|\bmx|\bdr|"
    r"\bprof|\buser[ \t]*:|\bcontact|\bsigned|\bthanks|\bthank[ \t]+you|\bhi|\bhello)\.?[ \t]{0,3}[:,]?[ \t]{0,3}\Z")
_NAME_CUE_AFTER = regex.compile(
    r"(?:\s{0,2},\s{0,2}(?:can|could|would|will|please|thank|thanks|I|we|you)\b|\s{1,2}(?:says|said|told|asked|"
    r"wrote|explained|called|replied|lives|lived|began|begins|was\s+born|has\s+been|will\s+be\s+talking|"
    r"had\s+given|gave|came|went|visited)\b|\s{0,2}:\s{0,2}[\"“]|['’]s\s)", regex.IGNORECASE)
# words joined by "and", "or", "&" or a comma: a list of names or of places
_COORDINATION = regex.compile(r"[ \t]{0,2}(?:,[ \t]{1,2}(?:and[ \t]{1,2}|or[ \t]{1,2})?|[ \t](?:and|or|&)[ \t]{1,2})")
_PLACE_CUE = regex.compile(
    r"(?i:\b(?:in|from|to|near|at|visit(?:ed|ing)?|around|outside|across)|\bborn[ \t]+in|\blives?[ \t]+in|"
    r"\bliving[ \t]+in|\bgrew[ \t]+up[ \t]+in|\bbased[ \t]+in|\bmoved[ \t]+(?:here[ \t]+)?(?:to|from)|"
    r"\btrip[ \t]+to|\btravel(?:l?ed|l?ing)?[ \t]+to|\blocated[ \t]+in|"
    r"\b(?:city|town|village|county|province|region)[ \t]+of)[ \t]{1,3}\Z")
_STRONG_PLACE_CUE = regex.compile(
    r"(?i:\bborn[ \t]+in|\blives?[ \t]+in|\bliving[ \t]+in|\bgrew[ \t]+up[ \t]+in|\bbased[ \t]+in|"
    r"\bmoved[ \t]+(?:here[ \t]+)?(?:to|from)|\btrip[ \t]+to|\blocated[ \t]+in|\b(?:city|town|village)[ \t]+of)[ \t]{1,3}\Z")
_CAPITALIZED = regex.compile(r"\p{Lu}\p{Ll}{1,40}(?![\w'’-])")
_CAPITALIZED_BEFORE = regex.compile(r"(?<![\w'’-])(\p{Lu}\p{Ll}{1,40})(?:[ \t]{0,2},[ \t]{1,2}(?:and[ \t]{1,2}|or[ \t]{1,2})?"
                                    r"|[ \t](?:and|or|&)[ \t]{1,2})\Z")
# A text most of whose known words are capitalized (a heading, a test's name) gives a capital letter no weight.
TITLE_CASE_SHARE = 0.5


@lru_cache(maxsize=1)
def drug_words() -> frozenset[str]:
    """One-word drug names, lower case: those of the clinical-values filter's drug list, read once."""
    return frozenset(name for name in drug_names() if ONE_WORD.fullmatch(name))


@lru_cache(maxsize=4096)  # words repeat across a record's texts; what is kept lives only in this process
def is_known_word(word: str) -> bool:
    """An English, clinical or drug word, or an abbreviation: never a candidate on its own."""
    low = word.lower()
    if ((word.isupper() and len(word) <= ABBREVIATION_MAX) or (word.endswith("s") and word[:-1].isupper())
            or (word[:2].isupper() and not word.isupper() and len(word) <= ABBREVIATION_MAX + 1)):
        return True  # an abbreviation, its plural or a mixed-case one ("COPD", "STECs", "AFib")
    parts = [p for p in low.split("-") if p]
    return (is_english_word(low) or low in postcodes_and_countries()[1] or low in drug_words()
            or low in lookalikes().alone or vocabulary().is_word(low)
            or all(is_english_word(p) or vocabulary().is_word(p) or p in drug_words() for p in parts))


def is_upper_text(text: str) -> bool:
    """A text written in capitals (60% of its letters or more): a capitalized word there is no evidence."""
    return len(_UPPER.findall(text)) > 1.5 * len(_LOWER.findall(text))


def _proper_shape(word: str, upper_text: bool) -> bool:
    if word[0].isupper() and any(c.islower() for c in word[1:]):
        return True
    return word.isupper() and not upper_text and len(word) > ABBREVIATION_MAX


class UnknownWordDetector:
    """NAME and GEOGRAPHIC_LOCATION candidates from words no dictionary knows."""

    version = "1"
    text_bound = True  # CPU work in proportion to the text: in the calling thread on a short record

    def __init__(self, in_context_only: bool) -> None:
        self.in_context_only = in_context_only
        self.name = "unknown-words-in-context" if in_context_only else "unknown-words"
        drug_words()
        vocabulary()
        is_english_word("the")

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        upper_text = is_upper_text(text)
        words = list(_WORD.finditer(text))
        candidates, named_words = [], []
        known_on_line: dict[int, list[int]] = {}  # line start -> [known words, of them capitalized]
        line_start = _line_starts(text)
        for i, m in enumerate(words):
            if i % BUDGET_EVERY == 0:
                budget.check(self.name)  # past the record's deadline a huge text stops here, not at its end
            word = m.group()
            if word[-1] in "'’" or word[-2:-1] in ("'", "’"):
                word = _POSSESSIVE.sub("", word)
            if len(word) - word.count("-") - word.count("'") - word.count("’") < MIN_LETTERS:
                continue
            if is_known_word(word):
                counts = known_on_line.setdefault(line_start(m.start()), [0, 0])
                counts[0] += 1
                counts[1] += word[0].isupper()
                if _proper_shape(word, upper_text) and _named(text, m.start(), word):
                    named_words.append(Span(m.start(), m.start() + len(word), NAME, self.name, IN_CONTEXT))
                continue
            candidates.append((m.start(), m.start() + len(word), _proper_shape(word, upper_text)))
        title_lines = {line for line, (n, caps) in known_on_line.items() if n >= 2 and caps > TITLE_CASE_SHARE * n}
        candidates = [(s, e, p, line_start(s) in title_lines) for s, e, p in candidates]
        listed = self._listed(text, [c for c in candidates if not c[3]])
        spans = []
        for k, (start, end, proper, title_case) in enumerate(candidates):
            if k % BUDGET_EVERY == 0:
                budget.check(self.name)
            before = text[max(0, start - 40):start]
            place = bool(_STRONG_PLACE_CUE.search(before)) or (proper and bool(_PLACE_CUE.search(before)))
            strong = bool(_STRONG_NAME_CUE.search(before))
            named = strong or (proper and bool(_NAME_CUE.search(before) or _NAME_CUE_AFTER.match(text, end)))
            pair = proper and not title_case and self._rare(text[start:end]) and any(
                p and self._rare(text[s:e]) and _adjacent(text, *sorted(((s, e), (start, end))))
                for s, e, p, _ in candidates[max(0, k - 1):k + 2] if (s, e) != (start, end))
            context = place or named or pair or (start, end) in listed
            if not context and (self.in_context_only or title_case or not proper):
                continue
            category = PLACE if place and not named else NAME
            spans.append(Span(start, end, category, self.name, IN_CONTEXT if context else ALONE))
        return _joined(text, spans) + self._list_mates(text, candidates, listed) + named_words

    @staticmethod
    def _rare(word: str) -> bool:
        return zipf(word) < PAIR_ZIPF

    def _listed(self, text: str, candidates: list[tuple[int, int, bool, bool]]) -> set[tuple[int, int]]:
        """Unknown capitalized words in a list with other capitalized words ("Marrero and Murphy")."""
        out = set()
        for start, end, proper, _ in candidates:
            if proper and (self._mate_after(text, end) or self._mate_before(text, start)):
                out.add((start, end))
        return out

    def _list_mates(self, text: str, candidates: list[tuple[int, int, bool, bool]],
                    listed: set[tuple[int, int]]) -> list[Span]:
        """The known capitalized words listed with an unknown one ("Murphy" in "Marrero and Murphy"): names too."""
        taken = {(s, e) for s, e, _, _ in candidates}
        out = []
        todo = sorted(listed)
        while todo and len(out) < MAX_LIST:
            start, end = todo.pop()
            for mate in (self._mate_after(text, end), self._mate_before(text, start)):
                if mate and mate not in taken:
                    taken.add(mate)
                    todo.append(mate)
                    out.append(Span(mate[0], mate[1], NAME, self.name, IN_CONTEXT))
        return out

    def _mate_after(self, text: str, end: int) -> tuple[int, int] | None:
        m = _COORDINATION.match(text, end)
        w = m and _CAPITALIZED.match(text, m.end())
        return (w.start(), w.end()) if w and not vocabulary().is_word(w.group().lower()) else None

    def _mate_before(self, text: str, start: int) -> tuple[int, int] | None:
        m = _CAPITALIZED_BEFORE.search(text, max(0, start - 40), start)
        return (m.start(), m.start() + len(m.group(1))) if m and not vocabulary().is_word(m.group(1).lower()) else None


def _line_starts(text: str):
    """Where the line holding an offset starts, looked up by bisection (rfind from each word would read a text
    without line breaks once per word)."""
    starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]
    return lambda offset: starts[bisect.bisect_right(starts, offset) - 1]


def _named(text: str, start: int, word: str) -> bool:
    """A common word that the text names as a name ("my name is Frank", "named him Hope"), if it is not clinical."""
    low = word.lower()
    return (bool(_NAMING_CUE.search(text, max(0, start - 24), start))
            and not (vocabulary().is_word(low) or low in drug_words() or low in lookalikes().alone))


def _adjacent(text: str, a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Two words with only spaces, or an initial, between them ("Szabina J Gelencsér")."""
    gap = text[a[1]:b[0]]
    return bool(gap) and (gap.strip(" \t") == "" or bool(_INITIAL.fullmatch(gap)))


def _joined(text: str, spans: list[Span]) -> list[Span]:
    """Candidates side by side become one span (a first and last name), with the stronger category."""
    out: list[Span] = []
    for s in spans:
        if out and _adjacent(text, (out[-1].start, out[-1].end), (s.start, s.end)):
            last = out[-1]
            category = last.category if last.confidence >= s.confidence else s.category
            out[-1] = Span(last.start, s.end, category, last.detector, max(last.confidence, s.confidence))
        else:
            out.append(s)
    return out
