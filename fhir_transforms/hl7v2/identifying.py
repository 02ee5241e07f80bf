"""Which known identifiers of a message identify alone, and the leak guard's look for known dates with a time.

The rule: a known identifier is searched for (by the text stack and the leak guard) when it holds at least
5 digits, or at least 3 characters with a letter among them, and is neither an HL7 code (table 0301
universal id types, 0203 identifier types, common coding systems) nor a name this message routes by
(MSH-3..6). Shorter values are still removed where their field says so; they are not searched for
elsewhere, because 2-4 digit numbers and 1-2 letter words recur in every message (set ids, counts, units,
codes) and matching them refuses or masks without protecting anyone: 4 digits are 1 in 10,000.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

from text_deid.leak_guard import Leak
from text_deid.spans import KnownIdentifier

MIN_DIGITS = 5
MIN_CHARACTERS = 3
HL7_CODES = frozenset({
    "ISO", "DNS", "UUID", "GUID", "URI", "URL", "CLIA", "CLIP", "HCD", "HL7", "X400", "X500", "L", "M", "N",
    "MR", "MRT", "PI", "SS", "AN", "VN", "PN", "PT", "NPI", "DL", "PPN", "LN", "LOINC", "SCT", "SNM", "SNOMED",
    "ICD9", "ICD10", "I9C", "I10", "CPT", "NDC", "RXNORM", "HL70001", "USA", "US",
})
# YYYYMMDD followed by hh[mm[ss[.s]]] and an optional offset: the stack's date shapes end at the day
DATE_TIME_RE = re.compile(r"(?<![0-9])(\d{8})(?:\d{2}|\d{4}|\d{6})(?:\.\d{1,4})?(?:[+-]\d{4})?(?![0-9])")


def identifying(known: KnownIdentifier, routing: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether a known identifier is long and rare enough to be searched for (see the module's rule)."""
    if known.category == "DATE":
        return True
    v = known.value.strip()
    upper = v.upper()
    if upper in HL7_CODES or upper in routing:
        return False
    if not any(map(str.isalpha, v)):  # map over the str methods: as fast as a regular expression, any script
        return sum(map(str.isdigit, v)) >= MIN_DIGITS
    return len(v) >= MIN_CHARACTERS


def dates_with_time(strings: Iterable[tuple[str, str]], known: Iterable[KnownIdentifier]) -> list[Leak]:
    """Leaks of known dates written as an HL7 date-time (`YYYYMMDDhhmm...`), one per path."""
    days = _days(known)
    if not days:
        return []
    found = {path for path, text in strings for m in DATE_TIME_RE.finditer(text) if m.group(1) in days}
    return [Leak(path, "DATE") for path in sorted(found)]


def holds_known_day(texts: Sequence[str], known: Iterable[KnownIdentifier]) -> bool:
    """Whether a known date occurs in `texts` as `YYYYMMDD`: where none does, `dates_with_time` finds nothing."""
    everything = "\n".join(texts)
    return any(day in everything for day in _days(known))


def _days(known: Iterable[KnownIdentifier]) -> set[str]:
    return {k.value.strip()[:10].replace("-", "") for k in known if k.category == "DATE"}
