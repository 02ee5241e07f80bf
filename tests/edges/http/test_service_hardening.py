"""The HTTP service under strict input (issue #17): bad bodies, unknown routes and unknown profiles answer
OperationOutcomes with 4xx, and the engine cache stays bounded however requests spell a profile.

A real uvicorn server on a free port, run in this process so that the test can look at its engine cache."""
from __future__ import annotations

import os
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from adapter.cli.common import serve_app
from adapter.http.service import ServiceConfig, create_app
from adapter.http.auth import TokenStore, add_client
from fhir_transforms import rules
from tests.conftest import FIXED_TODAY
from tests.support import assert_outcome, post

PATIENT = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Zyxwortel"}], "birthDate": "1971-04-05"}


@pytest.fixture(scope="module")
def service(tmp_path_factory, test_key):
    tokens = tmp_path_factory.mktemp("service") / "tokens.json"
    token = add_client(tokens, "interface-engine", ["fhir", "metadata"])
    config = ServiceConfig(test_key, TokenStore.load(tokens), stack="patterns", clock=lambda: FIXED_TODAY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    yield {"base": f"http://127.0.0.1:{port}", "token": token, "config": config}
    server.should_exit = True
    thread.join(timeout=10)


def outcome_of(resp: httpx.Response, status: int) -> str:
    """The diagnostics of a valid OperationOutcome answered with `status`."""
    return assert_outcome(resp, status)["issue"][0]["diagnostics"]


def with_profile(profile: str) -> dict:
    return {"resourceType": "Parameters", "parameter": [{"name": "resource", "resource": PATIENT},
                                                        {"name": "profile", "valueString": profile}]}


def test_a_duplicate_key_is_400_naming_the_path_not_the_values(service):
    resp = post(service, '{"resourceType": "Patient", "name": [{"family": "Zyxwortel", "family": "Quorvath"}]}')
    diagnostics = outcome_of(resp, 400)
    assert diagnostics == "duplicate JSON key at name[0].family"


@pytest.mark.parametrize("number", ["NaN", "-Infinity", "1e400"])
def test_nan_or_infinity_is_400_not_a_bare_nan_written(service, number):
    resp = post(service, '{"resourceType": "Observation", "status": "final", "code": {"text": "x"}, '
                         '"valueQuantity": {"value": %s}}' % number)
    assert outcome_of(resp, 400) == "invalid JSON: NaN or Infinity is not a JSON number"


@pytest.mark.parametrize("levels", [150, 5000])  # 300 JSON levels failed in the engine, 10,000 in json itself
def test_deep_json_is_400_not_500(service, levels):
    ext = '{"url": "http://example.org/x", "valueString": "v"}'
    for _ in range(levels):
        ext = '{"url": "http://example.org/x", "extension": [' + ext + ']}'
    resp = post(service, '{"resourceType": "Patient", "extension": [' + ext + ']}')
    assert "nested deeper than 100 levels" in outcome_of(resp, 400)


def test_unknown_routes_and_methods_are_operation_outcomes(service):
    assert outcome_of(httpx.get(service["base"] + "/no/such/thing"), 404) == "Not Found"
    assert outcome_of(httpx.get(service["base"] + "/fhir/$de-identify"), 405) == "Method Not Allowed"


def test_a_profile_outside_the_packaged_set_is_refused(service, tmp_path):
    """Any YAML file on the server (here a copy of safe-harbor: a site's edit of it would still call itself that)."""
    (tmp_path / "keeps-dates.yaml").write_text((rules.MAPPINGS / "safe-harbor.yaml").read_text())
    resp = post(service, with_profile(os.path.relpath(tmp_path / "keeps-dates", rules.MAPPINGS)))
    assert "unknown profile" in outcome_of(resp, 400)


def test_many_spellings_of_a_profile_do_not_grow_the_engine_cache(service):
    engines = service["config"].engines
    assert post(service, with_profile("safe-harbor")).status_code == 200
    before = dict(engines)
    for n in range(1, 21):
        resp = post(service, with_profile("./" * n + "safe-harbor"))
        assert "unknown profile" in outcome_of(resp, 400)
    assert post(service, PATIENT).status_code == 200  # the default profile and stack: the same engine
    assert engines == before and len(engines) == 1


# Issue #36, the smaller items: what a request names is never echoed, each in-parameter counts once, the API
# description is not served, and a body with two framings is refused.

def _parameters(*params: dict) -> dict:
    return {"resourceType": "Parameters", "parameter": list(params)}


def test_a_parameter_given_twice_is_refused_not_guessed(service):
    first, second = {**PATIENT, "id": "p1"}, {**PATIENT, "id": "p2"}
    for doc in (_parameters({"name": "resource", "resource": first}, {"name": "resource", "resource": second}),
                _parameters({"name": "resource", "resource": first}, {"name": "profile", "valueString": "safe-harbor"},
                            {"name": "profile", "valueString": "longitudinal"})):
        assert "given 2 times" in outcome_of(post(service, doc), 400)


def test_an_unknown_stack_or_profile_is_400_and_not_echoed(service):
    odd = "Zyxwortel-stack-617-555-0142"
    for name in ("stack", "profile"):
        resp = post(service, _parameters({"name": "resource", "resource": PATIENT}, {"name": name, "valueString": odd}))
        diagnostics = outcome_of(resp, 400)
        assert f"unknown {name}" in diagnostics and odd not in resp.text


def test_a_400_names_the_place_not_the_key_or_resource_type_sent(service):
    odd = "Zyxwortel6175550142"
    for doc in ({**PATIENT, odd: "x"}, {**PATIENT, "name": [{"family": "Doe", odd: 1}]},
                {"resourceType": odd, "id": "p1"}, f'{{"resourceType": "Patient", "{odd}": 1, "{odd}": 2}}'):
        resp = post(service, doc)
        assert outcome_of(resp, 400) and odd not in resp.text


def test_the_service_trusts_no_forwarded_headers(monkeypatch):
    """uvicorn's default takes X-Forwarded-For from any client on 127.0.0.1 as the client's address."""
    served = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(self.config))
    with socket.socket() as sock:
        serve_app(create_app(ServiceConfig(None, None)), sock, None, None, "")
    assert served[0].proxy_headers is False


def test_the_api_description_is_not_served(service):
    resp = httpx.get(service["base"] + "/openapi.json")
    assert resp.status_code == 404 and "paths" not in resp.text


def test_content_length_beside_transfer_encoding_is_refused(service):
    body = b'{"resourceType": "Patient", "id": "p1"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    host, port = service["base"].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /fhir/$de-identify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + service["token"].encode()
                  + b"\r\nContent-Type: application/fhir+json\r\nContent-Length: %d\r\n" % len(chunked)
                  + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.split(b" ", 2)[1] == b"400", answer[:200]
