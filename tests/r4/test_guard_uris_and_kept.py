"""The leak guard without holes and without false refusals (issue #34): known identifiers in kept URIs are
pseudonymized; the exemption of values kept by design holds for a coincidence of words, never for an
identifier-shaped value; a canonical url ending with the record's own id is no person's identifier; the
identifiers of organizations and devices do not mask their names."""
from __future__ import annotations

import json

import pytest

from fhir_transforms.errors import LeakFound

MRN = "4471902"
MR = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203", "code": "MR"}]}


def bundle(*resources: dict) -> dict:
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"fullUrl": f"urn:uuid:{i:08d}-0000-4000-8000-000000000000", "resource": r}
                      for i, r in enumerate(resources)]}


def test_an_identifier_value_in_a_system_uri_is_pseudonymized(engine):
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Quorvath"}], "identifier": [
        {"type": MR, "system": f"urn:id:{MRN}", "value": MRN},
        {"system": "http://clinic.example/patients/Quorvath", "value": "A-99"}]}
    out = engine.deidentify(patient).resource
    text = json.dumps(out)
    assert MRN not in text and "Quorvath" not in text
    systems = [i["system"] for i in out["identifier"]]
    assert systems[0].startswith("urn:id:") and systems[1].startswith("http://clinic.example/patients/")
    assert out["identifier"][0]["system"] == engine.deidentify(patient).resource["identifier"][0]["system"]


def test_an_mrn_kept_as_a_code_of_a_local_code_system_is_not_written(engine):
    patient = {"resourceType": "Patient", "id": "p1", "identifier": [{"type": MR, "system": "urn:oid:1.2.3",
                                                                      "value": MRN}]}
    observation = {"resourceType": "Observation", "id": "o1", "status": "final",
                   "subject": {"reference": "urn:uuid:00000000-0000-4000-8000-000000000000"},
                   "code": {"coding": [{"system": "http://hospital.example/local-codes", "code": MRN}]}}
    with pytest.raises(LeakFound, match="MEDICAL_RECORD_NUMBER"):
        engine.deidentify(bundle(patient, observation))


def test_a_surname_that_is_also_a_display_is_still_a_coincidence_of_words(engine):
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "White", "given": ["Ilsa"]}],
               "maritalStatus": {"coding": [{"system": "http://example.org/colours", "code": "White",
                                             "display": "White"}]}}
    out = engine.deidentify(patient).resource
    assert out["maritalStatus"]["coding"][0]["code"] == "White"


def test_a_canonical_url_ending_with_the_records_own_id_is_written(engine):
    response = {"resourceType": "QuestionnaireResponse", "id": "phq-9-example", "status": "completed",
                "questionnaire": "http://hl7.org/fhir/us/core/Questionnaire/phq-9-example",
                "item": [{"linkId": "q1", "answer": [{"valueInteger": 2}]}]}
    out = engine.deidentify(response).resource
    assert out["questionnaire"] == "http://hl7.org/fhir/us/core/Questionnaire/phq-9-example"
    assert out["id"] != "phq-9-example"


def test_identifiers_of_organizations_and_devices_do_not_mask_their_names(engine):
    organization = {"resourceType": "Organization", "id": "org1", "name": "Northwind Labs",
                    "identifier": [{"system": "http://hospital.example/orgs", "value": "Northwind"}]}
    device = {"resourceType": "Device", "id": "d1", "deviceName": [{"name": "ChartWise 7", "type": "user-friendly-name"}],
              "identifier": [{"system": "http://vendor.example/software", "value": "ChartWise 7"}]}
    out = engine.deidentify(bundle(organization, device)).resource
    assert out["entry"][0]["resource"]["name"] == "Northwind Labs"
    assert out["entry"][1]["resource"]["deviceName"][0]["name"] == "ChartWise 7"
    assert out["entry"][0]["resource"]["identifier"][0]["value"] != "Northwind"
