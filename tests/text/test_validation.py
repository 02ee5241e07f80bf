"""Validation layer: medical look-alikes and conflict resolution."""
import pytest

from text_deid.detectors.gazetteer import GazetteerDetector
from text_deid.spans import Span
from text_deid.stack import STACK_FILTERS, TextStack
from text_deid.validation import validate
from text_deid.safe_harbor import keeps


@pytest.fixture(scope="module")
def stack():
    """The gazetteer through validation, as in the no-llm stack (patterns left out: slow to load, no names)."""
    return TextStack("gazetteer-only", [GazetteerDetector()], filters=[validate])


def test_stacks_with_list_or_model_detectors_are_validated():
    assert STACK_FILTERS["no-llm"] == STACK_FILTERS["gazetteer"] == ("clinical-values", "validation", "name-parts")
    assert "validation" not in STACK_FILTERS["patterns"]


@pytest.mark.parametrize("text", [
    "History of Parkinson's disease and Hodgkin lymphoma.",
    "Crohn flare; Cushing syndrome ruled out; Addison's disease on hydrocortisone.",
    "Lyme titers pending. Bell's palsy resolved. Apgar 9 at five minutes.",
    "Foley catheter removed; Gram stain negative.",
    "NYHA class II by New York Heart Association criteria; Lou Gehrig’s disease in father.",
    "High Framingham risk score; positive Allen test.",
])
def test_whitelist_gives_no_span_on_its_own(stack, text):
    assert stack.detect(text) == []


def test_eponym_with_a_title_is_still_a_name(stack):
    spans = stack.detect("Dr. Parkinson saw the patient")
    assert [(s.start, s.end, s.category) for s in spans] == [(0, 13, "NAME")]


def test_validation_drops_lookalike_ner_span_but_never_a_pattern_span():
    text = "Parkinson disease; call Foley 555-123-4567"
    spans = [Span(0, 9, "NAME", "ner", 0.8), Span(24, 29, "NAME", "patterns", 1.0),
             Span(30, 42, "PHONE_NUMBER", "patterns", 1.0)]
    assert validate(spans, text) == spans[1:]


def test_known_identifier_wins_over_an_overlapping_span():
    text = "Seen by John Smith Jr today"
    spans = [Span(8, 18, "NAME", "known", 1.0), Span(13, 21, "GEOGRAPHIC_LOCATION", "gazetteer", 0.6)]
    assert validate(spans, text) == [Span(8, 18, "NAME", "known", 1.0),
                                     Span(19, 21, "GEOGRAPHIC_LOCATION", "gazetteer", 0.6)]


def test_organization_inside_a_facility_becomes_one_location():
    text = "admitted to Johns Hopkins Hospital today"
    spans = [Span(12, 25, "NAME", "ner", 0.7), Span(12, 34, "GEOGRAPHIC_LOCATION", "gazetteer", 0.9)]
    assert validate(spans, text) == [Span(12, 34, "GEOGRAPHIC_LOCATION", "gazetteer", 0.9)]


def test_longer_span_wins():
    text = "seen at Mercy General Hospital"
    spans = [Span(8, 13, "NAME", "ner", 0.6), Span(8, 30, "GEOGRAPHIC_LOCATION", "ner", 0.8)]
    assert validate(spans, text) == [Span(8, 30, "GEOGRAPHIC_LOCATION", "ner", 0.8)]


def test_stack_is_deterministic(stack):
    text = "pt Mary Johnson seen by Dr. Lee at UCSF on 3/4/2023 for Crohn disease."
    first = stack.detect(text)
    assert first == stack.detect(text)
    assert [(s.start, s.end, s.category) for s in first] == [
        (3, 15, "NAME"), (24, 31, "NAME"), (35, 39, "GEOGRAPHIC_LOCATION")]


def test_a_hospital_named_as_a_source_of_guidance_is_not_a_location():
    text = "Per recent recommendations from Mayo Clinic, start statin."
    a = text.index("Mayo Clinic")
    assert validate([Span(a, a + 11, "GEOGRAPHIC_LOCATION", "ner", 0.99)], text) == []
    seen = "Seen at Mayo Clinic on 3/4/2023."
    kept = [Span(8, 19, "GEOGRAPHIC_LOCATION", "ner", 0.99)]
    assert validate(kept, seen) == kept


def test_a_lone_lowercase_common_word_is_not_phi():
    text = "admission date of March 3, 2021 at our Denver clinic"
    of, our = text.index("of"), text.index("our")
    date, city = text.index("March"), text.index("Denver")
    spans = [Span(of, of + 2, "DATE", "ner", 0.9), Span(date, date + 13, "DATE", "ner", 0.99),
             Span(our, our + 3, "GEOGRAPHIC_LOCATION", "ner", 0.9), Span(city, city + 6, "GEOGRAPHIC_LOCATION", "ner", 0.99)]
    assert validate(spans, text) == [spans[1], spans[3]]
    assert validate([Span(0, 4, "NAME", "ner", 0.9)], "Will Smith called") == [Span(0, 4, "NAME", "ner", 0.9)]


@pytest.mark.parametrize("text,category,kept", [
    ("INR goal 2-3.5", "UNIQUE_IDENTIFIER", True),  # a range, not an identifier
    ("LDL of 190", "DATE", True),  # three digits: not a date
    ("MRN 4821", "MEDICAL_RECORD_NUMBER", False),
    ("seen 3/4", "DATE", False),
])
def test_safe_harbor_keeps_numbers_of_three_digits_or_fewer(text, category, kept):
    value = text.split()[-1]
    a = text.index(value)
    assert keeps(Span(a, a + len(value), category, "ner", 0.9), text) is kept


def test_a_name_in_another_script_outside_a_protected_span_is_kept():
    # a letter of any script makes a word: the validation layer dropped ИВАНОВ (no ASCII letter) as punctuation
    text = "Patient: ИВАНОВ, ПЁТР, MRN 12345"
    ner = Span(9, 21, "NAME", "ner", 0.9)
    known = Span(27, 32, "ID", "known", 1.0)
    kept = validate([ner, known], text)
    assert any(s.detector == "ner" and text[s.start:s.end].startswith("ИВАНОВ") for s in kept)
