"""Clinical values: a span filter that drops what a detector took for PHI but is a clinical value by its shape.

A date, phone, identifier, name or place span is dropped when all it covers lies inside one of these:

* a numeric range or comparator ("3.3-5.1", "3.6 - 5.1", "21–29", "<=4.0"), a measurement or dose with a
  UCUM unit or a dose form ("5.1 mmol/L", "0.025 %", "1-2 tablets");
* a LOINC code whose mod-10 check digit holds ("93043-8"; an identifier span only beside a code word or in
  a text made of codes, such as a linkId "/93043-8/56051-6"), a SNOMED CT id whose Verhoeff check digit
  holds, beside "SNOMED" or "SCT", an ICD-10/ICD-9, CPT/HCPCS, NDC, RxNorm or CVX code after its system's
  name, an NDC in a package code's shape (5-4-2), and an HL7 table id ("HL70335");
* a place span that is a US state or territory alone ("MA", "Texas"): Safe Harbor keeps states, so a place
  span ending in one ("Boston, MA") keeps only the city masked;
* a name or place span that is a drug name (the `drug-named-entity-recognition` dictionary) and no Census
  first name or surname, with no title or place cue before it;
* a capitalized common word inside a title-case phrase of clinical words ("Social Determinants Of Health").

Spans of the known-identifier detector are never dropped, nor the pattern detector's checksummed or labelled
identifiers (SSN, card, NPI, "MRN: ..."): of its spans only dates, phones, places and bare long numbers are.
"""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import mappings
from text_deid.clinical.codes import loinc_valid, snomed_valid
from text_deid.clinical_terms import marks_person_or_place, vocabulary
from text_deid.detectors.gazetteer import lexicon
from text_deid.spans import Span
from text_deid.validation import common_words

DATA = Path(mappings.__file__).resolve().parent / "data"
NAME, PLACE = "NAME", "GEOGRAPHIC_LOCATION"
IDENTIFIERS = frozenset({"MEDICAL_RECORD_NUMBER", "HEALTH_PLAN_BENEFICIARY_NUMBER", "ACCOUNT_NUMBER",
                         "CERTIFICATE_LICENSE_NUMBER", "VEHICLE_IDENTIFIER", "DEVICE_IDENTIFIER", "UNIQUE_IDENTIFIER"})
DROPPABLE = frozenset({NAME, PLACE, "DATE", "PHONE_NUMBER", "FAX_NUMBER"}) | IDENTIFIERS
# the pattern detector's spans that are shapes alone, without a checksum or a label
PATTERN_SHAPES = frozenset({"DATE", "PHONE_NUMBER", "FAX_NUMBER", PLACE})
BARE_NUMBER_CONFIDENCE = 0.5  # the pattern detector's unlabelled long numbers

NUM = r"\d{1,5}(?:\.\d+)?"
DASH = r"\s*(?:-|–|—|\bto\b)\s*"
RANGE_RE = re.compile(rf"(?<![\w.\-/]){NUM}(?P<gap>{DASH}){NUM}(?![\w\-/]|\.\d)")
COMPARATOR_RE = re.compile(rf"(?:<=|>=|=<|=>|<|>|≤|≥)\s?{NUM}(?![\w\-/]|\.\d)")
MEASURE_RE = re.compile(rf"(?<![\w.\-/]){NUM}(?:{DASH}{NUM})?\s?(?P<unit>[^\s,;:()\[\]{{}}<>]{{1,20}})")
RANGE_CUE_RE = re.compile(r"(?:\brange|\bref(?:erence)?|\bnormal|\bnl|\bbetween)\W{0,12}$", re.IGNORECASE)
# codes known by their shape: HL7 table ids, NDC package codes, LOINC-shaped codes (checked), long numbers (SNOMED?)
CODE_SHAPE_RE = re.compile(r"(?<!\w)(?P<hl7>HL7\d{4})(?!\w)|(?<![\w\-])(?P<ndc>\d{5}-\d{4}-\d{2})(?![\w\-])"
                           r"|(?<![\w\-.])(?:(?P<loinc>\d{3,7}-\d)|(?P<sct>[1-9]\d{5,17}))(?![\w\-]|\.\d)")
