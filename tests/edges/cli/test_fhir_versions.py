"""`--fhir-version` on `fhir` and `bulk`: R5 input end to end, and R5 input read as R4 is a clear exit 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import CASES, independent_leak_check, run_cli

R5_CASES = CASES / "r5" / "safe-harbor"
FIXED = ("--today", "2026-01-15", "--stack", "patterns")


def r5_inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for case in R5_CASES.glob("*.json"):
        if not case.name.endswith(".expected.json"):
            shutil.copy(case, folder / case.name)
    return folder


def test_fhir_r5_end_to_end_gives_the_golden_files_and_no_leak(tmp_path, test_key_file):
    inputs, out = r5_inputs(tmp_path), tmp_path / "out"
    proc = run_cli("fhir", str(inputs), str(out), "--fhir-version", "r5", *FIXED, key_file=test_key_file)
    assert proc.returncode == 0, proc.stderr
    for written in sorted(out.glob("*.json")):
        assert json.loads(written.read_text()) == json.loads((R5_CASES / f"{written.stem}.expected.json").read_text())
    assert len(list(out.glob("*.json"))) == 2
    checked = independent_leak_check("fhir_leak.py", inputs, out)
    assert checked is None or checked[0] == 0 and checked[1]["leaks"] == 0, checked


def test_an_r5_element_in_an_r4_run_is_exit_2_naming_the_option(tmp_path, test_key_file):
    src = R5_CASES / "patient-over-89.json"  # Encounter.actualPeriod, and no version marker
    for given in (("--fhir-version", "r4"), ()):  # r4 given, or auto finding no marker
        target = tmp_path / "out.json"
        proc = run_cli("fhir", str(src), str(target), *given, *FIXED, key_file=test_key_file)
        assert proc.returncode == 2, proc.stderr
        assert "not a valid FHIR R4 Bundle" in proc.stderr and "actualPeriod: extra_forbidden" in proc.stderr
        assert "read it with --fhir-version r5" in proc.stderr
        assert "Traceback" not in proc.stderr and "Oldroyd" not in proc.stderr
        assert not target.exists()


def test_an_unknown_version_is_a_usage_error(tmp_path, test_key_file):
    proc = run_cli("fhir", str(R5_CASES / "patient-over-89.json"), str(tmp_path / "o.json"), "--fhir-version", "r6",
                   key_file=test_key_file)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'r6' is not one of" in proc.stderr and "'r5'" in proc.stderr


def test_bulk_r5_export(tmp_path, test_key_file):
    bundle = json.loads((R5_CASES / "telehealth-visit.json").read_text())
    export = tmp_path / "export"
    export.mkdir()
    by_type: dict[str, list[dict]] = {}
    for entry in bundle["entry"]:
        by_type.setdefault(entry["resource"]["resourceType"], []).append(entry["resource"])
    for rtype, resources in by_type.items():
        (export / f"{rtype}.ndjson").write_text("".join(json.dumps(r) + "\n" for r in resources))
    # the Patient's meta.profile says R5; the other resources say nothing: read as R4 they are not valid
    auto = run_cli("bulk", str(export), str(tmp_path / "auto"), "--workers", "1", *FIXED, key_file=test_key_file)
    assert auto.returncode == 2 and "Traceback" not in auto.stderr, auto.stderr
    proc = run_cli("bulk", str(export), str(tmp_path / "out"), "--workers", "1", "--fhir-version", "r5", *FIXED,
                   key_file=test_key_file)
    assert proc.returncode == 0, proc.stderr
    encounter = json.loads((tmp_path / "out" / "Encounter.ndjson").read_text())
    assert encounter["actualPeriod"] == {"start": "2025", "end": "2025"}
    checked = independent_leak_check("fhir_leak.py", export, tmp_path / "out")
    assert checked is None or checked[0] == 0 and checked[1]["leaks"] == 0, checked
