"""Known identifiers: values from the structured record, matched in the forms people write them."""
from __future__ import annotations

import bisect
import re
from array import array
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, chain
from re import _casefix  # the extra case equivalences re.IGNORECASE applies (private, stable since 3.11)
from typing import Iterator, Sequence

import ahocorasick

from text_deid.clinical.terms import vocabulary
from text_deid.normal_form import Folded, fold, fold_value
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


def _name_words(value: str) -> list[str]:
    """A name's words less its titles. A title stands first ("Dr. Adam Smith", "Mr Smith") or ends with a dot
    ("John Smith Jr."); elsewhere, or alone, a word that spells one is a name: "Anh Do", a family name "Miss"."""
    tokens = [t for t in re.split(r"[\s,]+", value) if t]
    if len(tokens) < 2:
        return tokens
    return [t for i, t in enumerate(tokens) if not ((i == 0 or t.endswith(".")) and t.rstrip(".").lower() in TITLES)]


# A name part of at least INFLECTED_LETTERS letters is also found with a title glued before it and digits after it
# ("MrQqqplanted", "Zyxwvut604"), and a family name with a plural ending ("KOWALCZYKS"; a given name's plural is
# more often something else: "Johns Hopkins"); a part of at least DISTINCTIVE_LETTERS, inside any longer token, and
# reversed (a `<bdo dir="rtl">`), unless that token is an English or clinical word (see `_keeps`).
INFLECTED_LETTERS, DISTINCTIVE_LETTERS = 4, 5
GLUED_TITLE, ENDING, FAMILY_ENDING = r"(?:mrs|mr|ms|miss|dr)?", r"(?:\d+)?", r"(?:e?s|\d+)?"


def _letters(word: str) -> int:
    return sum(c.isalpha() for c in word)


def _name_part_form(part: str, family: bool) -> str:
    if _letters(part) >= INFLECTED_LETTERS:
        return GLUED_TITLE + re.escape(part) + (FAMILY_ENDING if family else ENDING)
    return re.escape(part)


def _distinctive_parts(value: str) -> list[str]:
    """The name's parts long enough to be looked for inside longer tokens and reversed."""
    return [t for t in _name_words(value) if _letters(t) >= DISTINCTIVE_LETTERS]


def _is_name_token(token: str) -> bool:
    """A word that can be a name on its own: two characters or more, a letter among them (a house number a
    sender put in a name field, "29", would mask the 29 of a range)."""
    return len(token.rstrip(".")) >= 2 and any(c.isalpha() for c in token)


def _name_forms(value: str) -> list[str]:
    tokens = _name_words(value)
    forms = [_name_part_form(t, i == len(tokens) - 1) for i, t in enumerate(tokens) if _is_name_token(t)]
    if len(tokens) >= 2:
        family, given = tokens[-1], tokens[0]
        forms += [
            r"\s+".join(map(re.escape, tokens)),
            re.escape(family) + r",\s*" + re.escape(given),
            re.escape(given[0]) + r"\.?\s*" + re.escape(family),  # "J. Smith", "J Smith"
            re.escape(family) + r",?\s+" + re.escape(given[0]) + r"\.",  # "Smith, J."
        ]
    return forms


def _digits_form(value: str, min_digits: int) -> list[str]:
    digits = re.sub(r"\D", "", value)
    if len(digits) == 11 and digits.startswith("1"):
        digits = digits[1:]
    if len(digits) < min_digits:
        return []
    return [r"(?:\+?1[\s.\-]*)?\(?" + r"[\s().\-]*".join(digits)]


def _identifier_form(value: str) -> list[str]:
    """The value with or without its separators: "999-12-9623", "999129623", "999 12 9623"."""
    groups = [g for g in re.split(r"[^0-9A-Za-z]+", value) if g]
    if len("".join(groups)) < 4:
        return []  # identifiers of three characters or fewer are not PHI under Safe Harbor
    forms = [r"[\s\-./]?".join(map(re.escape, groups))]
    if len(groups) == 1 and re.fullmatch(r"\d{9}", groups[0]):  # an SSN-shaped number written in groups
        d = groups[0]
        forms.append(rf"{d[:3]}[\s\-]?{d[3:5]}[\s\-]?{d[5:]}")
    return forms


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


