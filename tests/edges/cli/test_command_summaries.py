"""Each command ends with one summary line that says what it did, in counts: `fhir` counts a Bundle by its
entries (whole or streamed), `text redact` and `text detect` say how many notes and spans, `risk` says each
result once."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from adapter.cli import fhir as fhir_command
from adapter.cli.main import app
from tests.conftest import ROOT, run_cli

EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_fhir_counts_a_bundle_by_its_entries(tmp_path, test_key_file, monkeypatch, streamed):
    if streamed:
        monkeypatch.setattr(fhir_command, "STREAM_FROM_BYTES", 0)
    entries = len(json.loads((EXAMPLES / "fhir" / "patient-bundle.json").read_text())["entry"])
    result = CliRunner().invoke(app, ["fhir", str(EXAMPLES / "fhir"), str(tmp_path / "out"), "--key-file",
                                      str(test_key_file), "--audit", "off", "--stack", "patterns", "--validate", "off"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert f"ok  patient-bundle.json ({entries} resource(s) in 1 Bundle(s))" in lines
    assert lines[-1].startswith(f"1 file(s) written to {tmp_path / 'out'} ({entries} resource(s) in 1 Bundle(s)), 0 refused")


def test_fhir_counts_resources_alone_and_in_bundles(tmp_path, test_key_file):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "bundle.json").write_text((EXAMPLES / "fhir" / "patient-bundle.json").read_text())
    (folder / "patients.ndjson").write_text((EXAMPLES / "bulk" / "Patient.000.ndjson").read_text())
    proc = run_cli("fhir", str(folder), str(tmp_path / "out"), "--audit", "off", "--stack", "patterns",
                   key_file=test_key_file)
    assert proc.returncode == 0, proc.stderr
    assert "(3 resource(s), 70 resource(s) in 1 Bundle(s)), 0 refused" in proc.stderr.splitlines()[-1]


def test_text_redact_and_detect_end_with_their_counts(tmp_path):
    out = tmp_path / "redacted.jsonl"
    redact = run_cli("text", "redact", "--in", str(EXAMPLES / "notes.jsonl"), "--out", str(out), "--stack", "patterns")
    assert redact.returncode == 0, redact.stderr
    tagged = sum(line.count("[") for line in out.read_text().splitlines())
    assert redact.stderr.strip().splitlines()[-1] == f"6 note(s) redacted to {out} (stack patterns): {tagged} span(s) tagged"
    detect = run_cli("text", "detect", "--in", str(EXAMPLES / "notes.jsonl"), "--stack", "patterns")
    rows = [json.loads(line) for line in detect.stdout.splitlines()]  # stdout holds the JSONL only
    assert len(rows) == 6 and sum(len(r["spans"]) for r in rows) == tagged
    assert detect.stderr.strip().splitlines()[-1] == \
        f"6 note(s) read, their spans written to stdout (stack patterns): {tagged} span(s) found"
    assert "Brennan" not in redact.stderr + detect.stderr


def test_risk_says_each_result_once_and_ends_with_a_summary(tmp_path, test_key_file):
    run_cli("bulk", str(EXAMPLES / "bulk"), str(tmp_path / "release"), "--workers", "1", "--stack", "patterns",
            "--audit", "off", key_file=test_key_file, check=True)
    proc = run_cli("risk", str(tmp_path / "release"), "--report", str(tmp_path / "risk.html"), "--k", "5",
                   "--fail-under", "k_anonymity>=5,prosecutor_max<=0.2", "--audit", "off")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith(("pass", "FAIL"))] == [
        "FAIL  k_anonymity >= 5  (value 1)", "FAIL  prosecutor_max <= 0.2  (value 1.0)"]
    assert lines[-1] == "3 patient(s), k-anonymity 1, prosecutor risk at most 1; 2 of 2 --fail-under check(s) failed"
