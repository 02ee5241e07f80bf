"""A Bundle de-identified entry by entry (fhir_transforms/r4/stream.py) comes out as the whole Bundle does:
the same JSON, key order included, whatever the batch size; an identifier found in a later entry masks the
narrative of an earlier one."""
from __future__ import annotations

import json

import pytest

from fhir_transforms.r4 import stream
from tests.conftest import DATA, make_engine

SAMPLES = DATA / "fhir"
BUNDLES = [SAMPLES / "hl7-r4-examples" / "Bundle-father.json", SAMPLES / "hl7-r4-examples" / "Bundle-bundle-transaction.json",
           sorted((SAMPLES / "synthea-bundles").glob("*.json"))[0]]


def streamed(engine, bundle: dict) -> dict:
    """The streamed output assembled as the CLI writes it: the keys before `entry`, the entries, the rest."""
    header = {k: v for k, v in bundle.items() if k != "entry"}
    before = list(bundle)[:list(bundle).index("entry")]
    out: list = []
    result, in_place = stream.deidentify_entries(engine, header, before,
                                                 lambda: iter(json.loads(json.dumps(bundle["entry"]))), out.append)
    doc = {k: v for k, v in result.resource.items() if k in in_place}
    if out:
        doc["entry"] = out
    doc.update((k, v) for k, v in result.resource.items() if k not in in_place)
    return doc


@pytest.mark.parametrize("batch", [1, 3, 256])
@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.name[:24])
def test_streamed_output_is_the_whole_bundles(path, batch, test_key, monkeypatch):
    monkeypatch.setattr(stream, "BATCH", batch)
    bundle = json.loads(path.read_text())
    whole = make_engine(test_key, validate=False).deidentify(json.loads(json.dumps(bundle)), consume=True).resource
    by_entry = streamed(make_engine(test_key, validate=False), bundle)
    assert json.dumps(by_entry) == json.dumps(whole)  # key order included


def test_identifiers_from_a_later_entry_mask_an_earlier_narrative(test_key, monkeypatch):
    monkeypatch.setattr(stream, "BATCH", 1)  # each entry in its own batch: the name is met two batches later
    note = {"resourceType": "Observation", "id": "o1", "status": "final", "code": {"text": "note"},
            "text": {"status": "generated",
                     "div": '<div xmlns="http://www.w3.org/1999/xhtml">Seen with Quillon Varnabee on 2019-03-07</div>'}}
    # a date the rules shift: a known identifier only the walk of its entry finds
    other = {"resourceType": "Observation", "id": "o2", "status": "final", "code": {"text": "other"},
             "effectiveDateTime": "2019-03-07"}
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Varnabee", "given": ["Quillon"]}]}
    bundle = {"resourceType": "Bundle", "type": "collection",
              "entry": [{"resource": note}, {"resource": other}, {"resource": patient}]}
    out = streamed(make_engine(test_key, validate=False), bundle)
    div = out["entry"][0]["resource"]["text"]["div"]
    assert "Varnabee" not in div and "Quillon" not in div and "2019-03-07" not in div
    whole = make_engine(test_key, validate=False).deidentify(json.loads(json.dumps(bundle)), consume=True).resource
    assert json.dumps(out) == json.dumps(whole)


def test_only_a_bundle_without_validation_streams(test_key):
    assert stream.streamable(make_engine(test_key, validate=False), {"resourceType": "Bundle"})
    assert not stream.streamable(make_engine(test_key, validate=True), {"resourceType": "Bundle"})
    assert not stream.streamable(make_engine(test_key, validate=False), {"resourceType": "Patient"})