MONTH_RE = "|".join(f"{m}|{m[:3]}" for m in MONTHS) + "|Sept"
ORD = r"(?:st|nd|rd|th)?"
_SHAPES = (
    rf"(?P<iso>\d{{4}})(?P<s1>[/.\-])(?P<iso_m>\d{{1,2}})(?P=s1)(?P<iso_d>\d{{1,2}})"
    rf"|(?P<compact>(?:19|20)\d{{6}})"
    rf"|(?P<a>\d{{1,2}})(?P<s2>[/.\-])(?P<b>\d{{1,2}})(?P=s2)'?(?P<y>\d{{4}}|\d{{2}})"
    rf"|(?P<mon1>{MONTH_RE})\.?\s+(?P<d1>\d{{1,2}}){ORD},?\s+(?:of\s+)?'?(?P<y1>\d{{4}}|\d{{2}})"
    rf"|(?P<d2>\d{{1,2}}){ORD}\s+(?:of\s+)?(?P<mon2>{MONTH_RE})\.?,?\s+'?(?P<y2>\d{{4}}|\d{{2}})"
)
DATE_SHAPE_RE = re.compile(rf"{B}(?:{_SHAPES}){E}", re.IGNORECASE)
# The same shapes glued to letters ("DOB19800312", "born1980-03-12", "dob:03/12/1980x"): only a digit either side
# refuses them, so a run of digits inside a code is never cut into one; they count only as a known day.
GLUED_DATE_RE = re.compile(rf"(?<![0-9])(?:{_SHAPES})(?![0-9])", re.IGNORECASE)
MONTH_NUMBER = ({m.lower(): i + 1 for i, m in enumerate(MONTHS)} | {m[:3].lower(): i + 1 for i, m in enumerate(MONTHS)}
                | {"sept": 9})


# DATE_SHAPE_RE is slow to try at every character (IGNORECASE, month names, a look-behind first). A match
# can only start after a character that is not an ASCII letter or digit, at the first three letters of a
# month, or at digits that begin one of its shapes (a year and its separator, a compact date, a day or month
# and its separator, a day before a month's name), so a case-sensitive search of the lowercased text, which
# re runs at C speed, finds every place worth trying. Lowercasing keeps each character one character, and
# keeps ASCII letters and digits apart from the rest, once "İ" and the Kelvin sign (no month, ordinal or
# "of" has an i or a k) are set aside; tests/test_known_matcher.py checks this over every code point.
_MONTH_STARTS = "|".join(m[:3].lower() for m in MONTHS).replace("sep", "[sſ]ep")
_FIRST_LETTERS = "".join(sorted({m[0].lower() for m in MONTHS})) + "ſ"  # (the long s of "ſep")
# the first look-ahead (a digit or a month's first letter) rules out most places before the alternatives are tried
_DATE_STARTS = re.compile(rf"[^0-9a-z](?=[\d{_FIRST_LETTERS}])(?=\d{{1,2}}[/.\-]|\d{{4}}[/.\-]|(?:19|20)\d{{6}}"
                          rf"|\d{{1,2}}(?:[sſ]t|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTH_STARTS})|{_MONTH_STARTS})")
_ALNUM_WHEN_LOWERED = ("\u0130", "\u212a")


