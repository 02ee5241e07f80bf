"""Shaped PHI in free text: dates, phones, e-mails, URLs, IPs, labelled identifiers, addresses, ages >= 90.

Design notes
------------
* Pattern definitions and checksum logic are borrowed from presidio-analyzer's predefined
  recognizers (SSN, credit card, IP, e-mail, URL, DEA, NPI) -- but every regex runs here, with
  the `regex` module under one deadline per text (each search gets `timeout=` what is left of it, and
  loops look at it between matches).  Presidio skips a pattern whose regex times out (fail open); this
  detector raises `DetectorError` instead (fail closed), and so stops working on that text.  Error messages name
  the stage only, never text from the input.
* Presidio's AnalyzerEngine is never called, and its e-mail `validate_result` (tldextract, which
  tries the network) is never used: e-mail domains are checked locally.
* Phones: a US regex (finds the fictional 555-xxx-xxxx numbers `phonenumbers` rejects) plus
  `phonenumbers.PhoneNumberMatcher` (leniency VALID) run only on short digit-dense windows, which
  keeps the detector fast.
* SSNs: presidio's invalidation is applied (000/666 area, 00 group, 0000 serial, all-same digits,
  mixed delimiters) EXCEPT its rejection of published sample numbers (123-45-6789, ...): real
  records and test data use them, and a de-identifier must not leak them.  Area numbers 9xx are
  accepted (ITINs, and Synthea writes fictional SSNs as 999-xx-xxxx).
* Labelled identifiers (MRN, account, insurance/member, licence, DEA, NPI, generic ID, serial
  numbers, VIN, plate) span the value only.  A value needs a digit; a purely numeric value needs
  at least 4 digits (3-digit identifiers are not PHI).
* Only ages >= 90 are AGE_OVER_89; bare years, times and weekdays are never DATE.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Sequence

import phonenumbers
import regex

from text_deid import budget
from text_deid.detectors import presidio_patterns as presidio
from text_deid.spans import DetectorError, KnownIdentifier, Span


DETECTOR = "patterns"

# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------
_MON = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?|tember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)(?![a-z])\.?"
)
_FULL_MON = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
_ORD = r"(?:st|nd|rd|th)"
_DAY = r"(?:[12]\d|3[01]|0?[1-9])"
_Y4 = r"(?:1[89]\d\d|20\d\d)"
_YEAR = rf"(?:{_Y4}|['’‘]\d\d)(?!\d)"

# A date spelled with a month name starts at the month (md, my) or before it (dm, rel); numeric forms follow.
_DATE_SRC = rf"""
  (?P<md>(?<![a-z])(?P<md_mon>{_MON})\s*{_DAY}{_ORD}?(?![a-z\d:])
        (?:\s*,?\s*(?:of\s+)?(?P<md_year>{_YEAR}))?)
| (?P<dm>(?<![\d/.:-]){_DAY}(?P<dm_ord>{_ORD})?(?:\s*(?:of\s+)?|-)(?P<dm_mon>{_MON})
        (?:,?\s*-?(?P<dm_year>{_YEAR}))?)
| (?P<my>(?<![a-z])(?P<my_mon>{_MON}),?\s+{_Y4}(?!\d))
| (?P<rel>\b(?:last|next|this|early|late|mid-?)\s+(?P<rel_mon>(?-i:{_FULL_MON}))\b)
| (?P<iso>(?<![\d.-]){_Y4}(?P<isep>[-/.])(?:0?[1-9]|1[0-2])(?P=isep)(?:[12]\d|3[01]|0?[1-9])
        (?:T\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)?(?![\d]))
| (?P<mdy>(?<![\d/.,-])(?P<a>\d{{1,2}})(?P<s>[/.-])(?P<b>\d{{1,2}})(?P=s)(?P<y>\d{{4}}|\d{{2}})(?![\d/-]|\.\d))
| (?P<mdn>(?<![\d/.,:-])(?P<m>\d{{1,2}})/(?P<d>\d{{1,2}})(?![\d/]|[.,]\d))
"""

_AGE_SRC = (r"""
  (?<![\d.,])(?P<age1>\d{2,3})(?:\s*|-)(?:years?|yrs?|y/o|y\.o\.?|yo)(?![a-z])
