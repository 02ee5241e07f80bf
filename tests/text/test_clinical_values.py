"""Clinical values are not PHI: the stacks keep ranges, measurements, doses, codes, US states alone, drug names and
clinical title phrases unmasked whatever a detector took them for; known identifiers and checksummed or labelled
identifiers still win, and a number is never a known name's word."""
from __future__ import annotations

import re

import pytest

from text_deid.clinical.codes import loinc_valid, snomed_valid
from text_deid.detectors.known_identifiers import find_known
from text_deid.detectors.patterns import PatternDetector
from text_deid.spans import KnownIdentifier, Span
from text_deid.stack import DEFAULT_STACK, FILTERS, STACK_FILTERS, STACKS, TextStack, build_stack


class FlagsWords:
    """A detector (named as a model would be) that flags every word-like run of the text, or the runs
    matching `pattern`, as `category`: what a confused model does with clinical strings."""

    def __init__(self, category: str, pattern: str = r"[\w.\-–/%<>=]+", name: str = "ner"):
        self.category, self.pattern, self.name = category, re.compile(pattern), name

    def detect(self, text, known):
        return [Span(m.start(), m.end(), self.category, self.name, 0.9) for m in self.pattern.finditer(text)]


def _masked(stack: TextStack, text: str, known=()) -> list[str]:
    return [text[s.start:s.end] for s in stack.detect(text, known)]


def _with_filters(*detectors) -> TextStack:
    return TextStack("test", list(detectors), filters=[FILTERS[f]() for f in STACK_FILTERS[DEFAULT_STACK]])


@pytest.fixture(scope="module")
def default_stack():
    return build_stack(DEFAULT_STACK)


@pytest.mark.parametrize("text", ["3.3-5.1", "POTASSIUM 3.4 (L) 3.6 - 5.1 mEq/L", "36.0–78.0", "ref range 21–29",
                                  "CALCIUM 8.9 8.5 - 10.5 mg/dL", "MCV 84.1 82 - 97 fL", "<=4.0", "> 60 mL/min"])
@pytest.mark.parametrize("category", ["DATE", "PHONE_NUMBER", "UNIQUE_IDENTIFIER", "NAME"])
def test_ranges_comparators_and_measurements_are_never_masked(text, category):
    assert _masked(_with_filters(FlagsWords(category, r"\d[\d.\-– ]*\d|\d")), text) == []


@pytest.mark.parametrize("text", ["POTASSIUM 3.4 (L) 3.6 - 5.1 mEq/L", "3.3-5.1", "36.0–78.0", "Takes 1-2 tablets",
                                  "LOINC 93043-8", "/93043-8/56051-6", "HL70335", "Social Determinants Of Health",
                                  "SNOMED CT 271649006"])
def test_the_default_stack_keeps_the_clinical_values_its_model_took_for_phi(default_stack, text):
    assert _masked(default_stack, text) == []


@pytest.mark.parametrize("text", ["Takes 1-2 tablets by mouth", "metformin 500 mg twice daily", "0.025 % solution",
                                  "2 puffs every 4 hours"])
def test_doses_are_never_masked(text):
    assert _masked(_with_filters(FlagsWords("DATE", r"\d[\d.\-]*(?:\s\w+)?")), text) == []


def test_ranges_that_could_be_dates_phones_or_zip_codes_stay_masked():
    stack = _with_filters(FlagsWords("DATE", r"\S+"))
    assert _masked(stack, "seen 3-12") == ["3-12"]  # month and day, no cue: may be a date
    stack = _with_filters(FlagsWords("PHONE_NUMBER", r"[\d-]+"))
    assert _masked(stack, "call 555-1234 or 02139-1234") == ["555-1234", "02139-1234"]


@pytest.mark.parametrize("code, valid", [("93043-8", True), ("2345-7", True), ("56051-6", True), ("93043-7", False)])
def test_loinc_check_digits(code, valid):
    assert loinc_valid(code) is valid


