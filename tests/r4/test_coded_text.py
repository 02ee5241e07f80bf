"""Coded text is terminology: a Coding.display, and a CodeableConcept.text that is one of its codings'
displays, are kept (only the record's known identifiers are masked in them); other CodeableConcept.text goes
through the text stack. A Reference.display follows the rule of what it points to: a person's is a name, an
Organization's or Location's a facility name (kept, as Organization.name and Location.name), any other's
coded text; where the target is not told, the text stack."""
from __future__ import annotations

import json

import pytest

from tests.support import FlagsEveryText

LOINC = "http://loinc.org"
SCT = "http://snomed.info/sct"
PATIENT = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Smith", "given": ["John"]}],
           "address": [{"city": "Chicopee", "state": "MA"}]}



@pytest.fixture
def flagging(engine):
    engine.stack = FlagsEveryText()
    return engine


def _bundle(*resources: dict, full_urls: dict | None = None) -> dict:
    full_urls = full_urls or {}
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{**({"fullUrl": full_urls[id(r)]} if id(r) in full_urls else {}), "resource": r}
                      for r in (PATIENT, *resources)]}


def _observation(code: dict, **extra) -> dict:
    return {"resourceType": "Observation", "id": "o1", "status": "final", "code": code,
            "subject": {"reference": "Patient/p1"}, **extra}


def _out(engine, *resources: dict, full_urls: dict | None = None) -> list[dict]:
    return [e["resource"] for e in engine.deidentify(_bundle(*resources, full_urls=full_urls)).resource["entry"][1:]]


def test_a_concept_text_equal_to_its_display_in_another_case_and_spacing_is_kept(flagging):
    code = {"coding": [{"system": SCT, "code": "260385009", "display": "Negative (qualifier value)"}],
            "text": "negative  (Qualifier value)"}
    obs, = _out(flagging, _observation(code))
    assert obs["code"] == code
    assert not any("qualifier" in t.casefold() for t in flagging.stack.seen)


def test_a_concept_text_made_of_words_of_a_display_is_kept(flagging):
    # US Core's tribal affiliation: "Shoshone" shortens its display; the gazetteer took it for a county
    code = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-TribalEntityUS", "code": "187",
                        "display": "Paiute-Shoshone Tribe of the Fallon Reservation and Colony, Nevada"}],
            "text": "Shoshone"}
    obs, = _out(flagging, _observation(code))
    assert obs["code"] == code and "Shoshone" not in flagging.stack.seen
    # a word the displays do not hold makes it free text again
    _out(flagging, _observation({**code, "text": "Shoshone of Elko"}))
    assert "Shoshone of Elko" in flagging.stack.seen


def test_a_concept_text_unlike_its_displays_goes_through_the_stack_and_loses_the_patients_name(engine):
    code = {"coding": [{"system": LOINC, "code": "24323-8", "display": "Comprehensive metabolic panel"}],
            "text": "John Smith's custom panel"}
    obs, = _out(engine, _observation(code))
    assert "Smith" not in obs["code"]["text"] and obs["code"]["text"].endswith("custom panel")
    assert obs["code"]["coding"][0]["display"] == "Comprehensive metabolic panel"


def test_a_concept_text_with_no_display_to_equal_goes_through_the_stack(flagging):
    obs, = _out(flagging, _observation({"coding": [{"system": LOINC, "code": "28655-9"}], "text": "Discharge summary"}))
    assert obs["code"]["text"] == "[NAME] summary"


def test_a_display_is_kept_as_a_code_and_not_sent_through_the_stack(flagging):
    code = {"coding": [{"system": LOINC, "code": "4548-4", "display": "Hemoglobin A1c/Hemoglobin.total in Blood"}]}
    obs, = _out(flagging, _observation(code))
    assert obs["code"] == code
    assert flagging.stack.seen == []


@pytest.mark.parametrize("display", ["Panel for John Smith", "Smith, John: custom panel", "Smith panel",
                                     "Chicopee screening"])
