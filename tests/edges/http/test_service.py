"""The HTTP service, tested against a real uvicorn server on a free port with a real HTTP client."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from fhir.resources.R4B import get_fhir_model_class
from hypothesis import HealthCheck, given, settings, strategies as st

from adapter.http.auth import add_client
from fhir_transforms.hl7v2 import message as er7
from tests.conftest import DATA, run_cli
from tests.support import FHIR, assert_outcome, post, serve

CANARY = {"given": "Quorvath", "family": "Zelbrindex", "mrn": "MRN-88127733", "phone": "612-555-0193",
          "city": "Vexlow Harbor"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, test_key_file):
    workdir = tmp_path_factory.mktemp("service")
    fhir_only = add_client(workdir / "tokens.json", "research-portal", ["fhir"])
    with serve(workdir, test_key_file, "--max-body-mb", "3", "--workers", "2") as running:
        yield {**running, "fhir_only": fhir_only}


def test_each_synthea_bundle_over_http_equals_the_cli_output(server, tmp_path, test_key_file):
    bundles = sorted((DATA / "fhir" / "synthea-bundles").glob("*.json"))
    run_cli("fhir", str(DATA / "fhir" / "synthea-bundles"), str(tmp_path / "cli"), "--today", "2026-01-15", "--keep-file-names",
            key_file=test_key_file, check=True)
    for path in bundles:
        resp = post(server, path.read_bytes())
        assert resp.status_code == 200, resp.text[:300]
        assert resp.headers["content-type"].startswith("application/fhir+json")
        assert resp.json() == json.loads((tmp_path / "cli" / path.name).read_text()), path.name


def test_parameters_in_parameters_out(server):
    patient = json.loads((DATA / "fhir" / "hl7-r4-examples" / "Patient-example.json").read_text())
    params = {"resourceType": "Parameters", "parameter": [{"name": "resource", "resource": patient},
                                                          {"name": "profile", "valueCode": "longitudinal"}]}
    resp = post(server, params, headers={"Content-Type": "application/json"})
    assert resp.status_code == 200
    out = resp.json()
    assert out["resourceType"] == "Parameters" and out["parameter"][0]["name"] == "return"
    returned = out["parameter"][0]["resource"]
    assert returned["resourceType"] == "Patient" and len(returned["birthDate"]) == 10  # shifted, not cut to a year
    assert returned["birthDate"] != patient["birthDate"]


def test_hl7v2_call(server):
    message = (DATA / "hl7v2" / "ADT-A01-01.hl7").read_bytes()
    resp = httpx.post(server["base"] + "/hl7v2/$de-identify", content=message, timeout=60,
                      headers={"Content-Type": "x-application/hl7-v2+er7", "Authorization": f"Bearer {server['token']}"})
    assert resp.status_code == 200, resp.text[:300]
    assert resp.text.startswith("MSH|")
    assert [s[:3] for s in resp.text.strip("\r").split("\r")] == [s[:3] for s in message.decode().strip("\r").split("\r")]


LATIN1_ADT = ("MSH|^~\\&|LAB|NORTH|EHR|SOUTH|20240101120000||ADT^A01|L1-{n}|P|2.5.1||||||{msh18}\r"
              "PID|1||12345^^^H^MR||Müller^Jürgen||19600101|M\r"
              "NTE|1||Jürgen Müller called back\r")


@pytest.mark.parametrize("msh18, status", [("8859/1", 200), ("", 400)])
def test_hl7v2_bytes_are_read_by_msh18_never_with_replaced_characters(server, msh18, status):
    """A Latin-1 message is read as Latin-1 when MSH-18 says so (the name is then found in the note); undeclared
    non-UTF-8 bytes are a 400, as files and MLLP frames are refused, never read with U+FFFD in place of "ü"."""
    message = LATIN1_ADT.format(n=status, msh18=msh18).encode("latin-1")
    resp = httpx.post(server["base"] + "/hl7v2/$de-identify", content=message, timeout=60,
                      headers={"Content-Type": "x-application/hl7-v2+er7", "Authorization": f"Bearer {server['token']}"})
    assert resp.status_code == status, resp.text[:300]
    assert "ller" not in resp.text and "\ufffd" not in resp.text
    if status == 400:
        assert resp.json()["resourceType"] == "OperationOutcome"


UNITS_ORU = ("MSH|^~\\&|LAB|NORTH|EHR|SOUTH|20240101120000||ORU^R01|U1-{n}|P|2.5.1||||||{msh18}\r"
             "PID|1||12345^^^H^MR||Müller^Jürgen||19600101|M\r"
             "OBX|1|NM|14682-9^Creatinine^LN||88|µmol/L|||||F\r")


@pytest.mark.parametrize("msh18, sent, written, charset", [
    ("8859/1", "latin-1", "latin-1", "iso-8859-1"),
    ("8859/1", "utf-8", "latin-1", "iso-8859-1"),  # UTF-8 bytes under an 8859/1 label go out in 8859/1
    ("ASCII", "utf-8", "utf-8", "utf-8"),          # µ does not fit ASCII: MSH-18 becomes UNICODE UTF-8
])
def test_hl7v2_answer_bytes_agree_with_its_msh18_and_content_type(server, msh18, sent, written, charset):
    """The HTTP answer is written as the `hl7` command and the MLLP listener write: in the charset its own MSH-18
    names, which the Content-Type names too, so a receiver that follows either reads "µmol/L", never "Âµmol/L"."""
    message = UNITS_ORU.format(n=sent, msh18=msh18).encode(sent)
    resp = post(server, message, headers={"Content-Type": "x-application/hl7-v2+er7"}, path="/hl7v2/$de-identify")
    assert resp.status_code == 200, resp.text[:300]
    assert resp.headers["content-type"].lower() == f"x-application/hl7-v2+er7; charset={charset}"
    text = resp.content.decode(written)
    assert er7.CHARSETS[text.split("\r")[0].split("|")[17]] == written
    assert "|µmol/L|" in text and "Â" not in text and "ller" not in text


def test_metadata_is_a_valid_capability_statement_naming_the_operation(server):
    resp = httpx.get(server["base"] + "/fhir/metadata", headers={"Authorization": f"Bearer {server['token']}"})
    cap = resp.json()
    get_fhir_model_class("CapabilityStatement").model_validate(cap)
    assert cap["rest"][0]["operation"][0]["name"] == "de-identify"
    opdef = httpx.get(server["base"] + "/fhir/OperationDefinition/de-identify",
                      headers={"Authorization": f"Bearer {server['token']}"}).json()
    get_fhir_model_class("OperationDefinition").model_validate(opdef)


def test_error_statuses_are_operation_outcomes(server):
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Zelbrindex"}]}
    assert_outcome(post(server, b'{"resourceType": "Patient", '), 400)  # malformed JSON
    assert_outcome(post(server, {"resourceType": "Patient", "birthDate": "not-a-date"}), 400)  # invalid FHIR
    resp = httpx.post(server["base"] + "/fhir/$de-identify", content=json.dumps(patient), headers=FHIR)
    assert_outcome(resp, 401)
    assert_outcome(post(server, patient, token="wrong"), 401)
    hl7 = httpx.post(server["base"] + "/hl7v2/$de-identify", content=b"MSH|^~\\&|", headers={
        "Content-Type": "text/plain", "Authorization": f"Bearer {server['fhir_only']}"})
    assert_outcome(hl7, 403)
    assert_outcome(post(server, b"{" + b" " * (4 * 1024 * 1024) + b"}"), 413)
    assert_outcome(post(server, json.dumps(patient), headers={"Content-Type": "text/xml"}), 415)
    leak = dict(patient, language="Zelbrindex")  # a kept code (Coding values are kept by design: not refused)
    body = assert_outcome(post(server, leak), 422)
    assert "NAME" in body["issue"][0]["diagnostics"] and "Zelbrindex" not in json.dumps(body)
    modext = {"resourceType": "Observation", "id": "o", "status": "final", "code": {"text": "x"},
              "modifierExtension": [{"url": "http://example.org/x", "valueBoolean": True}]}
    assert_outcome(post(server, modext), 422)
    unavailable = {"resourceType": "Parameters", "parameter": [{"name": "resource", "resource": patient},
                                                               {"name": "stack", "valueCode": "recall-first"}]}
    assert_outcome(post(server, unavailable), 503)


def test_liveness_needs_no_token_but_everything_else_does(server):
    assert httpx.get(server["base"] + "/healthz").status_code == 200
    for path in ("/fhir/metadata", "/metrics", "/readyz"):
        assert httpx.get(server["base"] + path).status_code == 401
    ready = httpx.get(server["base"] + "/readyz", headers={"Authorization": f"Bearer {server['token']}"})
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def canary_patient(**extra) -> dict:
    c = CANARY
    return {"resourceType": "Patient", "id": "canary-1",
            "name": [{"family": c["family"], "given": [c["given"]]}],
            "identifier": [{"system": "http://hospital.example/mrn", "value": c["mrn"]}],
            "telecom": [{"system": "phone", "value": c["phone"]}],
            "address": [{"city": c["city"], "state": "MN"}], **extra}


def test_canary_values_never_reach_logs_metrics_errors_or_files(server):
    c = CANARY
    bodies = []
    good = post(server, canary_patient(text={"status": "generated",
                                             "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{c["given"]} {c["family"]} '
                                                    f'{c["phone"]}</div>'}))
    assert good.status_code == 200
    bodies.append(good.text)
    bad = post(server, json.dumps(canary_patient())[:-5])  # malformed
    refused = post(server, canary_patient(language=c["family"]))
    invalid = post(server, canary_patient(birthDate=c["mrn"]))
    assert (bad.status_code, refused.status_code, invalid.status_code) == (400, 422, 400)
    bodies += [bad.text, refused.text, invalid.text]
    bodies.append(httpx.get(server["base"] + "/metrics", headers={"Authorization": f"Bearer {server['token']}"}).text)
    written = [p.read_text(errors="replace") for p in Path(server["dir"]).rglob("*") if p.is_file() and p.name != "tokens.json"]
    everything = "\n".join(bodies + written).lower()
    assert server["log"].read_text().count('"operation"') > 3  # the access log is there and was searched
    for value in c.values():
        assert value.lower() not in everything, "a planted value leaked"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=20)
resource_like = st.fixed_dictionaries({"resourceType": st.sampled_from(["Patient", "Observation", "Bundle", "Parameters",
                                                                       "Nope", ""])},
                                      optional={"id": st.text(max_size=10), "name": json_values, "entry": json_values,
                                                "parameter": json_values, "text": json_values, "birthDate": json_values})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(resource_like, json_values))
def test_fuzz_finds_no_500_and_no_hang(server, doc):
    resp = post(server, doc)
    assert resp.status_code in (200, 400, 422), resp.text[:300]
    if resp.status_code != 200:
        get_fhir_model_class("OperationOutcome").model_validate(resp.json())


def test_conformance_check_command_passes_against_the_running_server(server):
    proc = run_cli("conformance", "check", server["base"], "--samples", str(DATA / "fhir" / "hl7-r4-examples"),
                   "--token", server["token"])
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout
    assert report["passed"] and report["resources"] == 7 and report["leaks"] == 0 and report["values_checked"] > 20


def test_every_answer_and_refusal_is_in_a_verified_audit_trail(server):
    ok = post(server, {"resourceType": "Patient", "id": "aud-1", "name": [{"family": "Zelbrindex"}]})
    refused = post(server, {"resourceType": "Patient", "id": "aud-2", "name": [{"family": "Zelbrindex"}],
                            "language": "Zelbrindex"})
    assert (ok.status_code, refused.status_code) == (200, 422)
    proc = run_cli("audit", "export", "--format", "json", "--audit", str(server["audit"]),
                   "--audit-key-file", str(server["audit_key"]))
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    records = records["records"] if isinstance(records, dict) else records
    import hashlib
    by_output = {r.get("output_sha256") for r in records}
    assert hashlib.sha256(ok.content).hexdigest() in by_output
    assert any(r.get("operation") == "refuse" and r.get("channel") == "service" for r in records)
    verify = run_cli("audit", "verify", "--audit", str(server["audit"]), "--audit-key-file", str(server["audit_key"]))
    assert verify.returncode == 0, verify.stdout + verify.stderr