@pytest.mark.parametrize("sctid, valid", [("271649006", True), ("73211009", True), ("22298006", True),
                                          ("271649007", False), ("271649016", False)])
def test_snomed_check_digits(sctid, valid):
    assert snomed_valid(sctid) is valid


@pytest.mark.parametrize("text, kept", [
    ("LOINC 93043-8 and 95421-4", True),
    ("result code 93043-7", False),  # the check digit fails: not a LOINC code
    ("SNOMED CT 271649006", True),
    ("order 271649006", False),  # a valid check digit, but no code system named
    ("ICD-10 E11.9, I10 and CPT 99213", True),
    ("NDC 0002-8215-01", True),
    ("table HL70335", True),
])
def test_codes_are_kept_only_with_a_valid_check_digit_or_their_system_named(text, kept):
    stack = _with_filters(FlagsWords("GEOGRAPHIC_LOCATION", r"\b(?:[A-Z]\d[\w.]*|\d[\d\-]{3,}|HL7\d+|NDC)\b"))
    assert (_masked(stack, text) == []) is kept


def test_an_identifier_shaped_like_a_code_needs_its_system_named():
    stack = _with_filters(FlagsWords("MEDICAL_RECORD_NUMBER", r"\d+-\d"))
    assert _masked(stack, "chart 93043-8") == ["93043-8"]
    assert _masked(stack, "LOINC 93043-8") == []
    assert _masked(stack, "/93043-8/56051-6") == []  # a structural key of codes alone (a linkId)


@pytest.mark.parametrize("text, masked", [("MA", []), ("Texas", []), ("moved to the State of Ohio", []),
                                          ("Lives in Boston, MA", ["Boston"]), ("Boston, MA 02139", ["Boston", "02139"]),
                                          ("Springfield, Illinois", ["Springfield"]),
                                          ("Kansas City", ["Kansas City"])])
def test_a_state_alone_is_kept_and_the_city_beside_it_stays_masked(text, masked):
    pattern = r"Boston, MA(?: 02139)?|Springfield, Illinois|Kansas City|\bMA\b|Texas|State of Ohio"
    assert _masked(_with_filters(FlagsWords("GEOGRAPHIC_LOCATION", pattern)), text) == masked


def test_drug_names_are_kept_unless_a_name_or_title_says_a_person():
    stack = _with_filters(FlagsWords("NAME", r"Ketotifen|Camila"))
    assert _masked(stack, "Ketotifen 0.025 % solution") == []
    assert _masked(stack, "Camila was seen today") == ["Camila"]  # a drug's name and a first name: stays masked


def test_a_common_word_closing_a_clinical_title_phrase_is_kept():
    stack = _with_filters(FlagsWords("GEOGRAPHIC_LOCATION", r"Health"))
    assert _masked(stack, "Social Determinants Of Health") == []
    assert _masked(stack, "moved to Health") == ["Health"]


def test_known_identifiers_and_checksummed_patterns_are_never_dropped():
    text = "SSN 123-45-6789, MRN: 93043-8, value 21-29"
    stack = _with_filters(PatternDetector(), FlagsWords("DATE", r"21-29", name="known"))
    masked = _masked(stack, text, (KnownIdentifier("x", "NAME"),))
    assert {"123-45-6789", "93043-8", "21-29"} <= set(masked)


def test_patterns_give_no_date_or_phone_to_ranges_and_codes():
    text = "K 3.3-5.1, take 1-2 tablets, range 3.6 - 5.1, LOINC 93043-8, 95421-4, HL70335"
    assert PatternDetector().detect(text) == []


def test_every_stack_drops_clinical_values_first():
    assert all(STACK_FILTERS[name][0] == "clinical-values" for name in STACKS)


def test_a_number_in_a_known_name_is_no_name_word():
    text = "Reference range 21–29 mmol/L; seen by Smith 29"
    known = (KnownIdentifier("29", "NAME"), KnownIdentifier("Smith 29", "NAME"))
    assert [text[s.start:s.end] for s in find_known(text, known)] == ["Smith 29"]
