"""Outputs say what the rules are: rules that keep more than Safe Harbor allows (full shifted dates, kept names)
never label their outputs `safe-harbor@…`; `rules check` says why. Output file names never name the patient."""
from __future__ import annotations

import json
from pathlib import Path

from adapter.engines import profiles
from tests.conftest import ROOT, run_cli

PROFILE_TAG = "http://deid-adapter.org/fhir/CodeSystem/deid-profile"
STATUS_TAG = "http://deid-adapter.org/fhir/CodeSystem/deid-status"
SITE_RULES = ROOT / "examples" / "site-rules.yaml"

PATIENT = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Quorlandt", "given": ["Vexabeth"]}],
           "birthDate": "1961-04-12", "gender": "female"}
ENCOUNTER = {"resourceType": "Encounter", "id": "e1", "status": "finished",
             "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
             "subject": {"reference": "Patient/p1"}, "period": {"start": "2020-03-04T10:00:00Z"}}
BUNDLE = {"resourceType": "Bundle", "type": "collection",
          "entry": [{"fullUrl": "urn:uuid:1", "resource": PATIENT}, {"fullUrl": "urn:uuid:2", "resource": ENCOUNTER}]}


def _site_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text("extends: safe-harbor\n" + body)
    return path


def _gaps(path: Path) -> list[str]:
    chosen = profiles(None, path)
    return [g.where for g in (*chosen.fhir.safe_harbor_gaps, *chosen.hl7.safe_harbor_gaps)]


def test_packaged_safe_harbor_has_no_gaps_and_longitudinal_has_its_shifts():
    assert not profiles("safe-harbor").fhir.safe_harbor_gaps and not profiles("safe-harbor").hl7.safe_harbor_gaps
    long = profiles("longitudinal")
    assert {"fhir.rules.date", "fhir.rules.dateTime"} <= {g.where for g in long.fhir.safe_harbor_gaps}
    assert [g.where for g in long.hl7.safe_harbor_gaps] == ["hl7v2.datatypes.DTM"]


def test_each_weakening_is_a_gap_and_staff_values_or_stronger_rules_are_not(tmp_path):
    assert _gaps(_site_file(tmp_path, "fhir:\n  rules:\n    date: {method: shift, offset_days: 3}\n")) == ["fhir.rules.date"]
    assert _gaps(_site_file(tmp_path, "fhir:\n  rules:\n    Patient.name: keep\n")) == ["fhir.rules.Patient.name"]
    assert _gaps(_site_file(tmp_path, "fhir:\n  rules:\n    ContactPoint: null\n")) == ["fhir.rules.ContactPoint"]
    assert _gaps(_site_file(tmp_path, "hl7v2:\n  fields:\n    PID.5: keep\n")) == ["hl7v2.fields.PID.5"]
    # staff work phones are not the individual's; removing more and a year are at least as strong as Safe Harbor
    assert _gaps(_site_file(tmp_path, "fhir:\n  rules:\n    Practitioner.telecom: {method: keep, where: \"use = 'work'\"}\n"
                                      "    Organization.name: remove\n    date: year\n")) == []


def test_rules_check_says_the_example_is_not_safe_harbor_and_where():
    proc = run_cli("rules", "check", str(SITE_RULES), check=True)
    assert "Safe Harbor: no" in proc.stdout
    lines = SITE_RULES.read_text().splitlines()
    date_line = next(i for i, line in enumerate(lines, 1) if line.strip().startswith("date:"))
    assert f"site-rules.yaml:{date_line}: fhir.rules.date: shift" in proc.stdout


def test_fhir_output_of_rules_with_gaps_is_not_labelled_safe_harbor(tmp_path, test_key_file):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bundle.json").write_text(json.dumps(BUNDLE))
    run_cli("fhir", str(tmp_path / "in"), str(tmp_path / "out"), "--rules", str(SITE_RULES), "--stack", "patterns",
            key_file=test_key_file, check=True)
    out = json.loads((tmp_path / "out" / "bundle.json").read_text())
    for entry in out["entry"]:
        tags = {(t["system"], t["code"]) for t in entry["resource"]["meta"]["tag"]}
        profile_codes = {code for system, code in tags if system == PROFILE_TAG}
        assert profile_codes and not any(code.startswith("safe-harbor") for code in profile_codes)
        assert (STATUS_TAG, "not-safe-harbor") in tags
    run_cli("fhir", str(tmp_path / "in"), str(tmp_path / "sh"), "--stack", "patterns", key_file=test_key_file, check=True)
    plain = json.loads((tmp_path / "sh" / "bundle.json").read_text())["entry"][0]["resource"]["meta"]["tag"]
    assert {"system": PROFILE_TAG, "code": "safe-harbor@" + profiles("safe-harbor").fhir.version} in plain
    assert not any(t["system"] == STATUS_TAG for t in plain)


def test_hl7_output_of_rules_with_gaps_says_so_in_msh8(tmp_path, test_key_file):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.hl7").write_text(
        "MSH|^~\\&|APP|FAC|RCV|RFAC|20200304101500||ADT^A01|MSG1|P|2.5.1\r"
        "PID|1||12345^^^HOSP^MR||Quorlandt^Vexabeth||19610412|F\r")
    run_cli("hl7", str(tmp_path / "in"), str(tmp_path / "out"), "--rules", str(SITE_RULES), "--stack", "patterns",
            key_file=test_key_file, check=True)
    msh8 = (tmp_path / "out" / "a.hl7").read_text().split("\r")[0].split("|")[7]
    assert msh8.endswith("/not-safe-harbor") and "safe-harbor+" not in msh8


def test_output_file_names_never_name_the_patient(tmp_path, test_key_file):
    (tmp_path / "in").mkdir()
    named = "Vexabeth123_Quorlandt45_0f1e2d3c.json"
    (tmp_path / "in" / named).write_text(json.dumps(BUNDLE))
    (tmp_path / "in" / "neutral.json").write_text(json.dumps(BUNDLE))
    run_cli("fhir", str(tmp_path / "in"), str(tmp_path / "out"), "--stack", "patterns", key_file=test_key_file, check=True)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "neutral.json" in names and named not in names and len(names) == 2
    assert not any("quorlandt" in n.casefold() or "vexabeth" in n.casefold() for n in names)
    run_cli("fhir", str(tmp_path / "in"), str(tmp_path / "again"), "--stack", "patterns", key_file=test_key_file, check=True)
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == names  # keyed: the same name every run
    run_cli("fhir", str(tmp_path / "in"), str(tmp_path / "kept"), "--stack", "patterns", "--keep-file-names",
            key_file=test_key_file, check=True)
    assert (tmp_path / "kept" / named).exists()