# a code system's name, and the shape of its codes, listed right after it ("ICD-10: E11.9, I10 and J45.909")
SYSTEM_RE = re.compile(r"\b(?:(?P<icd>ICD[-\s]?(?:10|9)?(?:[-\s]?(?:CM|PCS))?)|(?P<cpt>CPT|HCPCS)|(?P<ndc>NDC)"
                       r"|(?P<rx>RxNorm|RXCUI|CVX)|(?P<loinc>LOINC|loinc\.org)"
                       r"|(?P<sct>SNOMED(?:[-\s]?CT)?|SCT(?:ID)?|snomed\.info))\b", re.IGNORECASE)
SYSTEM_CODES = {
    "icd": re.compile(r"(?:[A-TV-Z]\d[0-9A-Z](?:\.[0-9A-Z]{1,4})?|[EV]?\d{2,3}(?:\.\d{1,2})?)(?![\w\-/]|\.\w)"),
    "cpt": re.compile(r"(?:\d{4}[0-9FTU]|[A-V]\d{4})(?![\w\-./])"),
    "ndc": re.compile(r"(?:\d{4}-\d{4}-\d{2}|\d{5}-\d{3,4}-\d{1,2}|\d{10,11})(?![\w\-./])"),
    "rx": re.compile(r"\d{1,7}(?![\w\-./])"),
    "loinc": re.compile(r"\d{3,7}-\d(?![\w\-]|\.\d)"),
}
SYSTEM_NAMES = ("icd", "cpt", "hcpcs", "ndc", "rxnorm", "rxcui", "cvx", "loinc", "snomed", "sct")  # SYSTEM_RE's, lowered
LIST_GAP_RE = re.compile(r"(?:[\s:;,#=()]|\b(?:and|or|codes?|is|CM|PCS)\b)*", re.IGNORECASE)
SYSTEM_REACH = 60  # characters between a SNOMED CT id and its system's name
# what a span that lies in a region holds: a digit, or a system's name ("NDC"); else no region is computed
MAY_BE_IN_REGION_RE = re.compile(r"\d|^[A-Za-z.\-]{3,10}$")
# a text made of codes and separators only: a structural key such as a linkId ("/93043-8/56051-6")
CODES_ONLY_RE = re.compile(r"^[\s/#.:|]*\d{3,7}-\d(?:[\s/#.:|,]+\d{3,7}-\d)*[\s/#.:|]*$")
# unit tokens that are also words of an address or English ("12 in", "Suite 5 PA"): never units here
NOT_UNITS = frozenset({"'", "''", "10", "a", "at", "in", "by", "pt", "us", "ar", "ir", "pc", "ph", "sb", "ch", "cd",
                       "st", "oe", "ao", "b", "c", "p", "q", "r", "t", "x", "n", "f", "j", "k", "v", "w"})
# dose forms and counted units written after a dose ("1-2 tablets", "2 puffs"); UCUM has only its own units
DOSE_UNITS = frozenset("""tab tabs tablet tablets cap caps capsule capsules puff puffs drop drops gtt gtts spray sprays
patch patches unit units dose doses application applications suppository suppositories vial vials ampule ampules
syringe syringes lozenge lozenges packet packets scoop scoops teaspoon teaspoons tsp tablespoon tablespoons tbsp
inhalation inhalations pill pills sachet sachets injection injections""".split())
STATE_PREFIX_RE = re.compile(r"^(?:the\s+)?state\s+of\s+", re.IGNORECASE)
TRAILING_STATE_RE = re.compile(r"(?P<keep>.*?[A-Za-z].*?)[\s,]+(?P<state>[A-Z]{2}|[A-Z][a-z]+(?:\s+[A-Z][a-z]+){0,2})\.?"
                               r"(?:,?\s+(?P<zip>\d{5}(?:-\d{4})?))?", re.DOTALL)
TITLE_RUN_BEFORE_RE = re.compile(r"(?:\b[A-Z][a-z]+\s+){1,4}(?:(?:of|Of|OF|and|And|for|For|the|The|in|In)\s+)?$")
POSSESSIVE_RE = re.compile(r"(?:['’]s|s['’]|['’])$")


DECIMAL_RE = re.compile(r"(?<![\w.\-/])\d{1,3}\.\d{1,3}(?![\w\-/]|\.\d)")  # "84.1": no date, phone or identifier
JOINT_RE = re.compile(r"[\s/,;]*")  # between two values or codes of one run ("84.1 82 - 97 fL", "/93042-0/63512-8")


