"""Every resource is a record wherever it sits (issue #36 item 2): a Patient inside a Parameters (at the top,
in a parameter's part, as a Bundle entry), in a nested Bundle or contained, is walked with its own rules and
its people's known identifiers mask its narrative; URLs that carry search parameters have their values ruled
like the elements they search."""
from __future__ import annotations

import json

import pytest

SURNAME, GIVEN = "Quorvath", "Ilsabet"
DIV = f'<div xmlns="http://www.w3.org/1999/xhtml">{GIVEN} {SURNAME}, born 1950</div>'


def patient(pid: str = "p1") -> dict:
    return {"resourceType": "Patient", "id": pid, "name": [{"family": SURNAME, "given": [GIVEN]}],
            "birthDate": "1950-03-02", "text": {"status": "generated", "div": DIV}}


def parameters(*params: dict) -> dict:
    return {"resourceType": "Parameters", "parameter": list(params)}


def collection(*entries: dict) -> dict:
    return {"resourceType": "Bundle", "type": "collection", "entry": list(entries)}


CONTAINERS = {
    "parameters": parameters({"name": "patient", "resource": patient()}),
    "parameter part": parameters({"name": "match", "part": [{"name": "x", "part": [
        {"name": "patient", "resource": patient()}]}]}),
    "parameters in a bundle": collection({"fullUrl": "urn:uuid:00000000-0000-4000-8000-000000000001",
                                          "resource": parameters({"name": "patient", "resource": patient()})}),
    "nested bundle": collection({"fullUrl": "urn:uuid:00000000-0000-4000-8000-000000000001", "resource": collection(
        {"fullUrl": "urn:uuid:00000000-0000-4000-8000-000000000002", "resource": patient()})}),
    "outcome of a response": {"resourceType": "Bundle", "type": "batch-response", "entry": [
        {"response": {"status": "200", "outcome": {
            "resourceType": "OperationOutcome", "issue": [{"severity": "information", "code": "informational"}],
            "contained": [patient()]}}}]},
}


@pytest.mark.parametrize("where", list(CONTAINERS))
def test_a_patient_in_a_container_is_a_record(engine, where):
    out = json.dumps(engine.deidentify(CONTAINERS[where]).resource)
    assert SURNAME not in out and GIVEN not in out


def test_its_people_are_known_to_the_other_resources_of_the_record(engine):
    note = {"resourceType": "Observation", "id": "o1", "status": "final", "code": {"text": "note"},
            "valueString": f"Seen with {GIVEN} {SURNAME} today"}
    doc = parameters({"name": "patient", "resource": patient()}, {"name": "note", "resource": note})
    result = engine.deidentify(doc)
    assert SURNAME not in json.dumps(result.resource)
    assert any(k.value == SURNAME for k in result.known)


SEARCH_URLS = [
    f"Patient?name={SURNAME}",
    f"Patient?family={SURNAME}&given={GIVEN}",
    f"https://fhir.example/Patient?birthdate=1950-03-02&name:exact={SURNAME}",
    "Patient?phone=555-0142&identifier=urn:oid:1.2.3|4471902",
]


@pytest.mark.parametrize("url", SEARCH_URLS)
@pytest.mark.parametrize("place", ["link", "request", "fullUrl"])
def test_search_parameter_values_in_urls_are_ruled(engine, url, place):
    entry: dict = {"resource": {"resourceType": "Basic", "id": "b1", "code": {"text": "x"}}}
    if place == "link":
        entry["link"] = [{"relation": "self", "url": url}]
    elif place == "request":
        entry["request"] = {"method": "GET", "url": url}
    else:
        entry["fullUrl"] = url if url.startswith("http") else f"https://fhir.example/{url}"
    doc = {"resourceType": "Bundle", "type": "batch" if place == "request" else "collection", "entry": [entry]}
    out = engine.deidentify(doc).resource
    text = json.dumps(out)
    for value in (SURNAME, GIVEN, "1950-03-02", "555-0142", "4471902"):
        assert value not in text
    written = out["entry"][0]
    kept = (written["link"][0]["url"] if place == "link" else written["request"]["url"] if place == "request"
            else written["fullUrl"])
    assert kept.split("?")[0].endswith("Patient")  # the search itself (the type, the parameters' names) stays


def test_a_search_keeps_its_result_parameters_and_pseudonymizes_ids(engine):
    url = f"https://fhir.example/Patient?name={SURNAME}&_count=10&_id=p1&_sort=birthdate"
    doc = collection({"link": [{"relation": "self", "url": url}], "resource": patient()})
    written = engine.deidentify(doc).resource["entry"][0]
    link = written["link"][0]["url"]
    assert SURNAME not in link and "_count=10" in link and "_sort=birthdate" in link
    assert f"_id={written['resource']['id']}" in link  # the same pseudonym as the id it searched for
