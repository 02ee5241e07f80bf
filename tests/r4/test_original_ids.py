"""Original resource ids are known identifiers: a narrative that cites them would link pseudonyms back."""
from __future__ import annotations

import json

import pytest

from fhir_transforms.errors import LeakFound

UUID = "0d6c8f1e-2b7a-4c39-9d0e-5f1a2b3c4d5e"


def _bundle(div: str) -> dict:
    patient = {"resourceType": "Patient", "id": "23", "gender": "female"}
    obs = {
        "resourceType": "Observation", "id": "example", "status": "final",
        "code": {"text": "weight"}, "subject": {"reference": "Patient/23"},
        "encounter": {"reference": f"urn:uuid:{UUID}"},
        "text": {"status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{div}</div>'},
    }
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"fullUrl": "http://example.org/fhir/Patient/23", "resource": patient}, {"resource": obs}]}


def _div(out: dict) -> str:
    return out["entry"][1]["resource"]["text"]["div"]


@pytest.mark.parametrize("cited", [
    'Weight of <a href="Patient/23">Patient/23</a>',
    "See Observation/example for the trend",
    f"Seen in encounter {UUID}",
])
def test_a_narrative_citing_an_original_id_is_masked(engine, cited):
    out = engine.deidentify(_bundle(cited)).resource
    text = json.dumps(out)
    assert "Patient/23" not in text and "Observation/example" not in text and UUID not in text
    assert "MASKED" in {c["code"] for c in out["entry"][1]["resource"]["meta"]["security"]}


def test_short_ids_are_looked_for_only_in_a_reference_shaped_context(engine):
    out = engine.deidentify(_bundle("23 kg, for example")).resource
    assert "23 kg, for example" in _div(out)


class _SeesNothing:
    """A text stack that finds nothing: what is left for the leak guard alone."""

    def detect_many(self, texts, known, timings=None):
        return [[] for _ in texts]


def test_the_leak_guard_refuses_an_original_id_the_text_stack_missed(engine):
    engine.stack = _SeesNothing()
    with pytest.raises(LeakFound, match="UNIQUE_IDENTIFIER"):
        engine.deidentify(_bundle("Weight of Patient/23"))


def test_conditional_reference_identifiers_are_known(engine):
    res = {"resourceType": "Observation", "status": "final", "code": {"text": "MRN A7781234 weight"},
           "subject": {"reference": "Patient?identifier=http://hospital.example/mrn|A7781234"}}
    out = engine.deidentify(res).resource
    assert "A7781234" not in json.dumps(out)

