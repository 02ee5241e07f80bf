"""The service reads R5 when a request says so (media type fhirVersion, or the fhirVersion parameter), or when
started with --fhir-version r5; a version the two ways disagree on is a 400."""
from __future__ import annotations

import json

import pytest

from tests.conftest import CASES
from tests.support import FHIR, assert_outcome, post, serve

OLD = CASES / "r5" / "safe-harbor" / "patient-over-89.json"  # R5 elements, no version marker
EXPECTED = json.loads((CASES / "r5" / "safe-harbor" / "patient-over-89.expected.json").read_text())
R5_MEDIA = {"Content-Type": "application/fhir+json; fhirVersion=5.0"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, test_key_file):
    with serve(tmp_path_factory.mktemp("service-versions"), test_key_file, "--stack", "patterns") as running:
        yield running


def wrapped(resource: dict, version: str) -> dict:
    return {"resourceType": "Parameters", "parameter": [{"name": "resource", "resource": resource},
                                                        {"name": "fhirVersion", "valueCode": version}]}


def test_a_request_names_r5_by_media_type_or_parameter(server):
    doc = json.loads(OLD.read_text())
    resp = post(server, doc, headers=R5_MEDIA)
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json() == EXPECTED
    resp = post(server, wrapped(doc, "r5"))
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["parameter"][0]["resource"] == EXPECTED


def test_r5_unnamed_is_a_400_naming_the_fix(server):
    body = assert_outcome(post(server, json.loads(OLD.read_text()), headers=FHIR), 400)
    assert "--fhir-version r5" in body["issue"][0]["diagnostics"]


def test_versions_that_disagree_or_are_unknown_are_refused(server):
    doc = json.loads(OLD.read_text())
    assert_outcome(post(server, wrapped(doc, "r4"), headers=R5_MEDIA), 400)
    assert_outcome(post(server, wrapped(doc, "r7")), 400)
    assert_outcome(post(server, doc, headers={"Content-Type": "application/fhir+json; fhirVersion=2.0"}), 415)


def test_the_start_up_option_sets_the_version_of_unnamed_requests(tmp_path, test_key_file):
    with serve(tmp_path, test_key_file, "--stack", "patterns", "--fhir-version", "r5") as r5_server:
        resp = post(r5_server, json.loads(OLD.read_text()))
        assert resp.status_code == 200, resp.text[:300]
        assert resp.json() == EXPECTED
