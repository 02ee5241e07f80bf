"""Bad input gets exit 2 and no file; refusals get exit 3 and no file; messages never quote PHI."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapter.cli.main import app
from fhir_transforms.errors import RecordRefused
from tests.conftest import CASES, make_engine, run_cli, write_key
from text_deid import stack

PATIENT = {"resourceType": "Patient", "id": "p-zyx", "name": [{"family": "Zyxwortel", "given": ["Quillan"]}],
           "birthDate": "1971-04-05", "telecom": [{"system": "phone", "value": "612-555-0111"}]}


def write(path: Path, doc) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_invalid_json_exits_2_with_path_and_reason_and_writes_nothing(tmp_path, test_key_file):
    src = write(tmp_path / "bad.json", '{"resourceType": "Patient", "name": [')
    proc = run_cli("fhir", str(src), str(tmp_path / "out.json"), key_file=test_key_file)
    assert proc.returncode == 2
    assert "bad.json" in proc.stderr and "invalid JSON" in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_a_resource_failing_validation_exits_2_without_quoting_values(tmp_path, test_key_file):
    doc = dict(PATIENT, birthDate="Quillan-not-a-date")
    src = write(tmp_path / "p.json", doc)
    proc = run_cli("fhir", str(src), str(tmp_path / "out.json"), key_file=test_key_file)
    assert proc.returncode == 2
    assert "birthDate" in proc.stderr and "Quillan" not in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_r4_only_resource_type_is_read_and_an_unknown_one_is_bad_input(tmp_path, test_key_file):
    src = write(tmp_path / "mp.json", {"resourceType": "MedicinalProduct", "id": "x"})
    proc = run_cli("fhir", str(src), str(tmp_path / "o.json"), key_file=test_key_file)
    assert proc.returncode == 0 and (tmp_path / "o.json").exists()  # valid R4, read by shape (issue #20)
    src = write(tmp_path / "nt.json", {"resourceType": "NoSuchType", "id": "x"})
    proc = run_cli("fhir", str(src), str(tmp_path / "n.json"), key_file=test_key_file)
    assert proc.returncode == 2 and "no FHIR version has" in proc.stderr and "NoSuchType" not in proc.stderr  # never echoed


def test_a_folder_reports_each_bad_file_writes_the_others_and_exits_2(tmp_path, test_key_file):
    src = tmp_path / "in"
    src.mkdir()
    write(src / "good.json", PATIENT)
    write(src / "bad.json", "not json")
    write(src / "refused.json", {"resourceType": "Observation", "id": "o", "status": "final", "code": {"text": "x"},
                                 "modifierExtension": [{"url": "http://example.org/x", "valueBoolean": True}]})
    proc = run_cli("fhir", str(src), str(tmp_path / "out"), key_file=test_key_file)
    assert proc.returncode == 2
    assert (tmp_path / "out" / "good.json").exists()
    assert not (tmp_path / "out" / "bad.json").exists() and not (tmp_path / "out" / "refused.json").exists()
    assert "1 refused, 1 bad input" in proc.stderr


def test_unknown_modifier_extension_is_refused_with_exit_3(tmp_path, test_key_file):
    src = CASES / "refused" / "modifier-extension-refused.json"
    proc = run_cli("fhir", str(src), str(tmp_path / "o.json"), key_file=test_key_file)
    assert proc.returncode == 3 and "modifierExtension" in proc.stderr
    assert not (tmp_path / "o.json").exists()


def test_leak_guard_refuses_a_surviving_known_identifier_naming_category_and_path_not_value(tmp_path, test_key_file):
    # Patient.language is kept by the rules (not by design: see leak_guard.kept_by_design): a patient name
    # placed there must stop the record.
    doc = dict(PATIENT, language="Zyxwortel")
    src = write(tmp_path / "p.json", doc)
    proc = run_cli("fhir", str(src), str(tmp_path / "o.json"), key_file=test_key_file)
    assert proc.returncode == 3
    assert "leak guard" in proc.stderr and "NAME at" in proc.stderr and "p.json.language" in proc.stderr
    assert "Zyxwortel" not in proc.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("validate", [True, False])
def test_the_leak_guard_reads_every_value_but_those_the_engine_wrote(test_key, validate):
    # The engine writes "MASKED"/"REDACTED" labels, a "safe-harbor@..." tag, pseudonyms and years: a patient
    # named "Harbor Masked" must not stop the record there, and the same name in a kept element must stop it.
    engine = make_engine(test_key, validate=validate)
    named = dict(PATIENT, id="harbor", name=[{"family": "Masked", "given": ["Harbor"]}],
                 text={"status": "generated", "div": '<div xmlns="http://www.w3.org/1999/xhtml">Harbor Masked</div>'})
    out = engine.deidentify(named).resource
    assert {"MASKED", "REDACTED"} <= {c["code"] for c in out["meta"]["security"]}
    assert any(t["code"].startswith("safe-harbor@") for t in out["meta"]["tag"])
    kept = dict(named, language="Harbor")
    with pytest.raises(RecordRefused, match=r"NAME at Patient\.language"):
        engine.deidentify(kept)


class ExplodingDetector:
    name = "patterns"

    def detect(self, text, known):
        raise ValueError(f"boom while reading {text}")  # a foreign error that quotes its input


def test_a_detector_error_fails_the_record_closed(tmp_path, test_key_file, monkeypatch):
    monkeypatch.setitem(stack.DETECTORS, "patterns", ExplodingDetector)
    src = write(tmp_path / "p.json", dict(PATIENT, text={"status": "generated",
                                                         "div": '<div xmlns="http://www.w3.org/1999/xhtml">Quillan</div>'}))
    result = CliRunner().invoke(app, ["fhir", str(src), str(tmp_path / "o.json"), "--key-file", str(test_key_file)])
    assert result.exit_code == 3
    assert "text detector failed: patterns: ValueError" in result.output
    assert "Quillan" not in result.output
    assert not (tmp_path / "o.json").exists()


def test_a_stack_that_is_not_available_exits_2_and_says_what_is_missing(tmp_path, test_key_file):
    src = write(tmp_path / "p.json", PATIENT)
    proc = run_cli("fhir", str(src), str(tmp_path / "o.json"), "--stack", "recall-first", key_file=test_key_file)
    assert proc.returncode == 2 and "not available here" in proc.stderr and "llm" in proc.stderr


def test_missing_key_and_open_key_files_are_refused(tmp_path):
    src = write(tmp_path / "p.json", PATIENT)
    proc = run_cli("fhir", str(src), str(tmp_path / "o.json"))
    assert proc.returncode == 2 and "no key" in proc.stderr
    key = write_key(tmp_path / "k", bytes(32))
    key.chmod(0o644)
    proc = run_cli("fhir", str(src), str(tmp_path / "o.json"), key_file=key)
    assert proc.returncode == 2 and "readable by group or others" in proc.stderr


def test_keys_init_writes_0600_and_never_prints_the_secret(tmp_path):
    path = tmp_path / "new.key"
    proc = run_cli("keys", "init", str(path))
    assert proc.returncode == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = json.loads(path.read_text())["secret"]
    assert secret not in proc.stdout + proc.stderr
    again = run_cli("keys", "init", str(path))
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr
    assert run_cli("keys", "init", str(path), "--exist-ok").returncode == 0


@pytest.mark.parametrize("mode", ["sample", "off"])
def test_trusted_fast_path_gives_the_same_output(tmp_path, test_key_file, mode):
    src = write(tmp_path / "p.json", PATIENT)
    full = run_cli("fhir", str(src), str(tmp_path / "full.json"), key_file=test_key_file, check=True)
    fast = run_cli("fhir", str(src), str(tmp_path / "fast.json"), "--validate", mode, key_file=test_key_file, check=True)
    assert full.returncode == fast.returncode == 0
    assert (tmp_path / "full.json").read_bytes() == (tmp_path / "fast.json").read_bytes()


# Issue #36: a run never reads its own outputs, and never skips an input without a word.
_PATIENT = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Zyxwortel"}]}
_MSG = "MSH|^~\\&|A|B|C|D|20200101||ADT^A01|1|P|2.5.1\rPID|1||123^^^H^MR||Zyxwortel^Ann\r"


@pytest.mark.parametrize("command, name, content", [("fhir", "p.json", json.dumps(_PATIENT)), ("hl7", "m.hl7", _MSG)])
def test_output_inside_input_is_refused(tmp_path, test_key_file, command, name, content):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_text(content)
    proc = run_cli(command, str(tmp_path / "in"), str(tmp_path / "in" / "out"), "--stack", "patterns",
                   key_file=test_key_file)
    assert proc.returncode == 2 and "inside INPUT" in proc.stderr
    assert not (tmp_path / "in" / "out").exists()


@pytest.mark.parametrize("command, name, content", [("fhir", "p.json", json.dumps(_PATIENT)), ("hl7", "m.hl7", _MSG)])
def test_a_dangling_link_among_the_inputs_is_reported(tmp_path, test_key_file, command, name, content):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_text(content)
    (tmp_path / "in" / f"gone{Path(name).suffix}").symlink_to(tmp_path / "nowhere")
    proc = run_cli(command, str(tmp_path / "in"), str(tmp_path / "out"), "--stack", "patterns", key_file=test_key_file)
    assert proc.returncode == 2 and "lead nowhere" in proc.stderr and "gone" in proc.stderr
    assert not (tmp_path / "out").exists()
