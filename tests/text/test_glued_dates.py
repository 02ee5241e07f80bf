"""A known date glued to letters ("DOB19800312", "born1980-03-12", "dob:03/12/1980x") is found by the known-identifier
detector and refused by the leak guard; a run of digits inside a code is not cut into a date (issue #36, item 1)."""
from __future__ import annotations

import json

import pytest

from fhir_transforms.errors import RecordRefused
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import load_hl7_profile
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import FIXED_TODAY, TEST_SECRET, make_engine
from text_deid import leak_guard
from text_deid.detectors.known_identifiers import find_known
from text_deid.spans import KnownIdentifier
from text_deid.stack import build_stack

KNOWN = (KnownIdentifier("Joanna Kowalczyk", "NAME"), KnownIdentifier("1980-03-12", "DATE"))
# (text, the date as written in it): each shape of DATE_SHAPE_RE, a letter touching it before, after or both
GLUED = [
    ("DOB19800312", "19800312"),
    ("born1980-03-12", "1980-03-12"),
    ("dob:03/12/1980x", "03/12/1980"),
    ("A19800312B", "19800312"),
    ("seen12/03/1980pm", "12/03/1980"),
    ("dob3/12/80", "3/12/80"),
    ("dobMarch 12, 1980", "March 12, 1980"),
    ("born 12 March 1980y", "12 March 1980"),
    ("DOB\u0130" + "19800312", "19800312"),  # a letter re.IGNORECASE takes for an ASCII one
]


@pytest.mark.parametrize("text, date", GLUED, ids=[t for t, _ in GLUED])
def test_a_known_date_glued_to_letters_is_found_and_refused(text, date):
    spans = find_known(text, KNOWN)
    at = text.index(date)
    assert [(s.start, s.end, s.category) for s in spans] == [(at, at + len(date), "DATE")]
    assert not leak_guard.clean([text], KNOWN)


@pytest.mark.parametrize("text", [
    "ABC19800313X",     # another day's digits glued to letters
    "lot X119800312",   # the day's digits inside a longer run of digits
    "ref19800312345",
    "id980031212",
    "summary 12, 1980",  # a month's letters inside a word
    "ABC20240101X",     # an unknown 8-digit run, shaped like a date
])
def test_digits_inside_codes_are_not_a_known_date(text):
    assert find_known(text, KNOWN) == []
    assert leak_guard.clean([text], KNOWN)


KEY = Key(key_id_for(TEST_SECRET), TEST_SECRET)
RECORD_NOTES = ["Patient DOB19800312, seen today.", "Seen today, dob:03/12/1980x on file.",
                "Intake form dobMarch 12, 1980 signed."]


@pytest.mark.parametrize("note", RECORD_NOTES)
def test_a_birth_date_glued_in_a_fhir_note_is_masked_or_refused(note):
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Kowalczyk", "given": ["Joanna"]}],
               "birthDate": "1980-03-12"}
    obs = {"resourceType": "Observation", "id": "o1", "status": "final", "code": {"text": "note"},
           "subject": {"reference": "Patient/p1"}, "note": [{"text": note}],
           "text": {"status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{note}</div>'}}
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": patient}, {"resource": obs}]}
    try:
        out = json.dumps(make_engine(KEY, validate=False).deidentify(bundle).resource)
    except RecordRefused:
        return
    assert not any(d in out for d in ("19800312", "03/12/1980", "March 12, 1980"))


@pytest.mark.parametrize("note", RECORD_NOTES)
@pytest.mark.parametrize("segment", ["NTE|1||{}", "OBX|1|TX|11506-3^Progress note^LN||{}||||||F"])
def test_a_birth_date_glued_in_an_hl7_note_is_masked_or_refused(note, segment):
    engine = HL7Deidentifier(load_hl7_profile("safe-harbor"), Pseudonymizer(KEY), build_stack("patterns"),
                             lambda: FIXED_TODAY)
    message = "\r".join(["MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ORU^R01^ORU_R01|CTRL1|P|2.5.1",
                         "PID|1||MRN12345^^^HOSP^MR||Kowalczyk^Joanna||19800312|F", "OBR|1",
                         segment.format(note)]) + "\r"
    try:
        out = engine.deidentify(message)
    except RecordRefused:
        return
    assert not any(d in out for d in ("19800312", "03/12/1980", "March 12, 1980"))