@dataclass(frozen=True)
class Region:
    start: int
    end: int
    for_ids: bool  # also an identifier span inside it is dropped (values, codes with context); else names to dates


@lru_cache(maxsize=1)
def units() -> frozenset[str]:
    """UCUM's unit codes, symbols and names (and their plurals), less words of English and addresses."""
    words = set()
    for line in (DATA / "ucum-units.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            words.update((line, line + "s"))
    return frozenset(words - NOT_UNITS - states()) | DOSE_UNITS


@lru_cache(maxsize=1)
def drug_names() -> frozenset[str]:
    """Lowercase drug names and synonyms (mappings/data/drug-names.txt.gz)."""
    with gzip.open(DATA / "drug-names.txt.gz", "rt", encoding="utf-8") as fh:
        return frozenset(line.rstrip("\n") for line in fh if not line.startswith("#"))


@lru_cache(maxsize=1)
def states() -> frozenset[str]:
    """US states, territories and DC, by name and two-letter code, lowercased (the `us` package)."""
    import us

    every = us.states.STATES_AND_TERRITORIES + [us.states.DC]
    return frozenset({s.name.lower() for s in every} | {s.abbr.lower() for s in every} | {"d.c", "washington dc"})


@lru_cache(maxsize=1)
def _census_names() -> frozenset[str]:
    lex = lexicon()
    return lex.first_names | lex.all_surnames


def _is_range(low: str, high: str, gap: str, cue: bool) -> bool:
    """Whether "low-high" is a range: a decimal on either side; else whole numbers that rise, without a leading
    zero, in no phone or ZIP+4 shape ("555-1234", "02139-1234"), and, where they could be a month and a day
    ("3-12"), only with a spaced or other dash or a cue before ("ref range 3-12")."""
    if "." in low or "." in high:
        return True
    x, y = int(low), int(high)
    if x >= y or low.startswith("0") or (len(low), len(high)) in ((3, 4), (5, 4)):
        return False
    date_like = (1 <= x <= 12 and 1 <= y <= 31) or (1 <= x <= 31 and 1 <= y <= 12)
    return not date_like or gap != "-" or cue


def _is_unit(token: str) -> bool:
    return token.rstrip(".").lower() in units()


def value_regions(text: str) -> list[Region]:
    """Ranges, comparators and measurements in `text`."""
    found: list[Region] = []
    for m in MEASURE_RE.finditer(text):
        if _is_unit(m.group("unit")):
            found.append(Region(m.start(), m.start("unit") + len(m.group("unit").rstrip(".")), True))
    found += [Region(m.start(), m.end(), True) for m in COMPARATOR_RE.finditer(text)]
    found += [Region(m.start(), m.end(), True) for m in DECIMAL_RE.finditer(text)]
    for m in RANGE_RE.finditer(text):
        low, high = re.split(DASH, m.group(), maxsplit=1)
        cue = bool(RANGE_CUE_RE.search(text, max(0, m.start() - 30), m.start()))
        if _is_range(low, high, m.group("gap"), cue):
            found.append(Region(m.start(), m.end(), True))
    return found


def code_regions(text: str) -> list[Region]:
    """Codes of clinical code systems in `text` (see the module's docstring)."""
    found = []
    lowered = text.lower()
    systems = list(SYSTEM_RE.finditer(text)) if any(name in lowered for name in SYSTEM_NAMES) else []
    for s in systems:
        found.append(Region(s.start(), s.end(), False))  # the system's own name ("NDC") is no place
        shape = SYSTEM_CODES.get(s.lastgroup)
        pos = s.end()
        while shape and (m := shape.match(text, LIST_GAP_RE.match(text, pos).end())) is not None:
            found.append(Region(m.start(), m.end(), True))
            pos = m.end()
    for m in CODE_SHAPE_RE.finditer(text):
        kind, code = m.lastgroup, m.group()
        if kind in ("hl7", "ndc"):
            found.append(Region(m.start(), m.end(), False))
        elif kind == "loinc" and loinc_valid(code):
            found.append(Region(m.start(), m.end(), bool(CODES_ONLY_RE.match(text))))
        elif kind == "sct" and snomed_valid(code) and any(
                s.lastgroup == "sct" and m.start() - SYSTEM_REACH <= s.start() < m.end() + 20 for s in systems):
            found.append(Region(m.start(), m.end(), True))
    return found


def _core(text: str, span: Span) -> tuple[int, int]:
    """The span without the spaces and punctuation at its edges."""
    s, e = span.start, span.end
    while s < e and not text[s].isalnum():
        s += 1
    while e > s and not text[e - 1].isalnum() and text[e - 1] != "%":
        e -= 1
    return s, e


def _droppable(span: Span) -> bool:
    if span.category not in DROPPABLE or span.detector == "known":
        return False
    if span.detector == "patterns":
        return span.category in PATTERN_SHAPES or (
            span.category == "UNIQUE_IDENTIFIER" and span.confidence <= BARE_NUMBER_CONFIDENCE)
    return True


def runs(text: str, regions: list[Region]) -> list[Region]:
    """The regions joined where they overlap or only spaces, slashes or commas lie between them."""
    out: list[Region] = []
    for r in sorted(regions, key=lambda r: (r.start, -r.end)):
        last = out[-1] if out else None
        if last and (r.start <= last.end or JOINT_RE.fullmatch(text, last.end, r.start)):
            out[-1] = Region(last.start, max(last.end, r.end), last.for_ids and r.for_ids)
        else:
            out.append(r)
    return out


def _inside(start: int, end: int, regions: list[Region], category: str) -> bool:
    ids = category in IDENTIFIERS
    return any(r.start <= start and end <= r.end and (r.for_ids or not ids) for r in regions)


def _is_state(covered: str) -> bool:
    bare = STATE_PREFIX_RE.sub("", covered.strip(" ,.;:()")).strip()
    if len(bare) == 2:
        return bare.isupper() and bare.lower() in states()
    return " ".join(bare.lower().split()) in states()


def _is_drug(text: str, span: Span, covered: str) -> bool:
    words = [POSSESSIVE_RE.sub("", w).lower() for w in covered.split()]
    drugs = drug_names()
    if not words or not (" ".join(words) in drugs or all(w in drugs for w in words)):
        return False
    return not (any(w in _census_names() for w in words) or marks_person_or_place(text, span, weak=False))


def _in_clinical_phrase(text: str, span: Span, covered: str) -> bool:
    """One capitalized common word closing a title-case phrase with a clinical word ("Determinants Of Health")."""
    if " " in covered or not covered[:1].isupper() or covered.lower() not in common_words():
        return False
    run = TITLE_RUN_BEFORE_RE.search(text, max(0, span.start - 60), span.start)
    if run is None:
        return False
    vocab = vocabulary()
    return any(vocab.is_word(w.lower()) for w in run.group().split())


def _without_state(text: str, span: Span) -> list[Span]:
    """A place span ending in a state, perhaps and a ZIP code ("Boston, MA 02139"): its parts but the state."""
    m = TRAILING_STATE_RE.fullmatch(text, span.start, span.end)
    if m is None or not _is_state(m.group("state")):
        return [span]
    parts = [(span.start, span.start + len(m.group("keep").rstrip(" ,"))), m.span("zip")]
    return [Span(s, e, span.category, span.detector, span.confidence) for s, e in parts if e > s]


def drop_clinical_values(spans: list[Span], text: str) -> list[Span]:
    """The spans less those that cover only a clinical value (see the module's docstring)."""
    if not any(_droppable(s) for s in spans):
        return list(spans)
    regions: list[Region] | None = None  # computed for the first span that may lie in one
    kept = []
    for span in spans:
        if not _droppable(span):
            kept.append(span)
            continue
        start, end = _core(text, span)
        covered = text[start:end]
        if not covered:
            continue
        if MAY_BE_IN_REGION_RE.search(covered):
            if regions is None:
                found = value_regions(text) + code_regions(text)
                regions = found + runs(text, found)
            if _inside(start, end, regions, span.category):
                continue
        if span.category in (NAME, PLACE) and (_is_drug(text, span, covered) or _in_clinical_phrase(text, span, covered)):
            continue
        if span.category == PLACE:
            if not _is_state(covered):
                kept += _without_state(text, Span(start, end, span.category, span.detector, span.confidence))
            continue
        kept.append(span)
    return kept