| \bage[ds]?\b(?:\s*(?:of|is|was|[:=])\s*|\s+)(?P<age2>\d{2,3})(?![\d.])
| \b(?:in|into)\s+(?:his|her|their|the)\s+(?:late\s+|early\s+|mid[-\s])?(?P<age3>(?:9|1[0-2])0'?s|nineties)\b
| \b(?P<age4>ninety(?:[-\s](?:one|two|three|four|five|six|seven|eight|nine))?|one\s+hundred(?:\s+and\s+[a-z]+)?)"""
            r"""[-\s]+(?:years?[-\s]+old|yo)\b
""")

# label families -> category.  Alternation order matters (longest / most specific first).
_LABELS: list[tuple[str, str, str]] = [
    ("ssn", "SOCIAL_SECURITY_NUMBER",
     r"SSN|SS\s*\#|social\s+sec(?:urity|\.)?(?:\s+(?:number|num|no))?"),
    ("veh", "VEHICLE_IDENTIFIER",
     r"VIN|vehicle\s+identification(?:\s+number)?|licen[cs]e\s+plate(?:\s+(?:number|num|no))?|plate\s+(?:number|num|no|\#)"),
    ("dev", "DEVICE_IDENTIFIER",
     r"serial(?:\s+(?:number|num|no))?|S/N|(?-i:SN)|device\s+(?:ID|identifier|number|no)|UDI|IMEI|implant\s+(?:ID|number|no)"),
    ("mrn", "MEDICAL_RECORD_NUMBER",
     r"MRN|MR\s*(?:\#|no\b|number)|medical\s+records?(?:\s+(?:number|num|no|ID))?|med(?:ical)?\.?\s+rec(?:ord)?s?\.?(?:\s+(?:number|num|no))?"
     r"|record(?:\s+(?:number|num|no|ID)|\s*\#)|chart\s+(?:number|num|no|ID|\#)|hospital\s+(?:number|no|ID)|unit\s+number"),
    ("acct", "ACCOUNT_NUMBER",
     r"acc(?:oun)?t\.?(?:\s+(?:number|num|no|ID))?|billing\s+(?:account|number|no|ID)|routing\s+number|invoice(?:\s+(?:number|no))?"),
    ("hp", "HEALTH_PLAN_BENEFICIARY_NUMBER",
     r"insurance(?:\s+(?:policy|plan|member|subscriber|card|carrier))?(?:\s+(?:ID|number|num|no))?"
     r"|insur\.?(?:\s+(?:policy|plan))?(?:\s+(?:ID|number|no))?|ins\.?(?:\s+(?:policy|plan))?(?:\s+(?:ID|number|no))?"
     r"|(?:health\s+)?plan\s+(?:beneficiary\s+)?(?:ID|number|num|no)|health\s+plan|policy(?:\s+(?:number|num|no|ID))?"
     r"|member(?:ship)?\s*(?:ID|number|num|no)|subscriber(?:\s+(?:ID|number|num|no))?|group\s+(?:number|num|no|ID)"
     r"|beneficiary(?:\s+(?:ID|number|num|no))?|Medicare(?:\s+(?:ID|number|no))?|Medicaid(?:\s+(?:ID|number|no))?|HICN|MBI"),
    ("lic", "CERTIFICATE_LICENSE_NUMBER",
     r"(?:driver'?s?\s+)?licen[cs]e(?:\s+(?:number|num|no|ID))?|lic\.?\s*(?:\#|no\b)|certificate(?:\s+(?:number|num|no|ID))?"
     r"|cert\.?\s*(?:\#|no\b|number)|DEA(?:\s+(?:registration|number|num|no))?"),
    ("npi", "UNIQUE_IDENTIFIER", r"NPI(?:\s+(?:number|num|no))?"),
    ("uid", "UNIQUE_IDENTIFIER",
     r"(?:patient|pt|subject|study|case|claim|encounter|visit|accession|specimen|sample|order|requisition|ref(?:erence)?"
     r"|employee|staff|badge|passport|tracking|transaction|confirmation|identification)\s*(?:ID\b|I\.D\.|\#|number|num\b|no\b|identifier|code)"
     r"|ref(?:erence)?\s*\#|case\s*\#|passport|identification(?:\s+number)?|identifier|I\.D\.|ID(?:\s+(?:number|num|no))?"),
]
_LABEL_CATEGORY = {key: cat for key, cat, _ in _LABELS}
_LABEL_SRC = (
    r"(?<![A-Za-z0-9])(?:" + "|".join(f"(?P<{k}>{src})" for k, _, src in _LABELS) + r")"
    r"(?P<sep>(?:\s|[:#=(\-]|\b(?:is|was|number|num|no|nr|ID|code)\b\.?){0,8}?)"
    r"(?P<val>(?=[A-Za-z0-9./-]*\d)[A-Za-z0-9](?:[A-Za-z0-9]|[-/.](?=[A-Za-z0-9])){1,40})(?![A-Za-z0-9])"
)
# a generic "ID" label takes the category of a nearby more specific word
_CONTEXT_RECLASS = [
    (regex.compile(r"medical\s+rec|\bMRN\b|\bchart\b", regex.I), "MEDICAL_RECORD_NUMBER"),
    (regex.compile(r"insur|\bplan\b|policy|member|medicare|medicaid|\bins\b", regex.I), "HEALTH_PLAN_BENEFICIARY_NUMBER"),
    (regex.compile(r"\bacc(?:oun)?t\b|billing", regex.I), "ACCOUNT_NUMBER"),
]

_STATE_ABBR = (
    "AL|AK|AZ|AR|CA|CO|CT|DE|DC|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV|NH|NJ|NM|NY|NC|ND|OH|OK|OR|PA"
    "|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY|PR|GU|VI|AS|MP"
)
_STATE_NAME = (
    "Alabama|Alaska|Arizona|Arkansas|California|Colorado|Connecticut|Delaware|Florida|Georgia|Hawaii|Idaho|Illinois"
    "|Indiana|Iowa|Kansas|Kentucky|Louisiana|Maine|Maryland|Massachusetts|Michigan|Minnesota|Mississippi|Missouri"
    "|Montana|Nebraska|Nevada|New\\s+Hampshire|New\\s+Jersey|New\\s+Mexico|New\\s+York|North\\s+Carolina|North\\s+Dakota"
    "|Ohio|Oklahoma|Oregon|Pennsylvania|Rhode\\s+Island|South\\s+Carolina|South\\s+Dakota|Tennessee|Texas|Utah|Vermont"
    "|Virginia|Washington|West\\s+Virginia|Wisconsin|Wyoming|Puerto\\s+Rico|District\\s+of\\s+Columbia"
)
_ZIP_SRC = (
    rf"(?:\b(?:{_STATE_ABBR})\b\.?|\b(?i:{_STATE_NAME})\b),?\s+(?P<zip>\d{{5}}(?:-\d{{4}})?)(?![\d-])"
    rf"|\b(?i:zip|postal)(?:\s*(?i:code))?\s*[:#]?\s*(?P<zip2>\d{{5}}(?:-\d{{4}})?)(?![\d-])"
)
_SUFFIX = (
    r"(?i:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Drive|Dr|Lane|Ln|Court|Ct|Place|Pl|Way|Terrace|Ter|Circle|Cir"
    r"|Highway|Hwy|Parkway|Pkwy|Square|Sq|Trail|Trl|Alley|Plaza|Pike|Crescent|Loop)"
)
_UNIT = r"(?:,?\s*(?:Apt|Apartment|Suite|Ste|Unit|Rm|Room|Fl|Floor|Bldg|Building|\#)\.?\s*\#?\s*[A-Za-z0-9]+(?:-[A-Za-z0-9]+)?)"
_STREET_SRC = (
    rf"(?P<street>(?<![\w.,/:-])(?P<num>\d{{1,6}}[A-Za-z]?)\s+(?:(?:[NSEW]|North|South|East|West|NE|NW|SE|SW)\.?\s+)?"
    rf"(?:(?:[A-Z][a-zA-Z'’-]*|\d+(?:st|nd|rd|th))\s+){{1,4}}?(?P<suf>{_SUFFIX})\b\.?(?:\s*(?:NE|NW|SE|SW)\b\.?)?{_UNIT}?)"
    rf"|(?P<named>(?<![\w])(?:[A-Z][a-z]+\s+){{1,3}}(?:Street|Avenue|Boulevard|Road|Lane)\b)"
    rf"|(?P<pobox>\b(?i:P\.?\s?O\.?\s*Box)\s*\#?\s*\d+)"
)

_US_PHONE_SRC = (
    r"(?<![\w+/.-])(?:\+?1[\s.-]?)?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4}"
    r"(?:\s*(?:x|ext\.?|extension)\s*\d{1,6})?(?![\w-]|\.\d)"
)
_LOCAL_PHONE_SRC = r"(?<![\w-])\d{3}-\d{4}(?![\w-])"
_PHONE_CAND_SRC = r"(?<![\w+])\+?\(?\d[\d \t().\-]{6,20}\d(?!\w)"

_SSN_SRC = r"(?<![\w-])\d{3}([- .])\d{2}\1\d{4}(?![\w-]|\.\d)"
_VIN_SRC = r"(?<![A-Za-z0-9])[A-HJ-NPR-Z0-9]{17}(?![A-Za-z0-9])"
_SCHEME_URL_SRC = r"(?i)\b(?:https?|s?ftp)://[^\s<>\"'()\[\]{}]+|\bwww\d{0,3}\.[^\s<>\"'()\[\]{}]+"

_COMMON_TLDS = frozenset(
    "com org net edu gov mil int info biz io us uk ca co health care app ai me de au eu".split()
)
_SAMPLE_SSNS = frozenset({"123456789", "987654320", "078051120"})
_FRACTIONS = frozenset({(1, 2), (1, 3), (2, 3), (1, 4), (3, 4), (1, 8), (3, 8), (5, 8), (7, 8)})

_MDN_BAD_BEFORE = regex.compile(
    r"(?:\bbp|b/p|blood\s+pressure|pressure|pain|score|scale|strength|power|motor|grade|murmur|rat(?:ed|es|ing|e)"
    r"|ratio|apgar|acuity|vision|reflex(?:es)?|gcs|sbp|dbp|\bx|dose|tab)\W{0,3}$",
    regex.I,
)
_MDN_BAD_AFTER = regex.compile(
    r"\s*(?:pain|strength|power|motor|murmur|scale|score|tab|tabs|tablets?|of\b|mm\s*hg|mmhg|cm\b|mm\b|in\b|dose|reflex"
    r"|ratio|x\b|times|units?|strength|%|ml\b|mg\b|cap|caps|[+-]|/)",
    regex.I,
)
_DATE_CONTEXT_BEFORE = regex.compile(
    r"(?:\bon|since|dated?|seen|visit|dob|admit(?:ted)?|discharged?|from|until|thru|through|f/u|follow[-\s]?up|by|before|after)\W{0,3}$",
    regex.I,
)
_FAX_CONTEXT = regex.compile(r"(?i)\bfax|(?-i:\bF\s*:)|\bphone|\btel\b|\bcell|\bmobile|\bpager|\bcontact|\bcall")
_PHONE_CONTEXT = regex.compile(r"(?i)\b(?:phone|tel|telephone|cell|call|contact|fax|pager|mobile|ph|beeper|ext)\b")


_DATE_NUM_SRC = r"""
  (?P<iso>(?<![\d.-])(?:1[89]\d\d|20\d\d)(?P<isep>[-/.])(?:0?[1-9]|1[0-2])(?P=isep)(?:[12]\d|3[01]|0?[1-9])
        (?:T\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)?(?![\d]))
| (?P<mdy>(?<![\d/.,-])(?P<a>\d{1,2})(?P<s>[/.-])(?P<b>\d{1,2})(?P=s)(?P<y>\d{4}|\d{2})(?![\d/-]|\.\d))
| (?P<mdn>(?<![\d/.,:-])(?P<m>\d{1,2})/(?P<d>\d{1,2})(?![\d/]|[.,]\d))
"""
_AGE_NUM_SRC = (r"(?<![\d.,])(?P<age>9\d|1[0-3]\d)(?:\s*|-)(?:years?|yrs?|y/o|y\.o\.?|yo)(?![a-z])"
                r"|\bage[ds]?\b(?:\s*(?:of|is|was|[:=])\s*|\s+)(?P<age2>9\d|1[0-3]\d)(?![\d.])")
_LABEL_ANCHOR_WORDS = (
    "ss social vin vehicle licen plate serial s/n sn device udi imei implant mr med record chart hospital unit acc "
    "billing routing invoice ins health plan policy member subscriber group beneficiary medicare medicaid hicn mbi "
    "driver lic cert dea npi patient pt subject study case claim encounter visit accession specimen sample order "
    "requisition ref employee staff badge passport tracking transaction confirmation identifi i.d id"
).split()
_ZIP_BEFORE_SRC = (
    rf"(?:(?:\b(?:{_STATE_ABBR})\b\.?|\b(?i:{_STATE_NAME})\b),?\s+|\b(?i:zip|postal)(?:\s*(?i:code))?\s*[:#]?\s*)$"
)
_ASCII_LOWER = {c: c + 32 for c in range(65, 91)}


@lru_cache(maxsize=None)
def bounded_per_position(source: str) -> bool:
    """True when every quantifier of the regex is bounded and it does not recurse.

    One match attempt then explores a bounded number of paths, so a scan is linear in the text and cannot run
    away: such a search needs no timeout (which costs the `regex` module a few microseconds per call, more
    than the scan of a short text). Escapes and character classes are dropped first, so `\\+` or `[+*]` do
    not count; anything unsure counts as unbounded.
    """
    plain = regex.sub(r"\\.", "", source)
    plain = regex.sub(r"\[\^?\]?[^\]]*\]", "", plain)
    return not regex.search(r"[*+]|\{\d*,\}|\(\?P[=>]|\(\?&|\(\?R|\(\?\d", plain)


def _date_alternatives(names: Sequence[str]) -> list[str]:
    """The alternatives of _DATE_SRC with these group names, as its own regex sources."""
    alternatives = [a.strip() for a in _DATE_SRC.split("\n| ")]
    return [a for a in alternatives if any(a.startswith(f"(?P<{name}>") for name in names)]


def _trie(words: list[str]) -> str:
    """A prefix-trie alternation (much faster than a flat one in `regex`)."""
    root: dict = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        alts = [regex.escape(k) + emit(v) for k, v in sorted(node.items()) if k != ""]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return "(?:" + emit(root) + ")"

_VIN_TRANSLIT = {
    **{str(d): d for d in range(10)},
    **dict(zip("ABCDEFGH", range(1, 9))),
    **dict(zip("JKLMN", range(1, 6))),
    "P": 7, "R": 9,
    **dict(zip("STUVWXYZ", range(2, 10))),
}
_VIN_WEIGHTS = (8, 7, 6, 5, 4, 3, 2, 10, 0, 9, 8, 7, 6, 5, 4, 3, 2)


def vin_check_digit_ok(vin: str) -> bool:
    """ISO 3779 / North American check digit (position 9)."""
    vin = vin.upper()
    if len(vin) != 17 or any(c not in _VIN_TRANSLIT for c in vin):
        return False
    total = sum(_VIN_TRANSLIT[c] * w for c, w in zip(vin, _VIN_WEIGHTS))
    check = total % 11
    return vin[8] == ("X" if check == 10 else str(check))


@lru_cache(maxsize=1024)
def _phone_matches(window: str, region: str) -> tuple[tuple[int, int], ...]:
    """phonenumbers' valid numbers in a short digit-dense window, as offsets in it. Cached: it costs ~1 ms a
    window, and text that repeats one window (a table, or "1.1.1.") would pay it again for each."""
    return tuple((m.start, m.end) for m in phonenumbers.PhoneNumberMatcher(window, region, leniency=phonenumbers.Leniency.VALID))


def _digits(s: str) -> str:
    return "".join(filter(str.isdigit, s))


@dataclass(frozen=True)
class _Scan:
    """One call's text, its lowered copy and its deadline: per-call state, never kept on the shared detector."""

    text: str
    low: str
    deadline: float  # time.monotonic() seconds
    bounded: frozenset  # the regexes that need no timeout (bounded_per_position)

    def remaining(self) -> float:
        """Seconds left; DetectorError once the deadline has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("over its time budget")
        return left

    def limit(self, pat: regex.Pattern) -> float | None:
        """The time limit of one search with `pat`: none for a pattern that cannot backtrack without bound."""
        left = self.remaining()
        return None if pat in self.bounded else left

    def iter(self, pat: regex.Pattern, text: str, pos: int = 0, endpos: int | None = None) -> Iterator:
        """`pat.finditer` that stops at the deadline, also between the matches of a pattern that needs no timeout."""
        for m in pat.finditer(text, pos, endpos, timeout=self.limit(pat)):
            yield m
            if time.monotonic() > self.deadline:
                self.remaining()


class PatternDetector:
    """Regex/checksum detector for shaped PHI.  Fails closed (DetectorError) past its deadline.  Thread-safe:
    what one call needs lives in its own _Scan."""

    name = DETECTOR
    bounds_own_time = True  # every search stops at the text's deadline (see _Scan): the stack runs it in-thread

    def __init__(self, timeout: float = 2.0, timeout_per_mb: float = 8.0, phone_region: str = "US"):
        # each text gets `timeout + timeout_per_mb * MB of input` seconds (an ordinary note needs under 1 s per MB),
        # or less where the record's deadline (budget.current()) comes sooner
        self.timeout = float(timeout)
        self.timeout_per_mb = float(timeout_per_mb)
        self.phone_region = phone_region
        flags = regex.VERBOSE | regex.IGNORECASE | regex.VERSION0
        self._age = regex.compile(_AGE_SRC, flags)
        self._label = regex.compile(_LABEL_SRC, regex.IGNORECASE)
        self._label_groups = [(k, self._label.groupindex[k] - 1) for k in _LABEL_CATEGORY]  # index in m.groups()
        self._zip = regex.compile(_ZIP_SRC)
        self._street = regex.compile(_STREET_SRC)
        self._us_phone = regex.compile(_US_PHONE_SRC, regex.IGNORECASE)
        self._local_phone = regex.compile(_LOCAL_PHONE_SRC)
        self._phone_cand = regex.compile(_PHONE_CAND_SRC)
        self._ssn = regex.compile(_SSN_SRC)
        self._vin = regex.compile(_VIN_SRC)
        # a bare run of 10+ digits is an identifier of some kind (seed, accession, member number), not a value
        self._long_number = regex.compile(r"(?<![\d.,])\d{10,}(?![\d]|[.,]\d)")
        self._scheme_url = regex.compile(_SCHEME_URL_SRC)
        # reuse presidio's pattern definitions (text_deid/detectors/presidio_patterns.py), run with our own
        # engine + timeout; all of its IP patterns except the one for the bare unspecified address "::"
        self._cc = regex.compile(presidio.PATTERNS["credit_card"])
        self._ips = [regex.compile(p) for name, p in presidio.PATTERNS["ip"].items() if name != "IPv6_unspecified"]
        self._email = regex.compile(presidio.PATTERNS["email"])
        self._dea = regex.compile(r"(?<![A-Za-z0-9])(?:" + presidio.PATTERNS["dea"] + r")(?![A-Za-z0-9])")
        self._nonscheme_url = regex.compile(
            r"(?<![\w@.\-/])(?:" + presidio.PATTERNS["url"].removeprefix("(?i)") + r")(?![\w@\-])",
            regex.IGNORECASE,
        )
        # cheap anchors: each stage scans with a fast regex, then applies its full pattern locally
        self._a_month = regex.compile(r"\b" + _trie("jan feb mar apr may jun jul aug sep oct nov dec".split()))
        # the forms of _DATE_SRC that start at the month, matched there, and those that start before it, searched
        # only where the 20 characters before the month hold a digit or a relative word
        month_first, before_month = (
            regex.compile("|".join(_date_alternatives(names)), flags) for names in (("md", "my"), ("dm", "rel")))
        self._date_at_month, self._date_before_month = month_first, before_month
        self._a_before_month = regex.compile(r"\d|\b(?:last|next|this|early|late|mid)\b")
        self._a_label = regex.compile(r"\b" + _trie(_LABEL_ANCHOR_WORDS))
        self._a_digit = regex.compile(r"\d")
        # a colon after a label starts a date ("DOB:03/12/1980"); after a digit it is a time's ("10:30-11")
        self._a_dnum = regex.compile(r"(?<![\d/.,-])(?<!\d:)\d{1,4}[-/.]\d{1,2}")
        self._date_num = regex.compile(_DATE_NUM_SRC, regex.VERBOSE | regex.VERSION0)
        self._age_num = regex.compile(_AGE_NUM_SRC, regex.IGNORECASE)
        self._a_age = regex.compile(r"(?<![\d.,])(?:9\d|1[0-3]\d)(?!\d)")
        self._a_phone = regex.compile(r"[+(]?\d[\d \t().\-]{5,22}\d(?!\w)")
        self._a_tld = regex.compile(r"\.(?:" + "|".join(sorted(_COMMON_TLDS)) + r")(?![\w@-])", regex.IGNORECASE)
        self._a_ipv4 = regex.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
        self._a_ipv6 = regex.compile(r"::|(?:[0-9A-Fa-f]{1,4}:){3}")
        # an '@' between a local part and a dotted domain, as every e-mail match holds (possessive: linear)
        self._a_email = regex.compile(r"(?<=[!#$%&'*+\-/=?^_`{|}~\w])@\w++(?:-++\w++)*+\.\w")
        self._a_7d = regex.compile(r"\d{7}(?![A-Za-z0-9])")
        self._a_zip = regex.compile(r"(?<![\w-])\d{5}(?:-\d{4})?(?![\w-])")
        self._zip_before = regex.compile(_ZIP_BEFORE_SRC)
        self._a_street = regex.compile(r"(?<![\w.,/:-])\d{1,6}[A-Za-z]?[ \t]+(?:[NSEW]\.?[ \t]+)?[A-Z0-9]")
        self._a_named = regex.compile(r"\b(?:Street|Avenue|Boulevard|Road|Lane)\b")
        self._named_before = regex.compile(r"(?<![\w])(?:[A-Z][a-z]+[ \t]+){1,3}$")
        self._pobox = regex.compile(r"\b(?i:P\.?\s?O\.?\s*Box)\s*\#?\s*\d+")
        # this detector's regexes that cannot run away (any other, e.g. one patched in by a test, gets a timeout)
        patterns = [*vars(self).values(), *self._ips, *(p for p, _ in _CONTEXT_RECLASS), *globals().values()]
        self._bounded = frozenset(p for p in patterns if isinstance(p, regex.Pattern) and bounded_per_position(p.pattern))
        # (stage, its function, the fewest digits any of its matches holds)
        self._stages = (
            ("date", self._dates, 0), ("age", self._ages, 0), ("label", self._labels, 1), ("ssn", self._ssns, 9),
            ("phone", self._phones, 7), ("email", self._emails, 0), ("url", self._urls, 0),
            ("ip", self._ip_addresses, 0), ("card", self._cards, 13), ("dea", self._deas, 7), ("vin", self._vins, 1),
            ("zip", self._zips, 5), ("street", self._streets, 0), ("long-number", self._long_numbers, 10),
        )

    # ------------------------------------------------------------------------------------------
    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        if not isinstance(text, str):
            raise DetectorError("patterns: input is not a str")
        if not text:
            return []
        # the text's own budget, narrowed to the record's deadline (budget.current()) where that is sooner
        own = time.monotonic() + self.timeout + self.timeout_per_mb * len(text) / 1e6
        record = budget.current()
        # ASCII-only lowering keeps offsets identical (str.lower() may lengthen other letters, but is faster)
        low = text.lower() if text.isascii() else text.translate(_ASCII_LOWER)
        scan = _Scan(text, low, own if record is None else min(own, record), self._bounded)
        out: list[Span] = []
        # ASCII digits in the text (any count where it holds other characters: \d also matches those)
        digits = sum(map(text.count, "0123456789")) if text.isascii() else len(text)
        stage = ""
        try:
            for stage, fn, min_digits in self._stages:
                if digits >= min_digits:  # else no match of this stage fits in so few digits
                    scan.remaining()
                    out.extend(fn(scan))
        except DetectorError:
            raise
        except TimeoutError:  # a regex timeout, or the text's deadline passed between searches
            raise DetectorError(f"patterns: over its time budget in stage {stage}") from None
        except Exception as exc:  # noqa: BLE001 - fail closed, message without input text
            raise DetectorError(f"patterns: {type(exc).__name__} in stage {stage}") from None
        n = len(text)
        for s in out:
            if not (0 <= s.start < s.end <= n):
                raise DetectorError("patterns: produced an out-of-range span")
        return _merge_same_category(out)

    @staticmethod
    def _span(start: int, end: int, category: str, conf: float) -> Span:
        return Span(start, end, category, DETECTOR, conf)

    # dates ---------------------------------------------------------------------------------------
    def _dates(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        n = len(text)
        last_end = -1
        for a in scan.iter(self._a_month, scan.low):
            p = a.start()
            if p < last_end:
                continue
            m = None
            ws = max(0, p - 20, last_end)
            if self._a_before_month.search(scan.low, ws, p, timeout=scan.limit(self._a_before_month)):
                we = min(n, p + 40)
                while we < n and text[we].isalnum():
                    we += 1
                m = next((m for m in scan.iter(self._date_before_month, text, ws, we) if m.start() <= p < m.end()), None)
            if m is None:
                m = self._date_at_month.match(text, p, timeout=scan.limit(self._date_at_month))
            sp = None if m is None else self._name_date(m)
            if sp is not None:
                res.append(sp)
                last_end = max(last_end, m.end())
        for a in scan.iter(self._a_dnum, text):
            m = self._date_num.match(text, a.start(), timeout=scan.limit(self._date_num))
            if m is not None:
                sp = self._num_date(scan, m)
                if sp is not None:
                    res.append(sp)
        return res

    def _name_date(self, m) -> Span | None:
        """A match of _date_at_month (md, my) or of _date_before_month (dm, rel)."""
        if m.re is self._date_at_month:
            if m.group("md"):
                if not m.group("md_year") and not m.group("md_mon")[0].isupper():
                    return None
                return self._span(m.start(), m.end(), "DATE", 0.9 if m.group("md_year") else 0.75)
            mon = m.group("my_mon")
            if not mon[0].isupper() and mon.lower().rstrip(".") in ("may", "mar", "march"):
                return None
            return self._span(m.start(), m.end(), "DATE", 0.85)
        if m.group("dm"):
            if not (m.group("dm_year") or m.group("dm_ord") or m.group("dm_mon")[0].isupper()):
                return None
            return self._span(m.start(), m.end(), "DATE", 0.9 if m.group("dm_year") else 0.7)
        return self._span(m.start(), m.end(), "DATE", 0.6)  # rel: "last March"

    def _num_date(self, scan: _Scan, m) -> Span | None:
        text = scan.text
        if m.group("iso"):
            return self._span(m.start(), m.end(), "DATE", 0.95)
        if m.group("mdy"):
            a, b, sep, y = int(m.group("a")), int(m.group("b")), m.group("s"), m.group("y")
            if not ((1 <= a <= 12 and 1 <= b <= 31) or (1 <= b <= 12 and 1 <= a <= 31)):
                return None
            if sep == "." and len(y) != 4:
                return None
            return self._span(m.start(), m.end(), "DATE", 0.9)
        mo, d = int(m.group("m")), int(m.group("d"))
        if not (1 <= mo <= 12 and 1 <= d <= 31):
            return None
        before = text[max(0, m.start() - 25):m.start()]
        after = text[m.end():m.end() + 12]
        if (_MDN_BAD_BEFORE.search(before, timeout=scan.limit(_MDN_BAD_BEFORE))
                or _MDN_BAD_AFTER.match(after, timeout=scan.limit(_MDN_BAD_AFTER))):
            return None
        if (mo, d) in _FRACTIONS and not _DATE_CONTEXT_BEFORE.search(before, timeout=scan.limit(_DATE_CONTEXT_BEFORE)):
            return None
        return self._span(m.start(), m.end(), "DATE", 0.6)

    # ages >= 90 ------------------------------------------------------------------------------------
    def _ages(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        # every match of _age_num holds a number 90-139 on its own: a bounded scan finds that rare case first
        ages = scan.iter(self._age_num, text) if self._a_age.search(text) else ()
        for m in ages:
            g = "age" if m.group("age") else "age2"
            if 90 <= int(m.group(g)) <= 130:
                res.append(self._span(m.start(g), m.end(g), "AGE_OVER_89", 0.9))
        low = scan.low
        if "0s" in low or "0's" in low or "ninet" in low or "hundred" in low:
            for m in scan.iter(self._age, text):
                for g in ("age3", "age4"):
                    if m.group(g):
                        res.append(self._span(m.start(g), m.end(g), "AGE_OVER_89", 0.8))
        return res

    # labelled identifiers ---------------------------------------------------------------------------
    def _labels(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        n = len(text)
        next_pos = 0
        for a in scan.iter(self._a_label, scan.low):
            p = a.start()
            if p < next_pos or self._a_digit.search(text, p, min(n, p + 60)) is None:  # a bounded scan: no limit
                continue
            m = self._label.match(text, p, timeout=scan.limit(self._label))
            if m is None:
                continue
            sp = self._label_span(scan, m)
            if sp is not None:
                res.append(sp)
                next_pos = m.end()
        return res

    def _label_span(self, scan: _Scan, m) -> Span | None:
        text = scan.text
        val = m.group("val")
        digits = _digits(val)
        if not digits:
            return None
        alnum = len(val) - val.count("-") - val.count("/") - val.count(".")  # `val` allows no other separator
        if len(digits) == alnum and len(digits) < 4:
            return None  # identifiers of 3 digits or fewer are not PHI
        if alnum < 4:
            return None
        groups = m.groups()  # far cheaper than groupdict() with this many groups
        key = next(k for k, i in self._label_groups if groups[i] is not None)
        cat = _LABEL_CATEGORY[key]
        conf = 0.9
        if key == "uid":
            before = text[max(0, m.start() - 30):m.start()] + m.group(key)
            for pat, c in _CONTEXT_RECLASS:
                if pat.search(before, timeout=scan.limit(pat)):
                    cat = c
                    break
            conf = 0.8
        elif key == "npi":
            conf = 0.95 if (len(digits) == 10 and presidio.npi_valid(digits)) else 0.6
        elif key == "lic" and m.group(key).upper().startswith("DEA"):
            conf = 0.95 if self._dea_ok(val) else 0.6
        elif key == "veh" and len(val) == 17:
            conf = 0.95 if vin_check_digit_ok(val) else 0.8
        return self._span(m.start("val"), m.end("val"), cat, conf)

    def _dea_ok(self, val: str) -> bool:
        v = val.replace("-", "").replace(" ", "")
        return len(v) == 9 and v[:2].isalpha() and v[2:].isdigit() and presidio.dea_valid(v)

    # SSN ------------------------------------------------------------------------------------------
    def _ssns(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        for m in scan.iter(self._ssn, text):
            t = m.group()
            if presidio.ssn_invalid(t) and _digits(t) not in _SAMPLE_SSNS:
                continue
            res.append(self._span(m.start(), m.end(), "SOCIAL_SECURITY_NUMBER", 0.85 if m.group(1) == "-" else 0.6))
        return res

    # phones -----------------------------------------------------------------------------------------
    def _phone_category(self, scan: _Scan, start: int) -> str:
        text = scan.text
        window = text[max(0, start - 20):start]
        last = None
        for m in _FAX_CONTEXT.finditer(window, timeout=scan.limit(_FAX_CONTEXT)):
            last = m.group()
        if last is not None and (last.lower() == "fax" or last.startswith("F")):
            return "FAX_NUMBER"
        return "PHONE_NUMBER"

    def _phones(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        n = len(text)
        for a in scan.iter(self._a_phone, text):
            s, e = a.span()
            if s > 0 and (text[s - 1].isalnum() or text[s - 1] == "_"):
                continue
            nd = sum(c.isdigit() for c in a.group())
            if nd < 7:
                continue
            ws, we = max(0, s - 3), min(n, e + 12)
            covered = []
            for m in self._us_phone.finditer(text, ws, we, timeout=scan.limit(self._us_phone)):
                res.append(self._span(m.start(), m.end(), self._phone_category(scan, m.start()), 0.85))
                covered.append(m.span())
            if nd == 7:
                for m in self._local_phone.finditer(text, ws, we, timeout=scan.limit(self._local_phone)):
                    if _PHONE_CONTEXT.search(text[max(0, m.start() - 25):m.start()], timeout=scan.remaining()):
                        res.append(self._span(m.start(), m.end(), self._phone_category(scan, m.start()), 0.6))
            if 10 <= nd <= 15 and not any(cs <= s and e <= ce for cs, ce in covered):
                # phonenumbers on this short window only (international / unformatted numbers)
                for ms, me in _phone_matches(a.group(), self.phone_region):
                    res.append(self._span(s + ms, s + me, self._phone_category(scan, s + ms), 0.7))
        return res

    # e-mail / URL / IP --------------------------------------------------------------------------------
    def _emails(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        n = len(text)
        last_end = -1
        # A match holds one '@' (neither part may hold another), so it lies between its neighbours: each '@' that
        # may start a domain is searched in a window cut there, and no character is searched for more than two.
        for a in scan.iter(self._a_email, text):
            p = a.start()
            if p < last_end:
                continue
            first = text.rfind("@", max(0, p - 256), p) + 1 or max(0, p - 256)
            ws = max(first, p - 64)
            while ws > first and not text[ws - 1].isspace():
                ws -= 1
            last = text.find("@", p + 1, min(n, p + 1024))
            last = min(n, p + 1024) if last == -1 else last
            we = min(last, p + 256)
            while we < last and not text[we].isspace():
                we += 1
            for m in self._email.finditer(text, ws, we, timeout=scan.limit(self._email)):
                if not (m.start() < p < m.end()):
                    continue
                domain = m.group().rsplit("@", 1)[-1]
                tld = domain.rsplit(".", 1)[-1]
                if 2 <= len(tld) <= 24 and tld.isalpha():
                    res.append(self._span(m.start(), m.end(), "EMAIL_ADDRESS", 0.95))
                    last_end = m.end()
        return res

    def _urls(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        low = scan.low
        if "://" in text or "www" in low:
            for m in scan.iter(self._scheme_url, text):
                s, e = m.span()
                while e > s and text[e - 1] in ".,;:!?":
                    e -= 1
                if e - s > 7:
                    res.append(self._span(s, e, "URL", 0.9))
        for a in scan.iter(self._a_tld, text):
            left = a.start()
            while left > 0 and (text[left - 1].isalnum() or text[left - 1] in ".-"):
                left -= 1
            if left == a.start() or (left > 0 and text[left - 1] in "@/_"):
                continue
            m = self._nonscheme_url.match(text, left, timeout=scan.limit(self._nonscheme_url))
            if m is None or m.end() < a.end():
                continue
            s, e = m.span()
            while e > s and text[e - 1] in ".,;:!?":
                e -= 1
            res.append(self._span(s, e, "URL", 0.7))
        return res

    def _ip_addresses(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        n = len(text)
        for a in scan.iter(self._a_ipv4, text):
            ws, we = max(0, a.start() - 1), min(n, a.end() + 4)
            for m in self._ips[2].finditer(text, ws, we, timeout=scan.limit(self._ips[2])):  # presidio IPv4
                if not presidio.ip_invalid(m.group()):
                    res.append(self._span(m.start(), m.end(), "IP_ADDRESS", 0.9))
        if ("::" in text or text.count(":") >= 7) and self._a_ipv6.search(text, timeout=scan.limit(self._a_ipv6)) is not None:
            for i, pat in enumerate(self._ips):
                if i == 2:
                    continue
                for m in scan.iter(pat, text):
                    t = m.group()
                    if presidio.ip_invalid(t) or t.count(":") < 2:
                        continue
                    res.append(self._span(m.start(), m.end(), "IP_ADDRESS", 0.9))
        return res

    # checksummed numbers ------------------------------------------------------------------------------
    def _cards(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        for m in scan.iter(self._cc, text):
            t = m.group()
            d = _digits(t)
            if 13 <= len(d) <= 19 and len(set(d)) > 1 and presidio.credit_card_valid(t):
                res.append(self._span(m.start(), m.end(), "ACCOUNT_NUMBER", 0.9))
        return res

    def _long_numbers(self, scan: _Scan) -> list[Span]:
        text = scan.text
        """Unlabelled long numbers: low confidence, so a review-enabled run shows them to a person."""
        return [self._span(m.start(), m.end(), "UNIQUE_IDENTIFIER", 0.5) for m in scan.iter(self._long_number, text)]

    def _deas(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        for a in scan.iter(self._a_7d, text):
            s = a.start() - 2
            if s < 0:
                continue
            m = self._dea.match(text, s, timeout=scan.limit(self._dea))
            if m is not None and m.end() == a.end() and self._dea_ok(m.group()):
                res.append(self._span(m.start(), m.end(), "CERTIFICATE_LICENSE_NUMBER", 0.8))
        return res

    def _vins(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        for m in scan.iter(self._vin, text):
            t = m.group()
            if t.isdigit() or t.isalpha():
                continue
            if vin_check_digit_ok(t):
                res.append(self._span(m.start(), m.end(), "VEHICLE_IDENTIFIER", 0.9))
        return res

    # geography ----------------------------------------------------------------------------------------
    def _zips(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        for a in scan.iter(self._a_zip, text):
            before = text[max(0, a.start() - 40):a.start()]
            if self._zip_before.search(before, timeout=scan.limit(self._zip_before)):
                res.append(self._span(a.start(), a.end(), "GEOGRAPHIC_LOCATION", 0.85))
        return res

    def _streets(self, scan: _Scan) -> list[Span]:
        text = scan.text
        res = []
        for a in scan.iter(self._a_street, text):
            m = self._street.match(text, a.start(), timeout=scan.limit(self._street))
            if m is None or not m.group("street"):
                continue
            num, suf = m.group("num"), m.group("suf").lower()
            if suf in ("dr", "st") and num.isdigit() and len(num) == 4 and num[:2] in ("19", "20"):
                continue  # "in 2020 Smith Dr." is a year, not an address
            res.append(self._span(m.start(), m.end(), "GEOGRAPHIC_LOCATION", 0.85))
        for a in scan.iter(self._a_named, text):
            b = self._named_before.search(text[max(0, a.start() - 60):a.start()], timeout=scan.remaining())
            if b is not None:
                res.append(self._span(a.start() - (len(b.string) - b.start()), a.end(), "GEOGRAPHIC_LOCATION", 0.6))
        if "box" in scan.low:
            for m in scan.iter(self._pobox, text):
                res.append(self._span(m.start(), m.end(), "GEOGRAPHIC_LOCATION", 0.85))
        return res


def _merge_same_category(spans: list[Span]) -> list[Span]:
    """Union overlapping spans of the same category (max confidence); output sorted."""
    by_cat: dict[str, list[Span]] = {}
    for s in spans:
        by_cat.setdefault(s.category, []).append(s)
    out: list[Span] = []
    for cat, group in by_cat.items():
        group.sort()
        cur = group[0]
        for s in group[1:]:
            if s.start < cur.end:
                cur = Span(cur.start, max(cur.end, s.end), cat, DETECTOR, max(cur.confidence, s.confidence))
            else:
                out.append(cur)
                cur = s
        out.append(cur)
    out.sort()
    return out