# Where a glued date can start: after a letter, at the start of any shape; after anything but a digit, at a shape
# that a letter follows (a run of at most 11 digits and separators, the longest numeric shape; a day, at most a
# 2-letter ordinal, a month and a year; a month, at most 6 more letters and a dot, a day, an ordinal and a comma, and
# a year). "İ" and the Kelvin sign are NUL in the lowered text, "ſ" and "ı" themselves (re.IGNORECASE letters).
_GLUED_LETTER = "[a-z\x00\u017f\u0131]"
_GLUED_STARTS = re.compile(
    rf"[^0-9](?=[\d{_FIRST_LETTERS}])(?:"
    rf"(?<={_GLUED_LETTER})(?=\d{{1,2}}[/.\-]|\d{{4}}[/.\-]|(?:19|20)\d{{6}}"
    rf"|\d{{1,2}}(?:[sſ]t|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTH_STARTS})|(?:{_MONTH_STARTS})\S{{0,7}}\s+\d)"
    rf"|(?=\d[\d/.\-']{{4,10}}{_GLUED_LETTER}"
    rf"|\d{{1,2}}\S{{0,2}}\s+(?:of\s+)?(?:{_MONTH_STARTS})\S{{0,8}}\s+'?\d{{2,4}}{_GLUED_LETTER}"
    rf"|(?:{_MONTH_STARTS})\S{{0,7}}\s+\d{{1,2}}\S{{0,3}}\s+(?:of\s+)?'?\d{{2,4}}{_GLUED_LETTER}))")


def _lowered(text: str) -> str:
    """`text` lowercased one character to one, with a character before it (a match's place is one on)."""
    for c in _ALNUM_WHEN_LOWERED:
        if c in text:
            text = text.replace(c, "\x00")
    return ("\n" + text).lower()


def date_shapes(text: str) -> Iterator[re.Match]:
    """What `DATE_SHAPE_RE.finditer(text)` yields, trying the pattern only where a match can start."""
    pos, match = 0, DATE_SHAPE_RE.match
    for start in _DATE_STARTS.finditer(_lowered(text)):
        p = start.start()  # the place in `text` of the character after the one this found
        if p >= pos and (m := match(text, p)):
            yield m
            pos = m.end()


def glued_date_shapes(text: str) -> Iterator[re.Match]:
    """From left to right, the matches of GLUED_DATE_RE that a letter touches (those `date_shapes` leaves) and
    that do not overlap one found before."""
    pos, match = 0, GLUED_DATE_RE.match
    for start in _GLUED_STARTS.finditer(_lowered(text)):
        p = start.start()
        if p >= pos and (m := match(text, p)) and glued(m, text):
            pos = m.end()
            yield m


def glued(m: re.Match, text: str) -> bool:
    """Whether a letter touches the match: one `DATE_SHAPE_RE`'s word edges refuse (with "ſ", "K", "İ", "ı")."""
    return bool(_LETTER.fullmatch(text[m.start() - 1:m.start()]) or _LETTER.fullmatch(text[m.end():m.end() + 1]))


_LETTER = re.compile("[A-Za-z]", re.IGNORECASE)


def _years(y: str) -> list[int]:
    return [int(y)] if len(y) == 4 else [1900 + int(y), 2000 + int(y)]


def date_readings(m: re.Match) -> set[tuple[int, int, int]]:
    """Every (year, month, day) a written date could mean (3/7/21: March 7 or July 3, 1921 or 2021)."""
    g = m.groupdict()
    if g["iso"]:
        return {(int(g["iso"]), int(g["iso_m"]), int(g["iso_d"]))}
    if g["compact"]:
        c = g["compact"]
        return {(int(c[:4]), int(c[4:6]), int(c[6:]))}
    if g["a"]:
        a, b = int(g["a"]), int(g["b"])
        return {(y, mm, dd) for y in _years(g["y"]) for mm, dd in ((a, b), (b, a))}
    if g["mon1"]:
        return {(y, MONTH_NUMBER[g["mon1"].lower()], int(g["d1"])) for y in _years(g["y1"])}
    return {(y, MONTH_NUMBER[g["mon2"].lower()], int(g["d2"])) for y in _years(g["y2"])}


def _known_dates(known: tuple[KnownIdentifier, ...]) -> frozenset[tuple[int, int, int]]:
    days = set()
    for k in known:
        if k.category == "DATE":
            m = ISO_DATE_RE.match(k.value.strip())
            if m:
                days.add(tuple(int(g) for g in m.groups()))
    return frozenset(days)


