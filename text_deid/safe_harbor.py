"""What Safe Harbor lets us keep even when a detector flags it: ages under 90, a bare year,
a time or weekday alone, and numbers of three digits or fewer, also with separators ("2-3.5") and also
when a detector calls them a date ("LDL of 190")."""
from __future__ import annotations

import re

from text_deid.spans import Span

BARE_YEAR_RE = re.compile(r"^(?:in\s+)?'?(?:\d{2}|\d{4})s?$", re.IGNORECASE)
TIME_RE = re.compile(r"^\d{1,2}(?::\d{2}){1,2}\s*(?:[ap]\.?m\.?)?$|^\d{1,2}\s*[ap]\.?m\.?$", re.IGNORECASE)
WEEKDAY_RE = re.compile(
    r"^(?:mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)(?:day|nesday|rsday|urday|sday)?\.?$", re.IGNORECASE
)
SHORT_NUMBER_RE = re.compile(r"^[#\s]*\d{1,3}$")
AGE_RE = re.compile(r"(\d{1,3})")
AGE_PHRASE_RE = re.compile(r"^(?:age[ds]?\s*:?\s*)?(\d{1,3})\s*-?\s*(?:years?|yrs?|y\.?/?o\.?|yo)(?:[\s-]*old)?$|"
                           r"^age[ds]?\s*:?\s*(\d{1,3})$", re.IGNORECASE)


def keeps(span: Span, text: str) -> bool:
    """True when the span's text is something Safe Harbor does not count as PHI."""
    covered = text[span.start:span.end].strip()
    if span.category == "AGE_OVER_89":
        m = AGE_RE.search(covered)
        return bool(m) and int(m.group(1)) < 90
    if span.category == "DATE":
        return bool(BARE_YEAR_RE.match(covered) or TIME_RE.match(covered) or WEEKDAY_RE.match(covered)
                    or SHORT_NUMBER_RE.match(covered))
    return bool(SHORT_NUMBER_RE.match(covered)) or _few_digits_only(covered)


def _few_digits_only(covered: str) -> bool:
    """No letters and at most three digits: a value or range ("2-3.5"), never an identifier."""
    return not any(c.isalpha() for c in covered) and sum(c.isdigit() for c in covered) <= 3


def filter_spans(spans: list[Span], text: str, protected: frozenset[str] = frozenset({"known"})) -> list[Span]:
    """Drop spans Safe Harbor keeps; spans of protected detectors (the record's own identifiers) always stay."""
    return [s for s in spans if s.detector in protected or not keeps(s, text)]


def keeps_whatever_category(covered: str, category: str) -> bool:
    """True when Safe Harbor keeps `covered` whatever category a detector gave it (the LLM's types are a guess):
    an age under 90, a bare year, a time or weekday alone, a number of three digits or fewer.
    A bare number typed AGE_OVER_89 is the one exception: 90 and over it is PHI."""
    covered = covered.strip()
    age = AGE_PHRASE_RE.match(covered)
    if age:
        return int(age.group(1) or age.group(2)) < 90
    if category == "AGE_OVER_89" and covered.isdigit():
        return int(covered) < 90
    digits = re.search(r"\d{4}", covered)  # a four-digit number is a year only if it could be one
    is_year = bool(BARE_YEAR_RE.match(covered)) and (not digits or 1800 <= int(digits.group()) <= 2100)
    return bool(is_year or TIME_RE.match(covered) or WEEKDAY_RE.match(covered) or SHORT_NUMBER_RE.match(covered))
