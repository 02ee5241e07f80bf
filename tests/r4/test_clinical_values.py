"""FHIR elements that hold clinical values or structural keys, not narrative, have structured rules
(mappings/fhir/safe-harbor.yaml): a vaccine's or medication's lot number is kept while a device's serial number, UDI
and lot are removed; linkIds, enableWhen questions and ElementDefinition paths come out as they went in, and the
leak guard does not refuse a structural key that shares a word with the patient's name or the response's id."""
from __future__ import annotations

import pytest

from tests.conftest import make_engine
from tests.support import FlagsEveryText
from text_deid.stack import DEFAULT_STACK, build_stack

PROFILES = ("safe-harbor", "longitudinal", "longitudinal-fpe")
PATIENT = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Zinc", "given": ["Ann"]}]}
PRAPARE_ITEMS = [{"linkId": "/93043-8", "text": "Personal characteristics", "item": [
    {"linkId": "/93043-8/56051-6", "text": "Hispanic or Latino?", "answer": [{"valueCoding": {
        "system": "http://loinc.org", "code": "LA32-8", "display": "No"}}]},
    {"linkId": "/93043-8/32624-9", "text": "Race", "answer": [{"valueString": "declined"}]}]}]


def _bundle(*resources: dict) -> dict:
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in (PATIENT, *resources)]}


def _out(engine, *resources: dict) -> list[dict]:
    return [e["resource"] for e in engine.deidentify(_bundle(*resources)).resource["entry"][1:]]


@pytest.fixture(scope="module")
def default_stack():
    return build_stack(DEFAULT_STACK)


@pytest.mark.parametrize("profile", PROFILES)
def test_a_vaccine_lot_number_is_kept_and_a_devices_serial_udi_and_lot_are_removed(test_key, profile):
    engine = make_engine(test_key, profile)
    engine.stack = FlagsEveryText()
    immunization = {"resourceType": "Immunization", "id": "i1", "status": "completed",
                    "vaccineCode": {"coding": [{"system": "http://hl7.org/fhir/sid/cvx", "code": "140"}]},
                    "patient": {"reference": "Patient/p1"}, "occurrenceDateTime": "2024-01-02",
                    "lotNumber": "AAJN11K"}
    medication = {"resourceType": "Medication", "id": "m1", "batch": {"lotNumber": "9494788", "expirationDate": "2027-05-22"}}
    udi = {"deviceIdentifier": "09504000059118", "carrierHRF": "(01)09504000059118(17)141120(10)7654321D(21)10987654d321"}
    device = {"resourceType": "Device", "id": "d1", "patient": {"reference": "Patient/p1"}, "lotNumber": "RZ-1234",
              "serialNumber": "AC88F3-19", "udiCarrier": [udi]}
    out_immunization, out_medication, out_device = _out(engine, immunization, medication, device)
    assert out_immunization["lotNumber"] == "AAJN11K"
    assert out_medication["batch"]["lotNumber"] == "9494788"
    assert not {"lotNumber", "serialNumber", "udiCarrier"} & set(out_device)
    assert not {"AAJN11K", "9494788"} & set(engine.stack.seen)


@pytest.mark.parametrize("profile", PROFILES)
def test_questionnaire_response_link_ids_are_unchanged(test_key, default_stack, profile):
    engine = make_engine(test_key, profile)
    engine.stack = default_stack
    response = {"resourceType": "QuestionnaireResponse", "id": "r1", "status": "completed",
                "questionnaire": "http://example.org/Questionnaire/prapare", "subject": {"reference": "Patient/p1"},
                "item": PRAPARE_ITEMS}
    out = _out(engine, response)[0]
    assert [out["item"][0]["linkId"]] + [i["linkId"] for i in out["item"][0]["item"]] == \
        ["/93043-8", "/93043-8/56051-6", "/93043-8/32624-9"]


