"""FHIR STU3 input (#34): told by its markers (fhirVersion 3.0.x, an STU3 profile, an STU3-only type or element),
ruled by datatype through STU3's element table, validated with the STU3 models, written back as STU3."""
from __future__ import annotations

import json

from fhir.resources.STU3 import get_fhir_model_class as stu3_model_class
import pytest

from fhir_transforms.errors import InputError
from fhir_transforms.r4 import versions
from tests.conftest import make_engine, run_cli
from tests.support import FHIR, post, serve

PATIENT = {"resourceType": "Patient", "id": "pat-7", "name": [{"family": "Quorlandt", "given": ["Vexabeth"]}],
           "birthDate": "1961-04-12", "telecom": [{"system": "phone", "value": "617-555-0142"}],
           "address": [{"line": ["14 Marrow Lane"], "city": "Dunwick", "state": "MA", "postalCode": "02139"}]}
# STU3-only elements: Condition.assertedDate and .context (R4: recordedDate, encounter), Account.active and .period
CONDITION = {"resourceType": "Condition", "id": "c1", "subject": {"reference": "Patient/pat-7"},
             "context": {"reference": "Encounter/e1"}, "assertedDate": "2017-03-09",
             "onsetDateTime": "2017-03-01T08:00:00Z",
             "code": {"coding": [{"system": "http://snomed.info/sct", "code": "44054006", "display": "Diabetes"}]}}
ACCOUNT = {"resourceType": "Account", "id": "a1", "status": "active", "subject": {"reference": "Patient/pat-7"},
           "name": "Billing for Vexabeth Quorlandt", "active": {"start": "2016-01-02", "end": "2016-06-30"},
           "period": {"start": "2016-01-02"}}
BUNDLE = {"resourceType": "Bundle", "type": "collection", "entry": [
    {"fullUrl": "urn:uuid:1", "resource": PATIENT}, {"fullUrl": "urn:uuid:2", "resource": CONDITION},
    {"fullUrl": "urn:uuid:3", "resource": ACCOUNT}]}
SECRETS = ["Quorlandt", "Vexabeth", "1961-04-12", "617-555-0142", "Marrow", "Dunwick", "02139", "2017-03-09",
           "2016-01-02", "2016-06-30"]


def test_auto_tells_stu3_by_its_own_elements_and_r4_stays_r4():
    assert versions.detect(versions.resources_of(BUNDLE), "b") == "stu3"
    assert versions.markers([{"resourceType": "Condition", "assertedDate": "2017"}])["stu3"] == {"Condition.assertedDate"}
    assert versions.detect([PATIENT], "p") == "r4"  # nothing only STU3 has: R4, as before
    assert versions.detect([{**PATIENT, "meta": {"profile": ["http://hl7.org/fhir/STU3/StructureDefinition/Patient"]}}],
                           "p") == "stu3"
    assert versions.of_number("3.0.2") == "stu3"


def test_stu3_bundle_is_deidentified_by_datatype_and_stays_valid_stu3(test_key):
    engine = make_engine(test_key)
    engine.fhir_version = versions.AUTO
    out = engine.deidentify(json.loads(json.dumps(BUNDLE)), "b").resource
    stu3_model_class("Bundle").model_validate(out)  # still STU3: R4 would refuse assertedDate and Account.active
    text = json.dumps(out)
    assert not [s for s in SECRETS if s in text]
    condition = out["entry"][1]["resource"]
    account = out["entry"][2]["resource"]
    assert condition["assertedDate"] == "2017" and account["active"] == {"start": "2016", "end": "2016"}
    assert condition["code"]["coding"][0]["code"] == "44054006"


def test_stu3_read_as_r4_names_the_version_it_looks_like(test_key):
    engine = make_engine(test_key)
    engine.fhir_version = "r4"
    with pytest.raises(InputError, match=r"valid FHIR STU3: read it with --fhir-version stu3"):
        engine.deidentify(json.loads(json.dumps(ACCOUNT)), "a")


def test_cli_writes_stu3_with_the_option_and_by_auto(tmp_path, test_key_file):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "stu3.json").write_text(json.dumps(BUNDLE))
    for option in ("stu3", "auto"):
        proc = run_cli("fhir", str(tmp_path / "in"), str(tmp_path / option), "--fhir-version", option, "--stack",
                       "patterns", key_file=test_key_file)
        assert proc.returncode == 0, proc.stderr[-500:]
        out = json.loads((tmp_path / option / "stu3.json").read_text())
        stu3_model_class("Bundle").model_validate(out)
        assert not [s for s in SECRETS if s in json.dumps(out)]


def test_service_takes_stu3_by_media_type(tmp_path, test_key_file):
    with serve(tmp_path, test_key_file, "--stack", "patterns") as server:
        resp = post(server, BUNDLE, headers={**FHIR, "Content-Type": "application/fhir+json; fhirVersion=3.0"})
    assert resp.status_code == 200, resp.text[:300]
    stu3_model_class("Bundle").model_validate(resp.json())
    assert not [s for s in SECRETS if s in resp.text]
    assert resp.json()["entry"][2]["resource"]["active"] == {"start": "2016", "end": "2016"}
