"""The HTTP service with `--charset`: Latin-1 HL7v2 without MSH-18 is read in the channel's charset, and the audit
record of each HL7v2 answer lists its findings."""
from __future__ import annotations

import hashlib
import json

import pytest

from tests.conftest import run_cli
from tests.support import post, serve

HL7 = {"Content-Type": "x-application/hl7-v2+er7"}
LATIN1_ADT = ("MSH|^~\\&|LAB|NORTH|EHR|SOUTH|20240101120000||ADT^A01|H1|P|2.5.1\r"
              "PID|1||12345^^^H^MR||Müller^Jürgen||19600101|M\r"
              "NTE|1||Jürgen Müller called back\r").encode("latin-1")


@pytest.fixture(scope="module")
def server(tmp_path_factory, test_key_file):
    with serve(tmp_path_factory.mktemp("service"), test_key_file, "--charset", "8859/1") as running:
        yield running


def test_latin1_without_msh18_is_read_in_the_channel_charset_and_its_findings_audited(server):
    resp = post(server, LATIN1_ADT, headers=HL7, path="/hl7v2/$de-identify")
    assert resp.status_code == 200, resp.text[:300]
    assert "ller" not in resp.text and "\ufffd" not in resp.text
    proc = run_cli("audit", "export", "--format", "json", "--audit", str(server["audit"]),
                   "--audit-key-file", str(server["audit_key"]))
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    records = records["records"] if isinstance(records, dict) else records
    (record,) = [r for r in records if r.get("output_sha256") == hashlib.sha256(resp.content).hexdigest()]
    assert record["data_format"] == "hl7v2" and record["channel"] == "service"
    assert ("message 1/NTE[3]-3", "NAME") in {(f["path"], f["category"]) for f in record["findings"]}
    assert "Müller" not in proc.stdout