def test_a_display_holding_a_known_identifier_of_the_record_does_not_survive(engine, display):
    code = {"coding": [{"system": "http://example.org/local", "code": "x1", "display": display}], "text": display}
    obs, = _out(engine, _observation(code))
    text = json.dumps(obs)
    assert "Smith" not in text and "Chicopee" not in text
    assert obs["code"]["coding"][0]["code"] == "x1"


def test_a_display_that_is_one_word_of_a_name_stays_the_codes_word(engine):
    patient = {**PATIENT, "name": [{"family": "White", "given": ["Ann"]}]}
    race = {"coding": [{"system": "urn:oid:2.16.840.1.113883.6.238", "code": "2106-3", "display": "White"}],
            "text": "White"}
    out = engine.deidentify({**patient, "maritalStatus": race}).resource
    assert out["maritalStatus"] == race


def _encounter(**refs) -> dict:
    return {"resourceType": "Encounter", "id": "e1", "status": "finished",
            "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
            "subject": {"reference": "Patient/p1", "display": "Mr. John Smith"}, **refs}


def test_a_display_of_a_person_follows_the_name_rule(flagging):
    enc, = _out(flagging, _encounter(participant=[{"individual": {"reference": "Practitioner/pr1",
                                                                  "display": "Dr. Ronny Block"}}]))
    assert "display" not in enc["subject"] and "display" not in enc["participant"][0]["individual"]
    assert enc["subject"]["reference"].startswith("Patient/")
    assert "REDACTED" in {c["code"] for c in enc["meta"]["security"]}


def test_a_person_displays_name_is_still_found_in_free_text(engine):
    enc = _encounter(participant=[{"individual": {"reference": "Practitioner/pr1", "display": "Dr. Ronny Block"}}],
                     reasonCode=[{"text": "Referred by Ronny Block"}])
    out, = _out(engine, enc)
    assert "Block" not in json.dumps(out)


def test_a_display_of_an_organization_or_location_is_a_facility_name_kept(flagging):
    enc, = _out(flagging, _encounter(serviceProvider={"reference": "Organization/o1", "display": "Cigna Health"},
                                     location=[{"location": {"reference": "Location/l1",
                                                             "display": "Boston Children's Hospital"}}]))
    assert enc["serviceProvider"]["display"] == "Cigna Health"
    assert enc["location"][0]["location"]["display"] == "Boston Children's Hospital"
    assert "Cigna Health" not in flagging.stack.seen


def test_a_facility_name_loses_a_known_identifier_of_the_record(engine):
    org = {"resourceType": "Organization", "id": "o1", "name": "RIVER BEND MEDICAL GROUP - CHICOPEE OFFICE"}
    out, = _out(engine, org)
    assert out["name"] == "RIVER BEND MEDICAL GROUP - [GEOGRAPHIC_LOCATION] OFFICE"


def test_organization_and_location_names_are_kept(flagging):
    org, loc = _out(flagging, {"resourceType": "Organization", "id": "o1", "name": "Lahey Hospital & Medical Center"},
                    {"resourceType": "Location", "id": "l1", "name": "Beverly Hospital Corporation"})
    assert org["name"] == "Lahey Hospital & Medical Center" and loc["name"] == "Beverly Hospital Corporation"


def test_a_display_of_anything_else_is_coded_text(flagging):
    request = {"resourceType": "MedicationRequest", "id": "m1", "status": "active", "intent": "order",
               "subject": {"reference": "Patient/p1"},
               "medicationReference": {"reference": "Medication/med1", "display": "Simvastatin 20 MG Oral Tablet"},
               "reasonReference": [{"reference": "Observation/o9", "display": "Octanoylcarnitine (C8)"}]}
    out, = _out(flagging, request)
    assert out["medicationReference"]["display"] == "Simvastatin 20 MG Oral Tablet"
    assert out["reasonReference"][0]["display"] == "Octanoylcarnitine (C8)"


