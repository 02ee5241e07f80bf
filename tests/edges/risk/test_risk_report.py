"""`deid-adapter risk` end to end on the CLI's own de-identified exports: figures, exit codes, HTML, no PHI."""
from __future__ import annotations

import base64
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapter.cli.main import app
from text_deid.stack import DEFAULT_STACK
from tests.conftest import DATA, SHARED, needs_shared, run_cli

SYNTHEA = SHARED / "fhir" / "synthea-bundles"  # nine patients: the repository holds one
BULK = DATA / "fhir" / "bulk-ndjson"
GOLD_LINES = 40  # enough notes for a bootstrap interval, few enough for a fast test


@pytest.fixture(scope="module")
def exports(tmp_path_factory, test_key_file):
    """The sample bulk NDJSON (and the shared Synthea bundles where ../shared is beside the checkout) de-identified
    by the CLI, recorded in a fresh audit store."""
    root = tmp_path_factory.mktemp("risk")
    audit = root / "audit.sqlite"
    run_cli("keys", "init", "--purpose", "audit", str(root / "audit.key"), check=True)
    out = {"audit": audit, "audit_key": root / "audit.key", "root": root}
    for name, src in (("synthea", SYNTHEA), ("bulk", BULK)) if SHARED.is_dir() else (("bulk", BULK),):
        run_cli("fhir", str(src), str(root / name), "--today", "2026-01-15", "--validate", "off", "--audit", str(audit),
                "--audit-key-file", str(root / "audit.key"), key_file=test_key_file, check=True)
        out[name] = root / name
    gold = root / "gold.jsonl"
    gold.write_text("".join((DATA / "asq-phi" / "tuning.jsonl").read_text().splitlines(keepends=True)[:GOLD_LINES]))
    out["gold"] = gold
    return out


def _risk_in_process(*args: str):
    """The command in this process (a subprocess per run would import matplotlib each time)."""
    result = CliRunner().invoke(app, ["risk", *args], env={"DEID_ADAPTER_AUDIT": None, "DEID_ADAPTER_AUDIT_KEY_FILE": None})
    result.returncode = result.exit_code
    return result


def _risk(exports, release: Path, report: Path, *extra: str):
    return _risk_in_process(str(release), "--report", str(report), "--audit", str(exports["audit"]),
                            "--audit-key-file", str(exports["audit_key"]), *extra)


@pytest.mark.parametrize("name,patients,files", [pytest.param("synthea", 9, 9, marks=needs_shared), ("bulk", 13, 9)])
def test_report_on_the_sample_exports(exports, tmp_path, name, patients, files):
    report = tmp_path / "risk.html"
    proc = _risk(exports, exports[name], report, "--gold", str(exports["gold"]), "--stack", "patterns")
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(report.with_suffix(".json").read_text())
    assert figures["patients"] == patients and figures["release"]["files"] == files
    assert figures["k_anonymity"] == 1 and figures["below_k_share"] == 1.0  # small samples: every patient unique
    assert figures["risks"]["prosecutor_max"] == 1.0
    assert sum(int(size) * count for size, count in figures["class_size_distribution"].items()) == patients
    assert figures["release"]["key_ids"] == ["k-c271300f3a22"]  # the test key
    assert figures["release"]["profiles"] == ["safe-harbor@2026.11.1"]
    assert figures["release"]["narrative_chars"] > 10_000
    audit = figures["audit"]
    assert audit["status"] == "read" and audit["chain_verified"] is True
    assert audit["release_records_not_in_trail"] == 0 and audit["first_seq"] <= audit["last_seq"]
    assert figures["versions"]["release_stack"] == [DEFAULT_STACK]  # the exports are made with the default stack
    phi = figures["residual_phi"]
    assert phi["gold_documents"] == GOLD_LINES
    lo, hi = phi["residual_phi_chars"]["ci95"]
    assert 0 <= lo <= phi["residual_phi_chars"]["value"] <= hi
    assert figures["suggested_generalizations"]["reached"] is True
    assert figures["suggested_generalizations"]["steps"][-1]["k"] >= 5
    assert [c["check"] for c in figures["thresholds"]] == ["k_anonymity >= 5"]
    assert figures["verdict"] == "fail"  # reported, but exit 0: no --fail-under


def test_fail_under_sets_the_exit_code(exports, tmp_path):
    report = tmp_path / "r.html"
    failing = _risk(exports, exports["bulk"], report, "--fail-under", "prosecutor_max<=0.2")
    assert failing.returncode == 1
    assert "FAIL  prosecutor_max <= 0.2" in failing.stderr
    passing = _risk(exports, exports["bulk"], report, "--k", "1", "--fail-under", "k_anonymity>=1,marketer<=1")
    assert passing.returncode == 0, passing.stderr
    unmeasured = _risk(exports, exports["bulk"], report, "--k", "1", "--fail-under", "residual_phi_chars_upper<=10")
    assert unmeasured.returncode == 1  # no gold sample: a check on it cannot pass


