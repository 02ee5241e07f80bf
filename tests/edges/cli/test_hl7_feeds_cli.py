"""`deid-adapter hl7` on feeds as channels send them: a charset per channel, and findings in the audit record."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

# Latin-1 without MSH-18; the coded text beside its code is kept, so the output holds non-ASCII text
LATIN1 = ("MSH|^~\\&|LAB|NORTH|EHR|SOUTH|20240101120000||ORU^R01|L1|P|2.5.1||||||{msh18}\r"
          "PID|1||12345^^^H^MR||Müller^Jürgen||19600101|M\r"
          "OBX|1|NM|8302-2^Körpergröße^LN||180|cm\r"
          "NTE|1||Jürgen Müller called back\r")


def latin1(tmp_path: Path, msh18: str = "") -> Path:
    path = tmp_path / "in" / "latin1.hl7"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(LATIN1.format(msh18=msh18).encode("latin-1"))
    return path


def msh18(data: bytes) -> str:
    return data.split(b"\r", 1)[0].decode("ascii", "replace").split("|")[17]


def test_latin1_without_msh18_is_bad_input_without_a_charset(tmp_path, test_key_file):
    out = tmp_path / "out.hl7"
    proc = run_cli("hl7", str(latin1(tmp_path)), str(out), "--audit", "off", key_file=test_key_file)
    assert proc.returncode == 2 and "MSH-18 declares no other character set" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("name", ["8859/1", "ISO-8859-1", "latin-1"])
def test_charset_reads_latin1_without_msh18_and_msh18_names_what_was_written(tmp_path, test_key_file, name):
    out = tmp_path / "out.hl7"
    proc = run_cli("hl7", str(latin1(tmp_path)), str(out), "--charset", name, "--audit", "off", key_file=test_key_file)
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert msh18(data) == "UNICODE UTF-8"
    text = data.decode("utf-8")
    assert "Körpergröße" in text and "Müller" not in text and "Jürgen" not in text


def test_msh18_wins_over_the_channel_charset_and_an_unknown_one_stays_bad_input(tmp_path, test_key_file):
    out = tmp_path / "out.hl7"
    proc = run_cli("hl7", str(latin1(tmp_path, "8859")), str(out), "--audit", "off", key_file=test_key_file)
    assert proc.returncode == 0, proc.stderr  # `8859` as some senders spell 8859/1
    assert msh18(out.read_bytes()) == "8859"
    proc = run_cli("hl7", str(latin1(tmp_path, "EBCDIC")), str(tmp_path / "bad.hl7"), "--charset", "8859/1",
                   "--audit", "off", key_file=test_key_file)
    assert proc.returncode == 2 and "not a character set of HL7 table 0211" in proc.stderr


def test_an_unknown_charset_name_is_refused_before_anything_is_read(tmp_path, test_key_file):
    proc = run_cli("hl7", str(latin1(tmp_path)), str(tmp_path / "out.hl7"), "--charset", "klingon",
                   "--audit", "off", key_file=test_key_file)
    assert proc.returncode == 2 and "--charset: unknown character set" in proc.stderr


def test_a_site_rules_file_names_the_channel_charset(tmp_path, test_key_file):
    rules = tmp_path / "site.yaml"
    rules.write_text("extends: safe-harbor\nhl7v2:\n  charset: 8859/1\n")
    out = tmp_path / "out.hl7"
    proc = run_cli("hl7", str(latin1(tmp_path)), str(out), "--rules", str(rules), "--audit", "off",
                   key_file=test_key_file)
    assert proc.returncode == 0, proc.stderr
    rules.write_text("extends: safe-harbor\nhl7v2:\n  charset: klingon\n")
    proc = run_cli("hl7", str(latin1(tmp_path)), str(out), "--rules", str(rules), "--audit", "off",
                   key_file=test_key_file)
    assert proc.returncode == 2 and "unknown character set" in proc.stderr


def test_the_audit_record_of_an_hl7_file_lists_its_findings_without_values(tmp_path, test_key_file):
    audit, audit_key = tmp_path / "audit.sqlite", tmp_path / "audit.key"
    assert run_cli("keys", "init", "--purpose", "audit", str(audit_key)).returncode == 0
    proc = run_cli("hl7", str(latin1(tmp_path, "8859/1")), str(tmp_path / "out.hl7"), "--audit", str(audit),
                   "--audit-key-file", str(audit_key), key_file=test_key_file)
    assert proc.returncode == 0, proc.stderr
    export = run_cli("audit", "export", "--format", "json", "--audit", str(audit), "--audit-key-file", str(audit_key))
    assert export.returncode == 0, export.stderr
    records = json.loads(export.stdout)
    records = records["records"] if isinstance(records, dict) else records
    (record,) = [r for r in records if r["data_format"] == "hl7v2"]
    found = {(f["path"], f["category"]) for f in record["findings"]}
    assert ("message 1/NTE[4]-3", "NAME") in found
    assert "Müller" not in export.stdout and "Jürgen" not in export.stdout


def test_rules_explain_names_the_query_profiles_of_a_qpd_parameter():
    proc = run_cli("rules", "explain", "safe-harbor", "QPD-5")
    assert proc.returncode == 0, proc.stderr
    assert "Z34: XPN" in proc.stdout and "any other query: every value removed" in proc.stdout