def test_a_urn_uuid_reference_is_resolved_through_the_bundles_full_urls(flagging):
    org = {"resourceType": "Organization", "id": "o1", "name": "Cigna Health"}
    urn_p, urn_o = "urn:uuid:0b9fe3e6-4a1c-4fb8-a6c8-0d7f4fd5d5a1", "urn:uuid:7c2ab0c6-1f2a-4a38-9f7e-6b0e7b5b1c11"
    enc = _encounter(subject={"reference": urn_p, "display": "John Smith"},
                     serviceProvider={"reference": urn_o, "display": "Cigna Health"})
    bundle = _bundle(org, enc, full_urls={id(PATIENT): urn_p, id(org): urn_o})
    out = flagging.deidentify(bundle).resource["entry"][2]["resource"]
    assert "display" not in out["subject"]
    assert out["serviceProvider"]["display"] == "Cigna Health"


def test_a_reference_with_only_a_type_or_a_single_declared_target_is_resolved(flagging):
    claim = {"resourceType": "Claim", "id": "c1", "status": "active", "use": "claim",
             "type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/claim-type", "code": "oral"}]},
             "patient": {"reference": "Patient/p1"}, "created": "2020-01-01",
             "provider": {"type": "Organization", "display": "Example Dental"},
             "priority": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/processpriority",
                                      "code": "normal"}]},
             "insurance": [{"sequence": 1, "focal": True, "coverage": {"display": "Cigna Health"}}]}
    out, = _out(flagging, claim)
    assert out["provider"]["display"] == "Example Dental"
    assert out["insurance"][0]["coverage"]["display"] == "Cigna Health"  # Claim.insurance.coverage: Coverage only


def test_a_display_whose_target_is_not_told_goes_through_the_stack(flagging):
    obs, = _out(flagging, _observation({"coding": [{"system": LOINC, "code": "8867-4", "display": "Heart rate"}]},
                                       performer=[{"display": "Ward Seven"}]))
    assert obs["performer"][0]["display"] == "[NAME] Seven"


def test_a_term_is_labelled_masked_only_when_something_was_masked_in_it(engine):
    patient = {**PATIENT, "name": [{"family": "White", "given": ["Ann"]}]}
    race = {"coding": [{"system": "urn:oid:2.16.840.1.113883.6.238", "code": "2106-3", "display": "White"}]}
    out = engine.deidentify({**patient, "maritalStatus": race}).resource
    assert "MASKED" not in {c["code"] for c in out["meta"]["security"]}
    local = {"coding": [{"system": "http://example.org/local", "code": "x1", "display": "Ann White's panel"}]}
    out = engine.deidentify({**patient, "maritalStatus": local}).resource
    assert out["maritalStatus"]["coding"][0]["display"] == "[NAME]'s panel"
    assert "MASKED" in {c["code"] for c in out["meta"]["security"]}


def test_a_term_keeps_a_word_that_only_a_member_of_staff_is_named(engine):
    """Safe Harbor's identifiers are the patient's and their people's: a provider surnamed Test does not mask
    "test" in a LOINC display, while the patient's own name still is masked in a term."""
    doctor = {"resourceType": "Practitioner", "id": "d1", "name": [{"family": "Test", "given": ["Ann"]}]}
    code = {"coding": [{"system": LOINC, "code": "30954-2", "display": "Reason for lab test"}]}
    note = {"coding": [{"system": "http://example.org/local", "code": "x1", "display": "Smith test panel"}]}
    obs, other, = _out(engine, doctor, _observation(code, performer=[{"reference": "Practitioner/d1"}]),
                       {**_observation(note), "id": "o2"})[1:]
    assert obs["code"]["coding"][0]["display"] == "Reason for lab test"
    assert other["code"]["coding"][0]["display"] == "[NAME] test panel"


def test_an_identifier_types_text_is_kept_as_the_kind_of_identifier_it_names(flagging):
    # US Core's Practitioner: "Michigan Medical License" names a kind of identifier; the model took Michigan for a place
    practitioner = {"resourceType": "Practitioner", "id": "pr1", "qualification": [{
        "identifier": [{"type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203", "code": "MD",
                                             "display": "Medical License number"}],
                                 "text": "Michigan Medical License"}, "value": "MD-0042"}],
        "code": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0360", "code": "MD"}]}}]}
    out, = _out(flagging, practitioner)
    assert out["qualification"][0]["identifier"][0]["type"]["text"] == "Michigan Medical License"
    assert "Michigan Medical License" not in flagging.stack.seen
