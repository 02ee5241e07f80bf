"""A required element the rules remove leaves valid FHIR (issue #34): a required primitive keeps only a
data-absent-reason `masked` extension beside it, decided from the element table, and the output validates."""
from __future__ import annotations

from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier, validate
from fhir_transforms.r4.site import site_profile
from fhir_transforms.site_rules import read_site_rules
from tests.conftest import FIXED_TODAY
from text_deid.stack import build_stack

DAR = "http://hl7.org/fhir/StructureDefinition/data-absent-reason"
ENDPOINT = {"resourceType": "Endpoint", "id": "ep1", "status": "active",
            "connectionType": {"system": "http://terminology.hl7.org/CodeSystem/endpoint-connection-type",
                               "code": "direct-project"},
            "name": "Direct address of Quillon Vandermeer",
            "payloadType": [{"text": "CCDA"}],
            "address": "mailto:quillon.vandermeer@direct.example.org",
            "_address": {"extension": [{"url": "http://example.org/unknown", "valueString": "x"}]}}


def test_a_removed_required_primitive_keeps_only_a_masked_data_absent_reason(engine):
    out = engine.deidentify({"resourceType": "Organization", "id": "o1", "name": "Saint Example",
                             "contained": [ENDPOINT], "endpoint": [{"reference": "#ep1"}]}).resource
    endpoint = out["contained"][0]
    assert "address" not in endpoint
    assert endpoint["_address"] == {"extension": [{"url": DAR, "valueCode": "masked"}]}
    validate(out, "out")  # (engine validates too: the output was refused as "a bug" before)


def test_an_optional_primitive_removed_leaves_nothing_beside_it(engine):
    out = engine.deidentify({"resourceType": "Patient", "id": "p1", "multipleBirthInteger": 2}).resource
    assert "multipleBirthInteger" not in out and "_multipleBirthInteger" not in out


def test_a_required_complex_element_a_site_removes_holds_only_the_mark(tmp_path, test_key):
    path = tmp_path / "site.yaml"
    path.write_text("extends: safe-harbor\nfhir:\n  rules:\n    Endpoint.connectionType: remove\n")
    engine = Deidentifier(site_profile(read_site_rules(path)), Pseudonymizer(test_key), build_stack("patterns"),
                          lambda: FIXED_TODAY, True)
    out = engine.deidentify({k: v for k, v in ENDPOINT.items() if k != "_address"}).resource
    assert out["connectionType"] == {"extension": [{"url": DAR, "valueCode": "masked"}]}  # Coding, 1..1
