"""Primitive extensions everywhere (issue #34): an extension's `_value[x]` is valid FHIR JSON that the R4B
Extension model has no field for. It is accepted, its extensions go through the same rules (the allow-list,
the text stack), and it is written back in place; `_birthDate` and `_given` likewise."""
from __future__ import annotations

import pytest

from fhir_transforms.errors import InputError
from fhir_transforms.r4.record import validate

DAR = "http://hl7.org/fhir/StructureDefinition/data-absent-reason"
RACE = "http://hl7.org/fhir/us/core/StructureDefinition/us-core-race"


def patient() -> dict:
    return {"resourceType": "Patient", "id": "p1", "birthDate": "1980-02-03",
            "extension": [{"url": DAR, "valueCode": "asked-unknown", "_valueCode": {"id": "v1", "extension": [
                {"url": DAR, "valueCode": "masked"},
                {"url": "http://example.org/site-note", "valueString": "unknown: dropped"},
                {"url": RACE, "extension": [{"url": "text", "valueString": "call 617-555-0142"}]}]}}],
            "_birthDate": {"extension": [{"url": DAR, "valueCode": "unknown"},
                                         {"url": "http://example.org/unknown", "valueString": "x"}]},
            "contact": [{"name": {"family": "Quorvath", "given": ["Ilsa"], "_given": [{"extension": [
                {"url": DAR, "valueCode": "masked"}]}]}}]}


def test_an_extension_value_with_its_own_extensions_is_valid_input():
    validate(patient(), "in")  # the R4B models alone refuse `_valueCode` (extra_forbidden)


def test_a_bad_primitive_extension_of_an_extension_value_is_still_bad_input():
    doc = patient()
    doc["extension"][0]["_valueCode"]["extension"][0]["valueCode"] = {"not": "a code"}
    with pytest.raises(InputError, match=r"extension\.0\._valueCode"):
        validate(doc, "in")


@pytest.mark.parametrize("validated", [True, False])
def test_its_extensions_go_through_the_rules_and_are_written_in_place(test_key, validated):
    from tests.conftest import make_engine
    out = make_engine(test_key, validate=validated).deidentify(patient()).resource
    held = out["extension"][0]["_valueCode"]
    assert held["id"] == "v1"
    assert [e["url"] for e in held["extension"]] == [DAR, RACE]  # the unknown extension dropped
    assert "617-555-0142" not in held["extension"][1]["extension"][0]["valueString"]  # a string: the text stack
    assert out["_birthDate"] == {"extension": [{"url": DAR, "valueCode": "unknown"}]}
    validate(out, "out")
