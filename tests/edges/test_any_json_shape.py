"""No input ends a run (issue #34): a bundle whose JSON shapes are wrong anywhere (a list where FHIR has one
value, one value where it has a list, a number where a string, an object where a primitive, at any depth) is
bad input for that record, or de-identified or refused; never a traceback, on `fhir`, `bulk` and the service,
with validation full, sample and off. Mutations of a synthetic bundle, a bounded number of examples."""
from __future__ import annotations

import copy
import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from adapter.bulk.export import deidentify_export
from adapter.cli.main import app
from adapter.http.auth import TokenStore, add_client
from adapter.http.service import ServiceConfig, create_app
from fhir_transforms.errors import InputError, RecordRefused
from tests.conftest import FIXED_TODAY, TEST_SECRET, make_engine

RACE = "http://hl7.org/fhir/us/core/StructureDefinition/us-core-race"
PATIENT = {
    "resourceType": "Patient", "id": "pat-0001",
    "extension": [{"url": RACE, "extension": [
        {"url": "ombCategory", "valueCoding": {"system": "urn:oid:2.16.840.1.113883.6.238", "code": "2106-3",
                                               "display": "White"}},
        {"url": "text", "valueString": "White"}]}],
    "identifier": [{"type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203", "code": "MR"}]},
                    "system": "http://hospital.example/mrn", "value": "MRN-4471902"}],
    "name": [{"family": "Quorvath", "given": ["Ilsabet", "Mara"], "_given": [None, {"extension": [
        {"url": "http://hl7.org/fhir/StructureDefinition/data-absent-reason", "valueCode": "unknown"}]}]}],
    "telecom": [{"system": "phone", "value": "617-555-0142"}],
    "gender": "female", "birthDate": "1961-04-05",
    "_birthDate": {"extension": [{"url": "http://hl7.org/fhir/StructureDefinition/patient-birthTime",
                                  "valueDateTime": "1961-04-05T10:20:00-05:00"}]},
    "address": [{"line": ["12 Elm Street"], "city": "Brookline", "state": "MA", "postalCode": "02446"}],
}
LOCATION = {"resourceType": "Location", "id": "loc-1", "name": "North Clinic",
            "address": {"line": ["1 Main St"], "city": "Boston", "state": "MA", "postalCode": "02115"},
            "position": {"longitude": -71.1, "latitude": 42.3}}
ENCOUNTER = {"resourceType": "Encounter", "id": "enc-1", "status": "finished",
             "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
             "subject": {"reference": "urn:uuid:0a6c2b1e-7d7e-4f3a-9d8e-5b3b6f0c1a11", "display": "Ilsabet Quorvath"},
             "period": {"start": "2024-03-14T09:00:00Z", "end": "2024-03-14T09:30:00Z"},
             "location": [{"location": {"reference": "urn:uuid:1b7d3c2f-8e8f-4a4b-8e9f-6c4c7a1d2b22"}}]}
OBSERVATION = {"resourceType": "Observation", "id": "obs-1", "status": "final",
               "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}]},
               "subject": {"reference": "urn:uuid:0a6c2b1e-7d7e-4f3a-9d8e-5b3b6f0c1a11"},
               "effectiveDateTime": "2024-03-14T09:10:00Z", "issued": "2024-03-14T09:12:00.000Z",
               "valueQuantity": {"value": 72, "unit": "/min", "system": "http://unitsofmeasure.org", "code": "/min"},
               "note": [{"text": "Seen with Ilsabet's sister"}],
               "component": [{"code": {"text": "rhythm"}, "valueString": "regular"}]}
BUNDLE = {"resourceType": "Bundle", "type": "collection", "entry": [
    {"fullUrl": "urn:uuid:0a6c2b1e-7d7e-4f3a-9d8e-5b3b6f0c1a11", "resource": PATIENT},
    {"fullUrl": "urn:uuid:1b7d3c2f-8e8f-4a4b-8e9f-6c4c7a1d2b22", "resource": LOCATION},
    {"fullUrl": "urn:uuid:2c8e4d3a-9f9a-4b5c-9fa0-7d5d8b2e3c33", "resource": ENCOUNTER},
    {"fullUrl": "urn:uuid:3d9f5e4b-a0ab-4c6d-a0b1-8e6e9c3f4d44", "resource": OBSERVATION},
]}


def _paths(node, at=()):
    yield at
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if key != "resourceType":
            yield from _paths(value, (*at, key))


PATHS = [p for p in _paths(BUNDLE) if p]


def _reshape(value, how: str):
    """One wrong JSON shape for a value."""
    if how == "list":
        return [value]
    if how == "unlist":
        return value[0] if isinstance(value, list) and value else {"value": value}
    if how == "object":
        return {"value": value}
    if how == "values":
        return list(value.values()) if isinstance(value, dict) else [value, value]
    return {"number": 7, "float": 2.5, "string": "7", "true": True, "null": None, "empty-list": [],
            "empty-object": {}}[how]


SHAPES = ("list", "unlist", "object", "values", "number", "float", "string", "true", "null", "empty-list",
          "empty-object")


@st.composite
def reshaped(draw, doc=BUNDLE, paths=PATHS):
    """A copy of `doc` with one to three values given a wrong shape; and what was done (paths and shapes)."""
    out = copy.deepcopy(doc)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        path, how = draw(st.sampled_from(paths)), draw(st.sampled_from(SHAPES))
        parent = out
        try:
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = _reshape(parent[path[-1]], how)
        except (KeyError, IndexError, TypeError):  # a path an earlier mutation took away
            continue
        done.append((path, how))
    return out, done