def _needle_words(known: KnownIdentifier) -> list[str]:
    """Strings at least one of which every match of `forms(known)` contains (before projection).

    Kept beside `forms()`: each branch names what all of that branch's forms share. An empty list means
    "no cheap necessary condition" and the identifier's forms are always tried.
    """
    c, v = known.category, known.value.strip()
    if c == "NAME":
        tokens = _name_words(v)
        words = [t for t in tokens if _is_name_token(t)]
        words += [p[::-1] for p in _distinctive_parts(v)]  # a reversed part holds no other needle
        return words + tokens[-1:] if len(tokens) >= 2 else words  # every multi-token form holds the family name
    if c in ("PHONE_NUMBER", "FAX_NUMBER"):
        digits = re.sub(r"\D", "", v)
        return [digits[1:] if len(digits) == 11 and digits.startswith("1") else digits]
    if c in ID_CATEGORIES:
        return ["".join(re.split(r"[^0-9A-Za-z]+", v))]  # the groups, whatever separated them
    if c == "GEOGRAPHIC_LOCATION" and re.fullmatch(r"\d{5}(?:-\d{4})?", v):
        return [v[:5]]
    if c not in ("EMAIL_ADDRESS", "URL", "IP_ADDRESS"):
        words = [w for w in re.split(r"[\s,]+", v) if w]
        if len(words) >= 3 and words[-1].rstrip(".").lower() in STREET_SUFFIXES:
            words = words[:-1]  # the street form without its suffix is the shorter one
        return ["".join(words)]
    return [v]  # e-mail, URL, IP: the value itself


# The prefilter compares a projection of the text with projections of the needles. The projection must
# keep every regex match visible: it folds case exactly as `re.IGNORECASE` does (simple lowercase, plus the
# extra equivalences such as "ſ"/"s" that `re` adds), and it deletes every separator the forms allow
# between the pieces of a value (whitespace and "()-./,"), so "555 (123)-4567" projects to "5551234567".
_EQUIVALENT = {chr(a): chr(min(group)) for a, group in
               ((a, (a, *others)) for a, others in _casefix._EXTRA_CASES.items())}
_SEPARATORS = {chr(c): None for c in range(0x3100) if chr(c).isspace()} | {c: None for c in "()-./,"}
_BEFORE_LOWER = str.maketrans({"\u0130": "i"})  # "İ": the one letter whose str.lower() is not its simple lowercase
_AFTER_LOWER = str.maketrans({**_EQUIVALENT, **_SEPARATORS})


def _ascii_projection() -> tuple[bytes, bytes]:
    """`_AFTER_LOWER` on ASCII as a bytes.translate table and the characters it deletes: ASCII text projects at
    C speed (str.translate looks each character up in a dict). Every ASCII character maps to ASCII or nothing."""
    table, delete = bytearray(range(256)), bytearray()
    for c in range(128):
        to = _AFTER_LOWER.get(c, c)
        if to is None:
            delete.append(c)
        else:
            table[c] = ord(to) if isinstance(to, str) else to
    return bytes(table), bytes(delete)


_ASCII_TABLE, _ASCII_DELETE = _ascii_projection()


def project(text: str) -> str:
    """Case-folded as `re.IGNORECASE` compares, separators removed: what the needles are looked up in."""
    if text.isascii():  # "İ" is not ASCII, and ASCII lowercases to ASCII
        return text.lower().encode("ascii").translate(_ASCII_TABLE, _ASCII_DELETE).decode("ascii")
    return text.translate(_BEFORE_LOWER).lower().translate(_AFTER_LOWER)


# The automaton holds the first NEEDLE_PREFIX characters of each needle, not all of them: whole needles made it
# 60 MB for the 55,000 of a 50 MB collection Bundle (mostly 32-character ids), 9 MB with 8 characters. A needle is
# then compared whole where its prefix is found.
NEEDLE_PREFIX = 8


