"""Extensions by what they hold (issue #34): the allow-list is data (mappings/data/extensions.yaml, from US Core's
and HL7's StructureDefinitions). A defined extension passes with a value of a type its definition allows, and
only its own sub-extensions; its value then takes its datatype's rules. Unknown extensions are dropped, and an
unknown modifierExtension still refuses the resource."""
from __future__ import annotations

import pytest

from fhir_transforms.errors import RecordRefused

US = "http://hl7.org/fhir/us/core/StructureDefinition/"
SNOMED = "http://snomed.info/sct"


def urls(resource: dict) -> list[str]:
    return [e["url"] for e in resource.get("extension", [])]


def test_coded_us_core_extensions_are_kept(engine):
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Quorvath"}], "extension": [
        {"url": US + "us-core-individual-sex", "valueCoding": {"system": SNOMED, "code": "248152002"}},
        {"url": US + "us-core-interpreter-needed", "valueCoding": {"system": SNOMED, "code": "373066001"}},
        {"url": US + "us-core-tribal-affiliation", "extension": [
            {"url": "tribalAffiliation", "valueCodeableConcept": {"coding": [
                {"system": "http://terminology.hl7.org/CodeSystem/v3-TribalEntityUS", "code": "187"}]}},
            {"url": "isEnrolled", "valueBoolean": False}]}]}
    out = engine.deidentify(patient).resource
    assert urls(out) == [US + "us-core-individual-sex", US + "us-core-interpreter-needed",
                         US + "us-core-tribal-affiliation"]
    assert out["extension"][0]["valueCoding"]["code"] == "248152002"
    assert [e["url"] for e in out["extension"][2]["extension"]] == ["tribalAffiliation", "isEnrolled"]


def test_dates_take_the_date_rules_and_references_the_reference_rules(engine):
    condition = {"resourceType": "Condition", "id": "c1", "subject": {"reference": "Patient/p1"},
                 "extension": [{"url": "http://hl7.org/fhir/StructureDefinition/condition-assertedDate",
                                "valueDateTime": "2021-03-14T10:00:00Z"}]}
    out = engine.deidentify(condition).resource
    assert out["extension"] == [{"url": "http://hl7.org/fhir/StructureDefinition/condition-assertedDate",
                                 "valueDateTime": "2021"}]
    attester = "http://hl7.org/fhir/5.0/StructureDefinition/extension-DocumentReference.attester"
    doc = {"resourceType": "DocumentReference", "id": "d1", "status": "current",
           "content": [{"attachment": {"contentType": "application/pdf"}}],
           "extension": [{"url": attester, "extension": [
               {"url": "mode", "valueCodeableConcept": {"text": "legal"}},
               {"url": "time", "valueDateTime": "2022-05-06"},
               {"url": "party", "valueReference": {"reference": "Practitioner/pr-77", "display": "Dr Ilsa Quorvath"}}]}]}
    parts = {e["url"]: e for e in engine.deidentify(doc).resource["extension"][0]["extension"]}
    assert parts["time"]["valueDateTime"] == "2022"
    assert parts["party"]["valueReference"]["reference"].startswith("Practitioner/")
    assert "pr-77" not in parts["party"]["valueReference"]["reference"]
    assert "display" not in parts["party"]["valueReference"]  # a practitioner's display: a name, removed


def test_strings_go_through_the_text_stack(engine):
    patient = {"resourceType": "Patient", "id": "p1", "extension": [
        {"url": US + "us-core-race", "extension": [{"url": "text", "valueString": "call 617-555-0142"}]}]}
    text = engine.deidentify(patient).resource["extension"][0]["extension"][0]["valueString"]
    assert "617-555-0142" not in text


def test_an_extension_holding_what_its_definition_does_not_allow_is_dropped(engine):
    patient = {"resourceType": "Patient", "id": "p1", "extension": [
        {"url": US + "us-core-birthsex", "valueString": "Quorvath family"},  # birthsex is a code
        {"url": US + "us-core-race", "extension": [
            {"url": "ombCategory", "valueCoding": {"system": "urn:oid:2.16.840.1.113883.6.238", "code": "2106-3"}},
            {"url": "maidenName", "valueString": "Quorvath"}]},  # race defines no such part
        {"url": "http://example.org/fhir/StructureDefinition/favourite-colour", "valueString": "teal"}]}
    out = engine.deidentify(patient).resource
    assert urls(out) == [US + "us-core-race"]
    assert [e["url"] for e in out["extension"][0]["extension"]] == ["ombCategory"]
    assert "REDACTED" in {s["code"] for s in out["meta"]["security"]}


def test_an_unknown_modifier_extension_still_refuses(engine):
    with pytest.raises(RecordRefused):
        engine.deidentify({"resourceType": "Patient", "id": "p1", "modifierExtension": [
            {"url": US + "us-core-individual-sex", "valueCoding": {"system": SNOMED, "code": "248152002"}}]})
