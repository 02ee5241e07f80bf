"""Outputs are valid R4: the dom invariants hold, and no profile claim is left that the output breaks."""
from __future__ import annotations

import json

import pytest

from tests.conftest import CASES
from tests.r4.r4_invariants import violations

GOLDEN = sorted(p for p in CASES.glob("*/*.json") if not p.name.endswith(".expected.json") and p.parent.name != "refused")


def _with_contained() -> dict:
    med = {"resourceType": "Medication", "id": "med1", "code": {"text": "aspirin"}}
    request = {
        "resourceType": "MedicationRequest", "id": "rx", "status": "active", "intent": "order",
        "meta": {"profile": ["http://hl7.org/fhir/us/core/StructureDefinition/us-core-medicationrequest"]},
        "contained": [med, {"resourceType": "Practitioner", "id": "doc", "name": [{"family": "Hale"}],
                            "birthDate": "1970-02-03"}],
        "medicationReference": {"reference": "#med1"}, "requester": {"reference": "#doc"},
        "subject": {"reference": "Patient/p1"}, "authoredOn": "2020-04-05",
        "text": {"status": "generated", "div": '<div xmlns="http://www.w3.org/1999/xhtml">aspirin for Hale</div>'},
    }
    return request


def test_contained_resources_carry_no_labels_their_container_does(engine):
    given = _with_contained()
    out = engine.deidentify(given).resource
    assert violations(out, given) == []
    assert all("meta" not in c for c in out["contained"])
    codes = {c["code"] for c in out["meta"]["security"]}
    assert {"REDACTED", "ABSTRED", "PSEUDED"} <= codes  # the contained Practitioner's name and birth date
    assert "profile" not in out["meta"]


@pytest.mark.parametrize("case", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_golden_output_holds_the_invariants(case, engine):
    given = json.loads(case.read_text())
    expected = json.loads(case.with_name(case.stem + ".expected.json").read_text())
    assert violations(expected, given) == []
