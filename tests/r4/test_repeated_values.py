"""A record rewrites a value it has seen before (a reference, a coding's display) from the outcome it had the
first time (fhir_transforms/r4/walker.py, methods.repeatable): the output must be what applying the rule to
every occurrence gives, which is what the walk does when each pseudonym issued is reported (no reuse)."""
from __future__ import annotations

import json

import pytest

from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.rules import load_profile
from tests.conftest import FIXED_TODAY, SHARED
from text_deid.stack import build_stack

BUNDLES = sorted((SHARED / "fhir" / "synthea-bundles").glob("*.json"))
PRACTITIONER = "urn:uuid:5b8e2e8c-6a0c-4a31-9a55-0d7a2f5d4c11"
PATIENT = "urn:uuid:0f3c3a0e-1d1b-4f59-9a0d-6f2b1d9a7e42"


def engine(key, reported: list | None = None) -> Deidentifier:
    on_issue = None if reported is None else (lambda *issued: reported.append(issued[1]))
    return Deidentifier(load_profile("safe-harbor"), Pseudonymizer(key, on_issue=on_issue), build_stack("patterns"),
                        lambda: FIXED_TODAY, validate=False)


def observation(n: int) -> dict:
    """An Observation without an id: its only pseudonyms are its references, so its labels come from them."""
    return {"resourceType": "Observation", "status": "final",
            "code": {"coding": [{"system": "http://loinc.org", "code": "8302-2", "display": "Body Height"}]},
            "subject": {"reference": PATIENT},
            # Observation.performer may point at people or organizations: only the reference tells which
            "performer": [{"reference": PRACTITIONER, "display": "Dr. Quentin Smithers"}],
            "valueQuantity": {"value": 170 + n, "unit": "cm"}}


def repeated() -> dict:
    return {"resourceType": "Bundle", "type": "collection", "entry": [
        {"fullUrl": PATIENT, "resource": {"resourceType": "Patient", "id": "0f3c3a0e-1d1b-4f59-9a0d-6f2b1d9a7e42",
                                          "name": [{"family": "Doe", "given": ["Ann"]}]}},
        {"fullUrl": PRACTITIONER, "resource": {"resourceType": "Practitioner",
                                               "id": "5b8e2e8c-6a0c-4a31-9a55-0d7a2f5d4c11"}},
        *({"resource": observation(n)} for n in range(3))]}


def labels(resource: dict) -> set[str]:
    return {s["code"] for s in resource.get("meta", {}).get("security", [])}


def test_each_occurrence_of_a_repeated_reference_gets_the_first_ones_outcome(test_key):
    out = engine(test_key).deidentify(repeated()).resource
    observations = [e["resource"] for e in out["entry"][2:]]
    assert len({json.dumps(o["subject"]) for o in observations}) == 1
    for o in observations:
        assert "PSEUDED" in labels(o)  # a label the first occurrence gave is given again, resource by resource
        # the display of a reference to a Practitioner is a name, however often the reference was seen before
        assert "Smithers" not in json.dumps(o["performer"])
    assert out == engine(test_key, reported=[]).deidentify(repeated()).resource


def test_each_pseudonym_issued_is_still_reported_when_values_repeat(test_key):
    reported: list = []
    engine(test_key, reported).deidentify(repeated())
    # three Observations point at the patient and the practitioner; the entries' fullUrls and ids once each
    assert reported.count("0f3c3a0e-1d1b-4f59-9a0d-6f2b1d9a7e42") == 3 + 2
    assert reported.count("5b8e2e8c-6a0c-4a31-9a55-0d7a2f5d4c11") == 3 + 2


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.stem)
def test_reusing_outcomes_gives_the_same_bytes_as_applying_every_rule(path, test_key):
    text = path.read_text()
    reused = engine(test_key).deidentify(json.loads(text), consume=True)
    applied = engine(test_key, reported=[]).deidentify(json.loads(text), consume=True)
    assert json.dumps(reused.resource) == json.dumps(applied.resource)
    assert reused.findings == applied.findings
