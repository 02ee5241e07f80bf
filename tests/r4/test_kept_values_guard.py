"""The leak guard knows what the rules kept: a surname that is also a race display, a city named as its
state, are not refused where the rules kept the coded value or the state; anywhere else they still are."""
from __future__ import annotations

import pytest

from fhir_transforms.errors import LeakFound
from fhir_transforms.r4.record import output_strings, output_texts
from fhir_transforms.r4.walker import WrittenSlots
from fhir_transforms.rules import Rule

RACE = "http://hl7.org/fhir/us/core/StructureDefinition/us-core-race"
OMB = "urn:oid:2.16.840.1.113883.6.238"
RACES = {"White": "2106-3", "Black": "2054-5"}


def _patient(family: str, race: str = "White", **extra) -> dict:
    return {
        "resourceType": "Patient", "id": "p1", "name": [{"family": family, "given": ["Ann"]}],
        "extension": [{"url": RACE, "extension": [
            {"url": "ombCategory", "valueCoding": {"system": OMB, "code": RACES.get(race, "2131-1"), "display": race}},
        ]}],
        **extra,
    }


class _SeesNothing:
    """A text stack that finds nothing: what reaches the leak guard unmasked."""

    def detect_many(self, texts, known, timings=None):
        return [[] for _ in texts]


@pytest.mark.parametrize("family,race", [("White", "White"), ("Black", "Black"), ("Brown", "Brown"),
                                         ("Young", "Young"), ("King", "King")])
def test_a_surname_equal_to_a_kept_race_display_is_not_refused(engine, family, race):
    out = engine.deidentify(_patient(family, race)).resource
    assert out["extension"][0]["extension"][0]["valueCoding"]["display"] == race
    assert "name" not in out


def test_a_surname_equal_to_a_kept_code_is_not_refused(engine):
    out = engine.deidentify(_patient("White", "White", maritalStatus={"coding": [
        {"system": "http://example.org/codes", "code": "White", "display": "White"}]})).resource
    assert out["maritalStatus"]["coding"][0]["code"] == "White"


def test_a_city_named_as_its_state_is_not_refused(engine):
    out = engine.deidentify(_patient("Smith", address=[{"city": "New York", "state": "New York", "country": "US"}])).resource
    assert out["address"] == [{"state": "New York", "country": "US"}]


def test_the_same_token_where_the_rules_did_not_keep_it_is_still_refused(engine):
    engine.stack = _SeesNothing()
    engine.deidentify(_patient("White"))  # the kept display alone passes
    note = {"resourceType": "Observation", "status": "final", "code": {"text": "Mrs White is well"},
            "subject": {"reference": "Patient/p1"}}
    bundle = {"resourceType": "Bundle", "type": "collection",
              "entry": [{"resource": _patient("White")}, {"resource": note}]}
    with pytest.raises(LeakFound, match=r"NAME at Bundle\.entry\[1\]\.resource\.code\.text"):
        engine.deidentify(bundle)
    city = _patient("Smith", address=[{"city": "New York", "state": "New York"}],
                    maritalStatus={"text": "lives in New York"})
    with pytest.raises(LeakFound, match=r"GEOGRAPHIC_LOCATION at Patient\.maritalStatus\.text"):
        engine.deidentify(city)


def test_a_kept_by_design_element_whose_rule_is_not_keep_is_read(engine, monkeypatch):
    engine.stack = _SeesNothing()
    profile = engine.profile
    monkeypatch.setitem(profile.rules, "Patient.address.state", Rule("text"))
    monkeypatch.setattr(profile, "plans", {})
    with pytest.raises(LeakFound):
        engine.deidentify(_patient("Smith", address=[{"city": "New York", "state": "New York"}]))


def test_a_concept_text_equal_to_a_coding_display_is_kept_another_text_is_not(engine):
    engine.stack = _SeesNothing()
    concept = {"coding": [{"system": "http://example.org/codes", "code": "w", "display": "White"}], "text": "White"}
    out = engine.deidentify(_patient("White", maritalStatus=concept)).resource
    assert out["maritalStatus"]["text"] == "White"
    with pytest.raises(LeakFound, match=r"NAME at Patient\.maritalStatus\.text"):
        engine.deidentify(_patient("White", maritalStatus={**concept, "text": "White, widowed"}))


def test_the_engines_own_labels_and_tags_are_not_read_an_inputs_label_beside_them_is(engine):
    """meta.security and meta.tag: the labels and tags the engine adds are its own, whole (a patient named
    Redacted is no leak there); a label the input held in the same list is read like any other value."""
    out = engine.deidentify(_patient("Redacted")).resource
    assert {"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue", "code": "REDACTED"} in out["meta"]["security"]
    security = [{"system": "http://example.org/labels", "code": "x", "display": "Ann's"},
                {"system": "http://example.org/labels", "code": "Redacted"}]
    doc = {"resourceType": "Patient", "meta": {"security": security}}
    written = WrittenSlots()
    written.add(security, 1)  # the engine made the second label
    assert output_texts(doc, written) == ["http://example.org/labels", "x", "Ann's"]  # (systems read: #34)
    assert output_strings(doc, written, "Patient") == [("Patient.meta.security[0].system", "http://example.org/labels"),
                                                       ("Patient.meta.security[0].code", "x"),
                                                       ("Patient.meta.security[0].display", "Ann's")]