@dataclass(frozen=True)
class _Candidate:
    category: str
    needles: tuple[str, ...]  # projected; empty: always tried
    forms: tuple[str, ...]  # matched between word edges
    inner: tuple[str, ...] = ()  # matched anywhere, kept as `_keeps` says


def inner_forms(known: KnownIdentifier) -> list[str]:
    """Regular expressions for a name's distinctive parts inside longer tokens: as written and reversed."""
    if known.category != "NAME":
        return []
    parts = _distinctive_parts(known.value.strip())
    return [re.escape(p) for p in parts] + [re.escape(p[::-1]) for p in parts]


@lru_cache(maxsize=65536)
def _candidate(known: KnownIdentifier) -> _Candidate | None:
    """One identifier's forms and needles, in normal form. Cached: a patient's name, phone and address recur in
    every resource of a bulk export, while each resource's own ids and dates make its set of identifiers new."""
    known = KnownIdentifier(fold_value(known.value), known.category)
    if known.category == "DATE" or not (alternatives := forms(known)):
        return None
    inner = inner_forms(known)
    needles = tuple(project(w) for w in _needle_words(known))
    return _Candidate(known.category, () if "" in needles else needles, tuple(alternatives), tuple(inner))


@lru_cache(maxsize=4096)
def _alternation(edged: tuple[str, ...], inner: tuple[str, ...] = ()) -> re.Pattern:
    """Forms between word edges first (the longest first), then forms found anywhere (group `inner`)."""
    pattern = f"{B}(?:{'|'.join(edged)}){E}" if edged else ""
    if inner:
        pattern += ("|" if pattern else "") + f"(?P<inner>{'|'.join(inner)})"
    return re.compile(pattern, re.IGNORECASE)


LONGEST_WORD = 30  # letters around a part beyond this: not a word, and not read further for each match
ENGLISH_ZIPF = 2.0  # a token at least this frequent in English (wordfreq's Zipf scale: once per 10 million words)


@lru_cache(maxsize=65536)
def _a_word(token: str) -> bool:
    """An English word (wordfreq) or a clinical one (the clinical vocabulary: "patellofemoral", "parkinsonism")."""
    from wordfreq import zipf_frequency  # 0.15 s to import and 0.3 s to load its list: only once a part is met inside a token

    return zipf_frequency(token, "en") >= ENGLISH_ZIPF or vocabulary().is_word(token)


def _keeps(m: re.Match, text: str) -> bool:
    """A form matched between word edges is kept; a distinctive part inside a longer token is kept unless the
    token is an English or clinical word ("Stone" in "gallstones", "Porter" in "reporter", "Patel" in
    "patellofemoral")."""
    if m.end() <= m.start():
        return False
    if m.lastgroup != "inner":
        return True
    start, end = m.start(), m.end()
    while start > 0 and text[start - 1].isalnum() and m.start() - start < LONGEST_WORD:
        start -= 1
    while end < len(text) and text[end].isalnum() and end - m.end() < LONGEST_WORD:
        end += 1
    if end - start - len(m[0]) >= LONGEST_WORD:
        return True
    return (start, end) == m.span() or not _a_word(text[start:end].lower())


def search(pattern: re.Pattern, folded: Folded) -> Iterator[tuple[int, int]]:
    """The original text's spans of the pattern's kept matches in the folded text."""
    text = folded.text
    for m in pattern.finditer(text):
        if _keeps(m, text):
            yield folded.original(m.start(), m.end())


# A distinctive name part written in pieces ("Kowa lczyk", "Kowa-\nlczyk", "Kowa\\.br\\lczyk"): the pieces are
# whole words whose letters, read together, spell the part; at most SPLIT_PIECES of them, SPLIT_GAP characters apart
# (a run of white space counts as one: table cells rendered or written on lines of their own, "Kowa</td>\n    <td>lczyk"),
# and not all English or clinical words of three letters or more ("new man" is not "Newman").
SPLIT_PIECES, SPLIT_GAP = 3, 12
_NOT_LETTER = re.compile(r"[\W\d_]+")
_LETTER_RUN = re.compile(r"[^\W\d_]+")
_SPACE_RUN = re.compile(r"\s+")
_TAG = re.compile(r"<[^<>]{0,40}>")  # markup between the pieces ("Kowa<br/>lczyk") is no letters of the part


