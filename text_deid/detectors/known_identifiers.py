"""Known identifiers: values from the structured record, matched in the forms people write them."""
from __future__ import annotations

import re
from datetime import date
from functools import lru_cache
from typing import Sequence

from text_deid.spans import KnownIdentifier, Span

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
TITLES = {"mr", "mrs", "ms", "miss", "dr", "prof", "rev", "sr", "jr", "md", "phd", "rn", "np", "do"}
ISO_DATE_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})")
ID_CATEGORIES = {
    "SOCIAL_SECURITY_NUMBER", "MEDICAL_RECORD_NUMBER", "HEALTH_PLAN_BENEFICIARY_NUMBER", "ACCOUNT_NUMBER",
    "CERTIFICATE_LICENSE_NUMBER", "VEHICLE_IDENTIFIER", "DEVICE_IDENTIFIER", "UNIQUE_IDENTIFIER",
}
B, E = r"(?<![0-9A-Za-z])", r"(?![0-9A-Za-z])"  # word edges that also treat digits as word characters


def _name_forms(value: str) -> list[str]:
    tokens = [t for t in re.split(r"[\s,]+", value) if t]
    tokens = [t for t in tokens if t.rstrip(".").lower() not in TITLES]
    forms = [re.escape(t) for t in tokens if len(t.rstrip(".")) >= 2]
    if len(tokens) >= 2:
        family, given = tokens[-1], tokens[0]
        forms += [
            r"\s+".join(map(re.escape, tokens)),
            re.escape(family) + r",\s*" + re.escape(given),
            re.escape(given[0]) + r"\.?\s*" + re.escape(family),  # "J. Smith", "J Smith"
            re.escape(family) + r",?\s+" + re.escape(given[0]) + r"\.",  # "Smith, J."
        ]
    return forms


def _date_forms(value: str) -> list[str]:
    m = ISO_DATE_RE.match(value)
    if not m:
        return []
    y, mo, d = (int(g) for g in m.groups())
    try:
        date(y, mo, d)
    except ValueError:
        return []
    yy = f"{y % 100:02d}"
    year = rf"(?:{y}|'?{yy})"
    mon = MONTHS[mo - 1]
    sept = r"|Sept\.?" if mo == 9 else ""
    month = rf"(?:{mon}|{mon[:3]}\.?{sept})"
    day = rf"0?{d}(?:st|nd|rd|th)?"
    sep = r"[/.\-]"
    return [
        rf"{y}{sep}0?{mo}{sep}0?{d}",
        rf"{y}{mo:02d}{d:02d}",
        rf"0?{mo}{sep}0?{d}{sep}{year}",  # US 3/7/2021, 03-07-21
        rf"0?{d}{sep}0?{mo}{sep}{year}",  # day first 7/3/2021
        rf"{month}\s+{day},?\s+(?:of\s+)?{year}",
        rf"{day}\s+(?:of\s+)?{month},?\s+{year}",
    ]


def _digits_form(value: str, min_digits: int) -> list[str]:
    digits = re.sub(r"\D", "", value)
    if len(digits) == 11 and digits.startswith("1"):
        digits = digits[1:]
    if len(digits) < min_digits:
        return []
    return [r"(?:\+?1[\s.\-]*)?\(?" + r"[\s().\-]*".join(digits)]


def _identifier_form(value: str) -> list[str]:
    chars = re.sub(r"[^0-9A-Za-z]", "", value)
    if len(chars) < 4:
        return []  # identifiers of three characters or fewer are not PHI under Safe Harbor
    return [r"[\s\-./]?".join(map(re.escape, chars))]


STREET_SUFFIXES = {"st", "street", "ave", "avenue", "rd", "road", "dr", "drive", "ln", "lane", "blvd", "boulevard",
                   "ct", "court", "way", "pl", "place", "ter", "terrace", "cir", "circle", "pkwy", "parkway", "hwy"}


def _phrase_form(value: str) -> list[str]:
    words = [w for w in re.split(r"[\s,]+", value.strip()) if w]
    if not words or len("".join(words)) < 3:
        return []
    found = [r"[\s,.]+".join(map(re.escape, words))]
    if len(words) >= 3 and words[-1].rstrip(".").lower() in STREET_SUFFIXES:
        found.append(r"[\s,.]+".join(map(re.escape, words[:-1])))  # "534 Erewhon" for "534 Erewhon St"
    return found


def forms(known: KnownIdentifier) -> list[str]:
    """Regular expressions (without word edges) for the ways `known.value` is written in text."""
    c, v = known.category, known.value.strip()
    if not v:
        return []
    if c == "NAME":
        return _name_forms(v)
    if c == "DATE":
        return _date_forms(v)
    if c in ("PHONE_NUMBER", "FAX_NUMBER"):
        return _digits_form(v, 7)
    if c in ID_CATEGORIES:
        return _identifier_form(v)
    if c in ("EMAIL_ADDRESS", "URL", "IP_ADDRESS"):
        return [re.escape(v)]
    if c == "GEOGRAPHIC_LOCATION":
        if re.fullmatch(r"\d{5}(?:-\d{4})?", v):
            return [re.escape(v[:5]) + r"(?:-?\d{4})?"]
        return _phrase_form(v)
    return _phrase_form(v)


@lru_cache(maxsize=256)
def compile_known(known: tuple[KnownIdentifier, ...]) -> tuple[tuple[str, re.Pattern], ...]:
    """One case-insensitive alternation per category, longest forms first."""
    by_category: dict[str, set[str]] = {}
    for k in known:
        by_category.setdefault(k.category, set()).update(forms(k))
    compiled = []
    for category, alternatives in sorted(by_category.items()):
        if alternatives:
            body = "|".join(sorted(alternatives, key=lambda a: (-len(a), a)))
            compiled.append((category, re.compile(f"{B}(?:{body}){E}", re.IGNORECASE)))
    return tuple(compiled)


def find_known(text: str, known: tuple[KnownIdentifier, ...], detector: str = "known") -> list[Span]:
    """Every occurrence of every known identifier in `text`."""
    spans = []
    for category, pattern in compile_known(known):
        spans.extend(Span(m.start(), m.end(), category, detector, 1.0) for m in pattern.finditer(text) if m.end() > m.start())
    return spans


class KnownIdentifierDetector:
    """Finds the record's own identifiers (names, dates, MRNs, phones, address parts) in its narrative."""

    name = "known"

    def detect(self, text: str, known: Sequence[KnownIdentifier]) -> list[Span]:
        return find_known(text, tuple(known), self.name)