def test_the_synthetic_bundle_is_valid_and_written(test_key):
    """The mutations start from valid FHIR that the engine writes: what they break is only the shape."""
    out = make_engine(test_key, validate=True).deidentify(copy.deepcopy(BUNDLE)).resource
    assert len(out["entry"]) == 4


def test_a_list_where_fhir_has_one_value_is_bad_input_naming_the_path(test_key):
    doc = copy.deepcopy(BUNDLE)
    doc["entry"][1]["resource"]["address"] = [doc["entry"][1]["resource"]["address"]]
    with pytest.raises(InputError, match=r"entry\[1\]\.resource\.address: expected one value"):
        make_engine(test_key, validate=False).deidentify(doc)
    doc = copy.deepcopy(BUNDLE)
    doc["entry"][0]["resource"]["address"] = doc["entry"][0]["resource"]["address"][0]
    with pytest.raises(InputError, match=r"entry\[0\]\.resource\.address: expected a list"):
        make_engine(test_key, validate=False).deidentify(doc)


def test_a_primitive_extension_that_is_not_an_object_is_bad_input_when_validated(test_key):
    """fhir.resources raises AttributeError (not a validation error) on `_birthDate: "7"`: it is bad input."""
    doc = copy.deepcopy(BUNDLE)
    doc["entry"][0]["resource"]["_birthDate"] = "7"
    with pytest.raises(InputError, match="not a valid FHIR R4 Bundle"):
        make_engine(test_key, validate=True).deidentify(doc)


def test_a_bulk_line_whose_id_is_a_list_is_refused_and_the_export_goes_on(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "Patient.000.ndjson").write_text(json.dumps({**PATIENT, "id": ["pat-0001"]}) + "\n"
                                                         + json.dumps(PATIENT) + "\n")
    (tmp_path / "in" / "Observation.000.ndjson").write_text(json.dumps({**OBSERVATION, "subject": [
        {"reference": "Patient/pat-0001"}]}) + "\n")
    deidentify_export(tmp_path / "in", tmp_path / "out", TEST_SECRET, stack="patterns", validate="off",
                      today=FIXED_TODAY.isoformat(), tty=False, log=lambda m: None)
    assert len((tmp_path / "out" / "Patient.000.ndjson").read_text().splitlines()) == 1


@settings(max_examples=150, deadline=None)
@given(reshaped(), st.booleans())
def test_the_engine_answers_every_shape_with_output_bad_input_or_refusal(test_key, case, validate):
    doc, _ = case
    try:
        make_engine(test_key, validate=validate).deidentify(doc, consume=True)
    except (InputError, RecordRefused):
        pass


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reshaped(), st.sampled_from(["off", "sample", "full"]))
def test_the_fhir_command_goes_on_past_any_shape(tmp_path_factory, test_key_file, case, validate):
    doc, _ = case
    root = tmp_path_factory.mktemp("shapes")
    (root / "in").mkdir()
    (root / "in" / "a-bad.json").write_text(json.dumps(doc))
    (root / "in" / "b-good.json").write_text(json.dumps(PATIENT))
    result = CliRunner().invoke(app, ["fhir", str(root / "in"), str(root / "out"), "--stack", "patterns",
                                      "--validate", validate, "--today", FIXED_TODAY.isoformat()],
                                env={"DEID_ADAPTER_KEY_FILE": str(test_key_file), "DEID_ADAPTER_AUDIT": "off"})
    assert result.exit_code in (0, 2, 3), result.output[-2000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert (root / "out" / "b-good.json").exists()  # the file after it is still read and written


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reshaped(), st.sampled_from(["off", "sample", "full"]))
def test_a_bulk_export_goes_on_past_any_shape(tmp_path_factory, case, validate):
    doc, _ = case
    root = tmp_path_factory.mktemp("bulk-shapes")
    (root / "in").mkdir()
    resources = [e["resource"] for e in doc["entry"] if isinstance(e, dict) and isinstance(e.get("resource"), dict)] \
        if isinstance(doc.get("entry"), list) else []
    lines = [json.dumps(r) for r in resources if r.get("resourceType") == "Patient"] + [json.dumps(PATIENT)]
    others = [json.dumps(r) for r in resources if r.get("resourceType") != "Patient"] or [json.dumps(OBSERVATION)]
    (root / "in" / "Patient.000.ndjson").write_text("\n".join(lines) + "\n")
    (root / "in" / "Other.000.ndjson").write_text("\n".join(others) + "\n")
    try:
        deidentify_export(root / "in", root / "out", TEST_SECRET, stack="patterns", validate=validate,
                          today=FIXED_TODAY.isoformat(), tty=False, log=lambda m: None)
    except InputError:
        pass  # not a bulk export at all (an exit 2 of the command)
    assert (root / "out" / "Patient.000.ndjson").exists()


@pytest.fixture(scope="module")
def client(tmp_path_factory, test_key):
    tokens = tmp_path_factory.mktemp("service") / "tokens.json"
    token = add_client(tokens, "interface-engine", ["fhir"])
    config = ServiceConfig(test_key, TokenStore.load(tokens), stack="patterns", clock=lambda: FIXED_TODAY)
    with TestClient(create_app(config)) as c:
        yield c, token


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reshaped())
def test_the_service_answers_any_shape_with_a_4xx_outcome_never_a_500(client, case):
    c, token = client
    doc, _ = case
    resp = c.post("/fhir/$de-identify", content=json.dumps(doc),
                  headers={"Content-Type": "application/fhir+json", "Authorization": f"Bearer {token}"})
    assert resp.status_code in (200, 400, 422), resp.text[:500]
    if resp.status_code != 200:
        assert resp.json()["resourceType"] == "OperationOutcome"