def _gap(between: str) -> int:
    """Characters between two pieces, a run of white space counted as one."""
    return len(between) if len(between) <= SPLIT_GAP else len(_SPACE_RUN.sub(" ", between))


def _split_automaton(known: tuple[KnownIdentifier, ...]):
    """An Aho-Corasick automaton of the distinctive name parts, letters only, lower case (None: no such part).
    A part with digits is left out: its digits are what splits it ("Zorbel2son" is not "Zorbel5son")."""
    parts = {letters for k in known if k.category == "NAME"
             for p in _distinctive_parts(fold_value(k.value).strip()) if not any(c.isdigit() for c in p)
             if len(letters := _NOT_LETTER.sub("", p.lower())) >= DISTINCTIVE_LETTERS}
    if not parts:
        return None
    automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
    for part in parts:
        automaton.add_word(part, len(part))
    automaton.make_automaton()
    return automaton


def split_parts(automaton, folded: Folded) -> list[tuple[int, int]]:
    """The original text's spans of distinctive name parts written in pieces."""
    text = folded.text.lower()
    if automaton is None or len(text) != len(folded.text):
        return []
    if "<" in text:
        text = _TAG.sub(lambda m: " " * len(m[0]), text)
    hits = list(automaton.iter(_NOT_LETTER.sub("", text)))
    if not hits:
        return []
    runs = [m.span() for m in _LETTER_RUN.finditer(text)]
    starts = list(accumulate((e - s for s, e in runs), initial=0))  # where each run starts among the letters
    out = []
    for end, length in hits:
        a, b = end - length + 1, end + 1
        i, j = bisect.bisect_right(starts, a) - 1, bisect.bisect_right(starts, b - 1) - 1
        if i == j or j - i + 1 > SPLIT_PIECES or starts[i] != a or starts[j + 1] != b:
            continue  # one word (the regex's business), too many pieces, or pieces of longer words
        if any(_gap(text[runs[k][1]:runs[k + 1][0]]) > SPLIT_GAP for k in range(i, j)):
            continue
        if all(e - s >= 3 and _a_word(text[s:e]) for s, e in runs[i:j + 1]):
            continue  # words of their own ("new man"); a piece of one or two letters is no word here ("Wałę sa")
        out.append(folded.original(runs[i][0], runs[j][1]))
    return out


