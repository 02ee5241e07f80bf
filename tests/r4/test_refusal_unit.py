"""The unit refused: an NDJSON line (its neighbours are written), a Bundle or resource file (all or nothing)."""
from __future__ import annotations

import json

from adapter.cli.common import EXIT_REFUSED
from tests.conftest import run_cli

UNKNOWN_MODIFIER = [{"url": "http://example.org/fhir/StructureDefinition/not-allowed", "valueBoolean": True}]


def _patient(pid: str, **extra) -> dict:
    return {"resourceType": "Patient", "id": pid, "gender": "female", **extra}


def test_a_refused_ndjson_line_does_not_drop_its_neighbours(tmp_path, test_key_file):
    src = tmp_path / "Patient.ndjson"
    lines = [_patient("a"), _patient("b", modifierExtension=UNKNOWN_MODIFIER), _patient("c")]
    src.write_text(json.dumps(lines[0]) + "\n\n" + "\n".join(json.dumps(r) for r in lines[1:]) + "\n")
    out = tmp_path / "out.ndjson"
    proc = run_cli("fhir", str(src), str(out), "--today", "2026-01-15", key_file=test_key_file)
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 2 and all(r["resourceType"] == "Patient" for r in written)
    assert f"refused  {src}: line 3." in proc.stderr  # its line in the file (line 2 is blank)
    assert "1 NDJSON line(s) refused" in proc.stderr


def test_an_ndjson_file_whose_every_line_is_refused_writes_nothing(tmp_path, test_key_file):
    src = tmp_path / "Patient.ndjson"
    src.write_text(json.dumps(_patient("b", modifierExtension=UNKNOWN_MODIFIER)) + "\n")
    proc = run_cli("fhir", str(src), str(tmp_path / "out.ndjson"), key_file=test_key_file)
    assert proc.returncode == EXIT_REFUSED
    assert not (tmp_path / "out.ndjson").exists()


def test_a_bundle_stays_all_or_nothing(tmp_path, test_key_file):
    src = tmp_path / "bundle.json"
    src.write_text(json.dumps({"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": _patient("a")}, {"resource": _patient("b", modifierExtension=UNKNOWN_MODIFIER)}]}))
    proc = run_cli("fhir", str(src), str(tmp_path / "out.json"), key_file=test_key_file)
    assert proc.returncode == EXIT_REFUSED
    assert not (tmp_path / "out.json").exists()