@pytest.mark.parametrize("args", [("--fail-under", "k_anonymity>5"), ("--quasi", "birth_year,shoe_size"),
                                  ("--sensitive", "salary"), ("--k", "0")])
def test_bad_usage_exits_2_and_writes_nothing(exports, tmp_path, args):
    report = tmp_path / "r.html"
    proc = _risk(exports, exports["bulk"], report, *args)
    assert proc.returncode == 2
    assert not report.exists() and not report.with_suffix(".json").exists()


def test_not_a_release_exits_2(tmp_path):
    proc = _risk_in_process(str(tmp_path), "--audit", "off")
    assert proc.returncode == 2 and "no .json, .ndjson or HL7v2 files" in proc.stderr


def test_without_an_audit_store_the_report_says_so(exports, tmp_path):
    proc = _risk_in_process(str(exports["bulk"]), "--audit", "off", "--quasi", "birth_year,gender")
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert figures["audit"]["status"] == "not read (--audit off)"
    assert figures["versions"]["release_stack"] == ["not in the audit trail"]
    assert figures["quasi_identifiers"] == ["birth_year", "gender"]


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.open = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))


def test_html_is_self_contained_with_plots(exports, tmp_path):
    report = tmp_path / "risk.html"
    proc = _risk(exports, exports["bulk"], report, "--gold", str(exports["gold"]), "--stack", "patterns")
    assert proc.returncode == 0, proc.stderr
    text = report.read_text()
    parser = _Collector()
    parser.feed(text)
    assert len(parser.images) == 3  # class sizes, risk by quasi-identifier, recall by category
    for img in parser.images:
        assert img["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(img["src"].split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    assert not re.search(r"""(?:src|href)=["']?(?:https?:|//|file:)""", text)  # nothing fetched from elsewhere
    for heading in ("Thresholds", "k-anonymity", "Re-identification risk", "l-diversity", "Suggested generalizations",
                    "Residual PHI estimate", "Versions", "Audit trail"):
        assert f"<h2>{heading}</h2>" in text
    assert "k-c271300f3a22" in text and "safe-harbor@2026.11.1" in text


PLANTED = {
    "name": "Zorblattquix", "given": "Quentavius", "city": "Plantsvillexj", "id": "plantedpatient7731",
    "code": "PLNT-99817", "display": "Zorblattosis", "note": "Wexmoorian telephone 617-555-0199",
    "file": "Zorblattquix_Quentavius",
}


def _plant(release: Path, into: Path) -> None:
    """A copy of a de-identified export with distinctive values planted where a report could pick them up."""
    shutil.copytree(release, into)
    patients = (into / "Patient.000.ndjson").read_text().splitlines()
    first = json.loads(patients[0])
    old_id, first["id"] = first["id"], PLANTED["id"]
    first["name"] = [{"family": PLANTED["name"], "given": [PLANTED["given"]]}]
    first["address"][0]["city"] = PLANTED["city"]
    first["text"] = {"status": "generated", "div": f"<div xmlns=\"http://www.w3.org/1999/xhtml\">{PLANTED['note']}</div>"}
    (into / "Patient.000.ndjson").write_text("\n".join([json.dumps(first)] + patients[1:]) + "\n")
    condition = {"resourceType": "Condition", "id": "c-plant", "subject": {"reference": f"Patient/{PLANTED['id']}"},
                 "code": {"coding": [{"system": "urn:plant", "code": PLANTED["code"], "display": PLANTED["display"]}],
                          "text": PLANTED["display"]}, "note": [{"text": PLANTED["note"]}]}
    (into / f"{PLANTED['file']}.ndjson").write_text(json.dumps(condition) + "\n")
    assert old_id


def test_no_phi_in_the_report(exports, tmp_path):
    planted = tmp_path / "planted"
    _plant(exports["bulk"], planted)
    report = tmp_path / "out" / "risk.html"
    proc = _risk(exports, planted, report, "--gold", str(exports["gold"]), "--stack", "patterns")
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(report.with_suffix(".json").read_text())
    assert figures["patients"] == 13 and figures["release"]["files"] == 10  # the planted file was read
    assert figures["audit"]["release_records_not_in_trail"] == 2  # the changed Patient line and the new file
    gold_texts = [json.loads(line)["text"] for line in exports["gold"].read_text().splitlines()]
    outputs = {p.name: p.read_text() for p in report.parent.iterdir()}
    outputs["stderr"] = proc.stderr
    for where, text in outputs.items():
        for label, value in PLANTED.items():
            assert value.lower() not in text.lower(), f"{label} planted in the release appears in {where}"
        for note in gold_texts:
            assert note[:40] not in text, f"gold note text appears in {where}"
