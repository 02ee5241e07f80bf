"""`--rules FILE` on every de-identifying command and the service's start-up; `rules check` and `rules explain`."""
from __future__ import annotations

import json
import shutil
from datetime import date, timedelta

import pytest
from typer.testing import CliRunner

from adapter.audit.trail import AuditTrail, database_url
from adapter.cli.main import app
from adapter.http.auth import add_client
from fhir_transforms import keys
from fhir_transforms.r4.walker import SITE_RULES_TAG_SYSTEM
from fhir_transforms.site_rules import read_site_rules
from tests.conftest import DATA, ROOT

EXAMPLE = ROOT / "examples" / "site-rules.yaml"
BAD = "extends: safe-harbor\nfhir:\n  rules:\n    Organization.name: remove\n    Patient.shoeSize: remove\n"
PATIENT = {"resourceType": "Patient", "id": "p-1", "name": [{"family": "Zyxwortel"}], "birthDate": "1971-04-05"}


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def bad_rules(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    return path


def test_rules_check_summarizes_a_good_file():
    result = cli("rules", "check", str(EXAMPLE))
    assert result.exit_code == 0, result.output
    assert "ok; extends safe-harbor" in result.output and read_site_rules(EXAMPLE).sha256 in result.output


def test_rules_check_names_the_line_of_a_bad_file(bad_rules):
    result = cli("rules", "check", str(bad_rules))
    assert result.exit_code == 2
    assert f"{bad_rules}:5: fhir.rules.Patient.shoeSize: Patient has no element 'shoeSize'" in result.output
    assert "Traceback" not in result.output


def test_rules_explain_names_the_rule_its_file_and_its_condition():
    fhir = cli("rules", "explain", str(EXAMPLE), "Practitioner.telecom")
    assert fhir.exit_code == 0, fhir.output
    assert "1. Practitioner.telecom: keep where use = 'work'  [site rules" in fhir.output
    assert "2. ContactPoint: remove  [packaged mappings/fhir/safe-harbor.yaml]" in fhir.output
    assert "where it is false or empty, the next candidate" in fhir.output
    hl7 = cli("rules", "explain", str(EXAMPLE), "STF-10")
    assert "fields STF.10: keep where component 2 in ['WPN']" in hl7.output and "datatype XTN" in hl7.output
    packaged = cli("rules", "explain", "longitudinal", "Patient.birthDate")
    assert "1. Patient.birthDate: age90  [packaged mappings/fhir/safe-harbor.yaml]" in packaged.output


@pytest.mark.parametrize("command", ["fhir", "hl7", "bulk"])
def test_a_bad_rules_file_stops_a_run_with_its_line_and_writes_nothing(command, bad_rules, tmp_path, test_key_file):
    src = tmp_path / "in"
    src.mkdir()
    (src / "Patient.ndjson").write_text(json.dumps(PATIENT) + "\n")  # input to read: the rules stop the run first
    (src / "a.hl7").write_text("MSH|^~\\&|A|B|C|D|20260101||ADT^A01|1|P|2.5\rPID|1||123||Zyxwortel^Ann\r")
    result = cli(command, str(src), str(tmp_path / "out"), "--rules", str(bad_rules), "--key-file", str(test_key_file))
    assert result.exit_code == 2 and f"{bad_rules}:5: " in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_serve_and_mllp_refuse_to_start_with_a_bad_rules_file(bad_rules, tmp_path, test_key_file):
    add_client(tmp_path / "tokens.json", "tests", ["fhir"])
    served = cli("serve", "--tokens", str(tmp_path / "tokens.json"), "--key-file", str(test_key_file), "--port", "1",
                 "--rules", str(bad_rules), "--audit", "off")
    listened = cli("mllp", "--listen", "127.0.0.1:1", "--forward", str(tmp_path), "--store", str(tmp_path / "q.sqlite"),
                   "--key-file", str(test_key_file), "--rules", str(bad_rules), "--audit", "off")
    for result in (served, listened):
        assert result.exit_code == 2 and f"{bad_rules}:5: " in result.output and "Traceback" not in result.output


def test_fhir_with_rules_tags_the_output_and_the_audit_record(tmp_path, test_key_file):
    src, out = tmp_path / "p.json", tmp_path / "out.json"
    src.write_text(json.dumps(PATIENT))
    audit_key = tmp_path / "audit.key"
    assert cli("keys", "init", "--purpose", "audit", str(audit_key)).exit_code == 0
    result = cli("fhir", str(src), str(out), "--rules", str(EXAMPLE), "--key-file", str(test_key_file), "--stack",
                 "patterns", "--today", "2026-01-15", "--audit", str(tmp_path / "audit.sqlite"),
                 "--audit-key-file", str(audit_key))
    assert result.exit_code == 0, result.output
    sha = read_site_rules(EXAMPLE).sha256
    assert {"system": SITE_RULES_TAG_SYSTEM, "code": sha} in json.loads(out.read_text())["meta"]["tag"]
    trail = AuditTrail(database_url(tmp_path / "audit.sqlite"), [k for _, k, _ in keys.key_ring(audit_key, "audit")])
    (record,) = list(trail.export())
    assert sha in json.dumps(record["versions"]) and record["rules_version"].endswith(f"+site.{sha[:16]}")


def test_bulk_workers_read_the_rules_and_the_summary_names_them(tmp_path, test_key_file):
    src = tmp_path / "export"
    src.mkdir()
    (src / "Patient.000.ndjson").write_text(json.dumps(PATIENT) + "\n")
    result = cli("bulk", str(src), str(tmp_path / "out"), "--rules", str(EXAMPLE), "--workers", "1", "--key-file",
                 str(test_key_file), "--stack", "patterns", "--today", "2026-01-15", "--audit", "off")
    assert result.exit_code == 0, result.output
    sha = read_site_rules(EXAMPLE).sha256
    assert json.loads((tmp_path / "out" / "deid-summary.json").read_text())["siteRules"] == sha
    written = json.loads((tmp_path / "out" / "Patient.000.ndjson").read_text())
    assert {"system": SITE_RULES_TAG_SYSTEM, "code": sha} in written["meta"]["tag"]


UCUM = "http://unitsofmeasure.org"
SITE_BUNDLE = {"resourceType": "Bundle", "type": "collection", "entry": [
    {"resource": {"resourceType": "Patient", "id": "p-9", "name": [{"family": "Zyxwortel", "given": ["Quillan"]}],
                  "birthDate": "1971-04-05", "telecom": [{"system": "phone", "value": "555-310-4471", "use": "home"}]}},
    {"resource": {"resourceType": "Practitioner", "id": "pr-9", "name": [{"family": "Osler"}],
                  "telecom": [{"system": "phone", "value": "555-201-7788", "use": "work"},
                              {"system": "phone", "value": "555-201-9911", "use": "home"}]}},
    {"resource": {"resourceType": "Organization", "id": "o-9", "name": "Saint Quillan Infirmary"}},
    {"resource": {"resourceType": "Condition", "id": "c-9", "subject": {"reference": "Patient/p-9"},
                  "recordedDate": "2020-06-01", "onsetAge": {"value": 47, "unit": "a", "system": UCUM, "code": "a"}}},
    {"resource": {"resourceType": "Condition", "id": "c-10", "subject": {"reference": "Patient/p-9"},
                  "onsetAge": {"value": 93, "unit": "a", "system": UCUM, "code": "a"}}},
    {"resource": {"resourceType": "ExplanationOfBenefit", "id": "e-9", "status": "active", "use": "claim",
                  "type": {"coding": [{"code": "institutional"}]}, "patient": {"reference": "Patient/p-9"},
                  "created": "2020-06-02", "insurer": {"display": "Saint Quillan Infirmary"},
                  "provider": {"reference": "Practitioner/pr-9"}, "outcome": "complete",
                  "insurance": [{"focal": True, "coverage": {"display": "Cigna Health"}}]}}]}


def test_the_example_rules_file_end_to_end(tmp_path, test_key_file):
    # issue #22: work phones of Practitioners kept, Organization names removed, dates by a fixed offset, ages
    # under 90 perturbed; on a made bundle and a Synthea bundle: exit 0, no name or full date of the patient left
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    (src / "site.json").write_text(json.dumps(SITE_BUNDLE))
    synthea = sorted((DATA / "fhir" / "synthea-bundles").glob("Clemente_*.json"))
    for path in synthea:
        shutil.copy(path, src / path.name)
    result = cli("fhir", str(src), str(out), "--rules", str(EXAMPLE), "--key-file", str(test_key_file), "--stack",
                 "patterns", "--today", "2026-01-15", "--keep-file-names")
    assert result.exit_code == 0, result.output
    made = {e["resource"]["resourceType"] + e["resource"].get("onsetAge", {}).get("comparator", ""): e["resource"]
            for e in json.loads((out / "site.json").read_text())["entry"]}
    text = (out / "site.json").read_text()
    assert "Zyxwortel" not in text and "Quillan" not in text and "1971-04-05" not in text and "555-310-4471" not in text
    assert made["Practitioner"]["telecom"] == [{"system": "phone", "value": "555-201-7788", "use": "work"}]
    assert "name" not in made["Organization"] and "Infirmary" not in text
    assert made["ExplanationOfBenefit"]["insurer"] == {"extension": [  # required: kept, marked absent
        {"url": "http://hl7.org/fhir/StructureDefinition/data-absent-reason", "valueCode": "masked"}]}
    offset = timedelta(days=-137)
    assert made["Condition"]["recordedDate"] == (date(2020, 6, 1) + offset).isoformat()
    assert made["ExplanationOfBenefit"]["created"] == (date(2020, 6, 2) + offset).isoformat()
    assert made["Patient"]["birthDate"] == (date(1971, 4, 5) + offset).isoformat()
    age = made["Condition"]["onsetAge"]["value"]
    assert 45 <= age <= 49 and age == int(age)  # perturbed, whole years
    assert made["Condition>="]["onsetAge"]["value"] == 90  # 90 or more: the one category, as packaged
    for path in synthea:  # the Synthea bundle: its people's names, full dates and organization names are gone
        source = json.loads(path.read_text())
        written = (out / path.name).read_text()
        for entry in source["entry"]:
            r = entry["resource"]
            if r["resourceType"] in ("Patient", "Practitioner"):
                assert all(part not in written for n in r.get("name", []) for part in [n.get("family", "")] if part)
            if r["resourceType"] == "Patient":
                assert r["birthDate"] not in written
            if r["resourceType"] == "Organization":
                assert r["name"] not in written
