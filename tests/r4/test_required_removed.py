"""A required element the rules remove leaves valid FHIR (issue #34): a required primitive keeps only a
data-absent-reason `masked` extension beside it, decided from the element table, and the output validates."""
from __future__ import annotations

from fhir_transforms.r4.record import validate

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