def test_questionnaire_link_ids_enable_when_questions_and_element_paths_are_kept(engine):
    engine.stack = FlagsEveryText()
    questionnaire = {"resourceType": "Questionnaire", "id": "q1", "status": "active", "item": [
        {"linkId": "smoker", "type": "boolean", "text": "Do you smoke?"},
        {"linkId": "packs per day", "type": "integer", "text": "How many?",
         "enableWhen": [{"question": "smoker", "operator": "=", "answerBoolean": True}]}]}
    profile = {"resourceType": "StructureDefinition", "id": "sd1", "url": "http://example.org/sd", "name": "Ex",
               "status": "draft", "kind": "resource", "abstract": False, "type": "Observation",
               "baseDefinition": "http://hl7.org/fhir/StructureDefinition/Observation", "derivation": "constraint",
               "differential": {"element": [{"id": "Observation.code:panel", "path": "Observation.code",
                                             "sliceName": "panel", "base": {"path": "Observation.code", "min": 1,
                                                                            "max": "1"}}]}}
    out_q, out_sd = _out(engine, questionnaire, profile)
    assert [i["linkId"] for i in out_q["item"]] == ["smoker", "packs per day"]
    assert out_q["item"][1]["enableWhen"][0]["question"] == "smoker"
    element = out_sd["differential"]["element"][0]
    assert (element["path"], element["sliceName"], element["base"]["path"]) == ("Observation.code", "panel",
                                                                              "Observation.code")


def test_a_structural_key_that_shares_a_word_with_the_patient_or_the_response_is_not_refused(engine):
    engine.stack = FlagsEveryText()
    response = {"resourceType": "QuestionnaireResponse", "id": "zinc-intake", "status": "completed",
                "questionnaire": "http://example.org/Questionnaire/zinc-intake", "subject": {"reference": "Patient/p1"},
                "item": [{"linkId": "zinc", "answer": [{"valueBoolean": True}]}]}
    out = _out(engine, response)[0]
    assert out["item"][0]["linkId"] == "zinc"
    assert out["questionnaire"] == "http://example.org/Questionnaire/zinc-intake"


def test_a_number_typed_into_a_name_does_not_mask_or_refuse_a_kept_lot_number(test_key, default_stack):
    engine = make_engine(test_key)
    engine.stack = default_stack
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Zinc 29", "given": ["Ann"]}]}
    immunization = {"resourceType": "Immunization", "id": "i1", "status": "completed",
                    "vaccineCode": {"coding": [{"system": "http://hl7.org/fhir/sid/cvx", "code": "140"}]},
                    "patient": {"reference": "Patient/p1"}, "occurrenceDateTime": "2024-01-02",
                    "lotNumber": "29-7741", "note": [{"text": "Ann Zinc tolerated it"}]}
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": patient}, {"resource": immunization}]}
    out = engine.deidentify(bundle).resource["entry"][1]["resource"]
    assert out["lotNumber"] == "29-7741"
    assert "Zinc" not in out["note"][0]["text"]


@pytest.mark.parametrize("profile", PROFILES)
def test_a_reference_range_text_is_kept_with_only_known_identifiers_masked(test_key, profile):
    engine = make_engine(test_key, profile)
    engine.stack = FlagsEveryText()
    observation = {"resourceType": "Observation", "id": "o1", "status": "final",
                   "code": {"coding": [{"system": "http://loinc.org", "code": "2823-3"}]},
                   "subject": {"reference": "Patient/p1"}, "valueQuantity": {"value": 4.2, "unit": "mmol/L"},
                   "referenceRange": [{"text": "3.3-5.1 mmol/L"}, {"text": "Zinc lab: 21-29"}]}
    out = _out(engine, observation)[0]
    assert [r["text"] for r in out["referenceRange"]] == ["3.3-5.1 mmol/L", "[NAME] lab: 21-29"]
    assert engine.stack.seen == []


def test_a_questions_text_is_the_forms_and_its_free_text_answer_still_goes_through_the_stack(engine):
    engine.stack = FlagsEveryText()
    response = {"resourceType": "QuestionnaireResponse", "id": "r1", "status": "completed",
                "subject": {"reference": "Patient/p1"},
                "item": [{"linkId": "/93025-5", "text": "Social Determinants Of Health", "item": [
                    {"linkId": "/93025-5/1", "text": "Ann Zinc's housing", "answer": [{"valueString": "shelter downtown"}]}]}]}
    out = _out(engine, response)[0]
    assert out["item"][0]["text"] == "Social Determinants Of Health"
    assert out["item"][0]["item"][0]["text"] == "[NAME]'s housing"
    assert out["item"][0]["item"][0]["answer"][0]["valueString"] == "[NAME] downtown"
    assert engine.stack.seen == ["shelter downtown"]