class KnownMatcher:
    """A record's known identifiers, compiled once: an Aho-Corasick automaton over the prefixes of every
    identifier's needles, whose one pass over a text tells which identifiers the text can hold, however many the
    record knows; per text, one case-insensitive alternation per category (longest forms first) over those
    identifiers' forms; and the known days (dates are matched by their shape and looked up, not spelled out in
    every format)."""

    def __init__(self, known: tuple[KnownIdentifier, ...]):
        self.candidates = tuple(c for k in known if (c := _candidate(k)) is not None)
        self.days = _known_dates(known)
        self._split = _split_automaton(known)
        self._always = tuple(c for c in self.candidates if not c.needles)  # no needle: tried in every text
        selects: dict[str, list[_Candidate]] = {}  # needle -> the identifiers it lets through
        for c in self.candidates:
            for needle in dict.fromkeys(c.needles):
                selects.setdefault(needle, []).append(c)
        by_prefix: dict[str, list[str]] = {}
        for needle in selects:
            by_prefix.setdefault(needle[:NEEDLE_PREFIX], []).append(needle)
        # needles numbered prefix by prefix: those of prefix p are numbers _first[p] to _first[p + 1] - 1
        self._needles = tuple(n for group in by_prefix.values() for n in group)
        self._selects = tuple(tuple(selects[n]) for n in self._needles)
        self._first = array("l", accumulate(map(len, by_prefix.values()), initial=0))
        self._prefix_length = bytes(map(len, by_prefix))
        self._automaton = None
        if by_prefix:
            automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
            for number, prefix in enumerate(by_prefix):
                automaton.add_word(prefix, number)
            automaton.make_automaton()
            # never changed from here on: a search's state is its own iterator's, so threads share the automaton
            self._automaton = automaton

    def _needles_in(self, texts: Sequence[str], joined: str) -> dict[int, set[int]]:
        """For each text (by index) that holds a needle, the numbers of the needles it holds: one pass of the
        automaton over the texts' projections joined by NULs (which the projection keeps) finds the needles'
        prefixes, and each needle is compared whole where its prefix is. `joined`: the texts joined by SEPARATOR."""
        if self._automaton is None:
            return {}
        projected = project(joined)
        if projected.count("\x00") == len(texts) - 1:
            ends = [m.start() for m in _NUL.finditer(projected)]  # where each text's projection ends
        else:  # a text holds a NUL of its own: project the texts one by one to tell them apart
            parts = [project(t) for t in texts]
            projected = "\x00".join(parts)
            ends = [n - 1 for n in accumulate(len(p) + 1 for p in parts[:-1])]
        ends.append(len(projected))
        needles, first, prefix_length, starts_with = self._needles, self._first, self._prefix_length, projected.startswith
        holds: dict[int, set[int]] = {}
        for end, p in self._automaton.iter(projected):
            start = end - prefix_length[p] + 1
            i = bisect.bisect_left(ends, start)  # the text the prefix starts in (or its end: a NUL in the needle)
            for n in range(first[p], first[p + 1]):
                needle = needles[n]
                if start + len(needle) <= ends[i] and starts_with(needle, start):
                    holds.setdefault(i, set()).add(n)
        return holds

    def _patterns(self, needles: set[int] | None) -> list[tuple[str, re.Pattern]]:
        """Per category, in category order, the alternation of the forms of the identifiers these needles let
        through, and of those without needles."""
        by_category: dict[str, tuple[set[str], set[str]]] = {}
        for c in chain(self._always, *(self._selects[n] for n in needles or ())):
            edged, inner = by_category.setdefault(c.category, (set(), set()))
            edged.update(c.forms)
            inner.update(c.inner)
        return [(category, _alternation(_longest_first(edged), _longest_first(inner)))
                for category, (edged, inner) in sorted(by_category.items())]

    def _searched(self, texts: Sequence[str], joined: str) -> Iterator[tuple[int, list[tuple[str, re.Pattern]]]]:
        """(index, patterns) of each text worth a regex search: those holding a needle, or all of them when
        some identifier has no needle."""
        if not self.candidates:
            return  # nothing to look for (a text checked without a record): skip projecting the texts
        holds = self._needles_in(texts, joined)
        for i in range(len(texts)) if self._always else holds:
            yield i, self._patterns(holds.get(i))

    def _folded(self, texts: Sequence[str]) -> tuple[list[Folded], str]:
        folded = [fold(t) for t in texts] if self.candidates else []
        return folded, SEPARATOR.join(f.text for f in folded)

    def find_many(self, texts: Sequence[str], detector: str) -> list[list[Span]]:
        """Every occurrence of every known identifier in each of `texts` (compared in normal form)."""
        found: list[list[Span]] = [[] for _ in texts]
        folded, joined_folded = self._folded(texts)
        for i, patterns in self._searched([f.text for f in folded], joined_folded):
            spans = found[i]
            for category, pattern in patterns:
                spans.extend(Span(start, end, category, detector, 1.0) for start, end in search(pattern, folded[i]))
        if self._split is not None:
            for i, f in enumerate(folded):
                found[i].extend(Span(start, end, "NAME", detector, 1.0) for start, end in split_parts(self._split, f))
        if self.days and texts:  # one search of the texts joined: no date shape can match across a NUL
            joined = SEPARATOR.join(texts)
            starts, pos = [], 0
            for text in texts:
                starts.append(pos)
                pos += len(text) + len(SEPARATOR)
            for m in chain(date_shapes(joined), glued_date_shapes(joined)):
                if date_readings(m) & self.days:
                    i = bisect.bisect_right(starts, m.start()) - 1
                    found[i].append(Span(m.start() - starts[i], m.end() - starts[i], "DATE", detector, 1.0))
        return found

    def find(self, text: str, detector: str) -> list[Span]:
        """Every occurrence of every known identifier in `text`."""
        return self.find_many((text,), detector)[0]

    def occurs_in_any(self, texts: Sequence[str]) -> bool:
        """Whether `find_many(texts)` finds anything; stops at the first occurrence a regex finds."""
        folded, joined_folded = self._folded(texts)
        for i, patterns in self._searched([f.text for f in folded], joined_folded):
            for _, pattern in patterns:
                if any(_keeps(m, folded[i].text) for m in pattern.finditer(folded[i].text)):
                    return True
        if not self.days:
            return False
        joined = SEPARATOR.join(texts)
        return any(date_readings(m) & self.days for m in chain(date_shapes(joined), glued_date_shapes(joined)))


