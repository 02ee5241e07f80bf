"""Site rules over FHIR: FHIRPath conditions true and false (falling through to the packaged rule), the rules
hash in meta.tag and in the audit record."""
from __future__ import annotations

import pytest

from adapter.audit.trail import engine_versions
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.r4.site import site_profile
from fhir_transforms.r4.walker import SITE_RULES_TAG_SYSTEM
from fhir_transforms.site_rules import read_site_rules
from tests.conftest import FIXED_TODAY, make_engine
from text_deid.stack import build_stack

SITE = """extends: safe-harbor
fhir:
  rules:
    Practitioner.telecom: {method: keep, where: "use = 'work'"}
    Identifier.value: {method: remove, where: "system = 'http://hospital.example/mrn'"}
"""
PRACTITIONER = {"resourceType": "Practitioner", "id": "pr1", "name": [{"family": "Osler", "given": ["William"]}],
                "telecom": [{"system": "phone", "value": "555-201-7788", "use": "work"},
                            {"system": "phone", "value": "555-201-9911", "use": "home"},
                            {"system": "email", "value": "w.osler@example.org"}]}
PATIENT = {"resourceType": "Patient", "id": "p1",
           "identifier": [{"system": "http://hospital.example/mrn", "value": "MRN-778812"},
                          {"system": "http://other.example/ids", "value": "OTHER-55123"}]}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "site.yaml"
    path.write_text(SITE)
    return read_site_rules(path)


@pytest.fixture(scope="module")
def engine(site, test_key) -> Deidentifier:
    return Deidentifier(site_profile(site), Pseudonymizer(test_key), build_stack("patterns"), lambda: FIXED_TODAY, True)


def test_a_condition_true_applies_the_rule_false_the_next_one(engine):
    out = engine.deidentify(PRACTITIONER, "test").resource
    assert out["telecom"] == [{"system": "phone", "value": "555-201-7788", "use": "work"}]  # true: kept
    assert "555-201-9911" not in str(out) and "osler" not in str(out).lower()  # false: ContactPoint, removed


def test_a_condition_on_a_primitive_reads_its_parent_and_falls_through_to_the_packaged_rule(engine, test_key):
    out = engine.deidentify(PATIENT, "test").resource
    packaged = make_engine(test_key).deidentify(PATIENT, "test").resource
    mrn, other = out["identifier"]
    assert mrn == {"system": "http://hospital.example/mrn"}  # true: the value removed
    assert other == packaged["identifier"][1] and other["value"] != "OTHER-55123"  # false: pseudonym, as packaged


def test_the_rules_hash_is_in_meta_tag_and_the_audit_record(engine, site, test_key):
    tags = engine.deidentify(PATIENT, "test").resource["meta"]["tag"]
    assert {"system": SITE_RULES_TAG_SYSTEM, "code": site.sha256} in tags
    packaged = make_engine(test_key)
    assert all(t["system"] != SITE_RULES_TAG_SYSTEM for t in packaged.deidentify(PATIENT, "test").resource["meta"]["tag"])
    info = engine_versions(engine)
    assert info["versions"]["site_rules_sha256"] == site.sha256
    assert info["rules_version"] == f"{site.versions['fhir']}+site.{site.sha256[:16]}"
    assert "site_rules_sha256" not in engine_versions(packaged)["versions"]


def test_a_kept_value_is_released_only_where_the_site_keeps_it(engine):
    # a staff member who is also the patient: the work phone the site keeps is the patient's phone elsewhere
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": PRACTITIONER},
        {"resource": {"resourceType": "Patient", "id": "p2", "telecom": [{"system": "phone", "value": "555-201-7788"}]}},
        {"resource": {"resourceType": "Observation", "id": "o1", "status": "final", "code": {"text": "note"},
                      "subject": {"reference": "Patient/p2"}, "valueString": "Call the patient at 555-201-7788."}}]}
    out = engine.deidentify(bundle, "test").resource
    practitioner, patient, note = (e["resource"] for e in out["entry"])
    assert practitioner["telecom"] == [{"system": "phone", "value": "555-201-7788", "use": "work"}]
    assert "telecom" not in patient and "555-201-7788" not in note["valueString"]
    assert str(out).count("555-201-7788") == 1


def test_only_a_site_keep_of_an_element_is_trusted(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("extends: safe-harbor\nfhir:\n  rules:\n    Practitioner.telecom: keep\n    ContactPoint: keep\n")
    profile = site_profile(read_site_rules(path))
    assert profile.rules["Practitioner.telecom"].trusted  # that element: released as the site says
    assert not profile.rules["ContactPoint"].trusted  # a whole datatype (patients' too): the leak guard still reads it
