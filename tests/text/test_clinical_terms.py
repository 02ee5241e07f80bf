"""Clinical terms: name and place spans that are clinical words are dropped, unless the text marks a person
or place; known identifiers always survive."""
import gzip

import pytest

from text_deid.clinical.terms import VOCABULARY, is_clinical_term, vocabulary
from text_deid.detectors.known_identifiers import KnownIdentifierDetector
from text_deid.spans import KnownIdentifier, Span
from text_deid.stack import TextStack, build_stack
from text_deid.validation import validate


def span_over(text: str, part: str, category: str = "NAME", detector: str = "ner") -> Span:
    start = text.index(part)
    return Span(start, start + len(part), category, detector, 0.9)


def test_vocabulary_loads_once_and_records_its_sources():
    v = vocabulary()
    assert vocabulary() is v
    assert {"hemoglobin", "echocardiogram", "creatinine", "cardiology", "telemetry", "bnp"} <= v.terms
    assert {"heart", "colon", "normal"} <= v.ambiguous  # clinical words that are also surnames or places
    assert {"syndrome", "disease", "scale", "score", "trial"} <= v.heads
    assert not {"parkinson", "lynch", "glasgow", "grace"} & (v.terms | v.ambiguous)  # eponyms, places, first names
    assert any("ICD-10-CM" in s and "public domain" in s for s in v.sources)
    assert any("curated" in s for s in v.sources)
    with gzip.open(VOCABULARY, "rt", encoding="utf-8") as fh:
        body = [line for line in fh if not line.startswith("#")]
    assert len(body) == len(v.terms) + len(v.ambiguous) + len(v.heads)


@pytest.mark.parametrize("text,part,category", [
    ("Hemoglobin A1c/Hemoglobin.total", "Hemoglobin", "NAME"),
    ("Echocardiography (procedure)", "Echocardiography", "NAME"),
    ("Serum Creatinine trend over 3 days?", "Serum Creatinine", "NAME"),
    ("BNP of 900 on admission, start diuresis?", "BNP", "NAME"),
    ("Transferred to Telemetry overnight.", "Telemetry", "GEOGRAPHIC_LOCATION"),
    ("Follow up in Cardiology in 2 weeks.", "Cardiology", "GEOGRAPHIC_LOCATION"),
    ("Parkinson disease with falls.", "Parkinson", "NAME"),
    ("Lynch syndrome screening in a 40 yo.", "Lynch", "NAME"),
    ("Lynch syndrome screening in a 40 yo.", "Lynch syndrome", "NAME"),
    ("Glasgow Coma Scale of 8 on arrival.", "Glasgow", "GEOGRAPHIC_LOCATION"),
    ("Discharge Summary from Responsible Clinician", "Responsible", "GEOGRAPHIC_LOCATION"),
    ("Discharge Summary from Responsible Clinician", "Clinician", "GEOGRAPHIC_LOCATION"),
    ("Results of the SPRINT trial for BP targets?", "SPRINT", "NAME"),
    ("Heart Failure clinic note.", "Heart Failure", "NAME"),
    ("Latest recs for pt w/ RA, seen last month.", "RA", "NAME"),
    ("Serum creatinine ((umol/L)", "umol", "EMAIL_ADDRESS"),
    ("73F w/ hx of CHF & DM2, on insulin.", "DM2", "UNIQUE_IDENTIFIER"),
])
def test_a_clinical_term_is_no_name_or_place(text, part, category):
    span = span_over(text, part, category)
    assert is_clinical_term(text, span)
    assert validate([span], text) == []


@pytest.mark.parametrize("text,part,category", [
    ("Dr. Parkinson saw the patient", "Parkinson", "NAME"),
    ("Mr. Heart was seen today.", "Heart", "NAME"),
    ("Seen by Colon on Tuesday.", "Colon", "NAME"),  # a surname that is a clinical word: a weak cue suffices
    ("She lives in Normal with her son.", "Normal", "GEOGRAPHIC_LOCATION"),
    ("Born in Mobile, now on dialysis.", "Mobile", "GEOGRAPHIC_LOCATION"),
    ("John Smith test results are back.", "John Smith", "NAME"),
    ("Amy Heart was seen today.", "Amy Heart", "NAME"),
    ("Kidney, MD, signed the note.", "Kidney", "NAME"),
    ("Write to anemia.clinic@example.org today.", "anemia.clinic@example.org", "EMAIL_ADDRESS"),
    ("Admitted in March for CHF.", "March", "DATE"),
])
def test_context_that_marks_a_person_or_place_keeps_the_span(text, part, category):
    span = span_over(text, part, category)
    assert not is_clinical_term(text, span)
    assert validate([span], text) == [span]


def test_a_known_identifier_equal_to_a_term_is_still_found():
    text = "Heart reports chest pain since Monday."
    stack = TextStack("known-validated", [KnownIdentifierDetector()], filters=[validate])
    spans = stack.detect(text, [KnownIdentifier("Heart", "NAME")])
    assert [(text[s.start:s.end], s.category) for s in spans] == [("Heart", "NAME")]
    # the same word from the model alone is dropped
    assert validate([span_over(text, "Heart")], text) == []


@pytest.fixture(scope="module")
def no_llm():
    pytest.importorskip("torch")
    return build_stack("no-llm")


@pytest.mark.parametrize("text,expected", [
    ("Dr. Parkinson saw the patient", [("Dr. Parkinson", "NAME")]),
    ("Parkinson disease", []),
    ("Lynch syndrome", []),
    ("Glasgow Coma Scale", []),
    ("Hemoglobin A1c/Hemoglobin.total", []),
    ("Echocardiography (procedure)", []),
    ("Discharge Summary from Responsible Clinician", []),
])
def test_the_default_stack_keeps_clinical_meaning(no_llm, text, expected):
    spans = no_llm.detect(text)
    found = [(text[s.start:s.end], s.category) for s in spans]
    assert [(t, c) for t, c in found if c in ("NAME", "GEOGRAPHIC_LOCATION")] == expected