def _longest_first(alternatives: set[str]) -> tuple[str, ...]:
    """Longest first, so a name written whole wins over its parts; a part's affixes do not count."""
    def literal_length(form: str) -> int:
        return len(form.replace(GLUED_TITLE, "").replace(FAMILY_ENDING, "").replace(ENDING, ""))

    return tuple(sorted(alternatives, key=lambda a: (-literal_length(a), a)))


def compile_known(known: tuple[KnownIdentifier, ...]) -> KnownMatcher:
    """The matcher for a record's known identifiers, shared by its texts and its leak guard. A record asks
    with one tuple several times (its texts, its terms, its guard): the last tuple is recognised by identity
    (it is held here, so its id cannot be reused), before the cache hashes every identifier again."""
    global _LAST_COMPILED
    last = _LAST_COMPILED
    if last[0] is known:
        return last[1]
    matcher = _compiled(known)
    _LAST_COMPILED = (known, matcher)  # one assignment: a thread reads the old pair or the new
    return matcher


@lru_cache(maxsize=256)
def _compiled(known: tuple[KnownIdentifier, ...]) -> KnownMatcher:
    return KnownMatcher(known)


_LAST_COMPILED: tuple = (object(), None)  # (the last tuple asked for, its matcher)


def find_known(text: str, known: tuple[KnownIdentifier, ...], detector: str = "known") -> list[Span]:
    """Every occurrence of every known identifier in `text`."""
    return compile_known(known).find(text, detector)


SEPARATOR = "\n\x00\n"  # between texts searched together: no form can match across a NUL
_NUL = re.compile("\x00")  # what SEPARATOR projects to


def find_known_many(texts: Sequence[str], known: tuple[KnownIdentifier, ...], detector: str = "known") -> list[list[Span]]:
    """`find_known` for each text, in one pass over them all (a record has many short texts)."""
    return compile_known(known).find_many(texts, detector)


def occurs_in_any(texts: Sequence[str], known: tuple[KnownIdentifier, ...]) -> bool:
    """Whether `find_known_many(texts, known)` finds anything, in one pass that stops at the first occurrence."""
    return compile_known(known).occurs_in_any(texts)


class KnownIdentifierDetector:
    """Finds the record's own identifiers (names, dates, MRNs, phones, address parts) in its narrative."""

    name = "known"
    # Its forms are escaped literals joined by separator classes that exclude the literals' characters, so
    # a search is linear in the text and cannot run away: the stack runs it in the calling thread.
    bounds_own_time = True

    def detect(self, text: str, known: Sequence[KnownIdentifier]) -> list[Span]:
        return find_known(text, tuple(known), self.name)

    def detect_many(self, texts: Sequence[str], known: Sequence[KnownIdentifier]) -> list[list[Span]]:
        return find_known_many(texts, tuple(known), self.name)
