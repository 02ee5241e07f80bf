"""A bulk export is one release (issue #36 item 2): the known identifiers of all its patients mask every note,
in `bulk` and in `fhir` on a folder (or file) of bulk NDJSON; a name of another patient is still a name."""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from adapter.cli.main import app
from tests.support import SAMPLE, TODAY, run_bulk


def ndjson(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def note_text(doc_ref: dict) -> str:
    return "".join(base64.b64decode(c["attachment"]["data"]).decode() for c in doc_ref["content"])


def names_of(patient: dict) -> set[str]:
    return {part for n in patient["name"] for part in n.get("given", []) + [n["family"]]}


def export_naming_another_patient(tmp_path: Path) -> tuple[Path, set[str]]:
    """The sample with a note of one patient that names another patient of the export (and no one else of the
    note's own record); the other patient's name parts."""
    root = tmp_path / "in"
    shutil.copytree(SAMPLE, root)
    patients = {p["id"]: p for p in ndjson(SAMPLE / "Patient.000.ndjson")}
    notes = ndjson(SAMPLE / "DocumentReference.000.ndjson")
    subject = notes[0]["subject"]["reference"].split("/")[1]
    other = next(p for pid, p in patients.items() if pid != subject)
    names = names_of(other)
    text = note_text(notes[0]) + f"\nSeen with her neighbour {' '.join(sorted(names))} today.\n"
    notes[0]["content"][0]["attachment"]["data"] = base64.b64encode(text.encode()).decode()
    (root / "DocumentReference.000.ndjson").write_text("".join(json.dumps(n) + "\n" for n in notes))
    return root, names


def test_another_patients_name_in_a_note_of_a_bulk_export_is_masked(tmp_path):
    root, names = export_naming_another_patient(tmp_path)
    out = run_bulk(tmp_path / "out", root, workers=1)
    note = note_text(ndjson(out / "DocumentReference.000.ndjson")[0])
    assert "neighbour" in note  # the sentence is there
    assert not [name for name in names if name in note]


def _fhir(src: Path, out: Path, key_file: Path):
    return CliRunner().invoke(app, ["fhir", str(src), str(out), "--key-file", str(key_file), "--audit", "off",
                                    "--stack", "patterns", "--validate", "off", "--today", TODAY])


def test_fhir_on_a_bulk_folder_masks_a_patients_name_in_a_note_in_another_file(tmp_path, test_key_file):
    """Each note names its own patient, who is only in Patient.000.ndjson: before, each file (each line) was its
    own record, and the names stayed (exit 0)."""
    result = _fhir(SAMPLE, tmp_path / "out", test_key_file)
    assert result.exit_code == 0, result.output
    patients = {p["id"]: p for p in ndjson(SAMPLE / "Patient.000.ndjson")}
    notes_in = ndjson(SAMPLE / "DocumentReference.000.ndjson")
    notes_out = ndjson(tmp_path / "out" / "DocumentReference.000.ndjson")
    assert len(notes_out) == len(notes_in)
    for before, after in zip(notes_in, notes_out):
        names = names_of(patients[before["subject"]["reference"].split("/")[1]])
        assert any(name in note_text(before) for name in names)
        assert not [name for name in names if name in note_text(after)]


def test_fhir_on_bulk_files_masks_another_patients_name(tmp_path, test_key_file):
    root, names = export_naming_another_patient(tmp_path)
    result = _fhir(root, tmp_path / "out", test_key_file)
    assert result.exit_code == 0, result.output
    note = note_text(ndjson(tmp_path / "out" / "DocumentReference.000.ndjson")[0])
    assert "neighbour" in note and not [name for name in names if name in note]


def test_fhir_on_one_ndjson_file_is_one_release(tmp_path, test_key_file):
    """A Patient and a note naming them on other lines of one NDJSON file: before, each line its own record."""
    patient = ndjson(SAMPLE / "Patient.000.ndjson")[0]
    note = next(n for n in ndjson(SAMPLE / "DocumentReference.000.ndjson")
                if n["subject"]["reference"] == f"Patient/{patient['id']}")
    src = tmp_path / "export.ndjson"
    src.write_text(json.dumps(note) + "\n" + json.dumps(patient) + "\n")
    names = names_of(patient)
    assert any(name in note_text(note) for name in names)
    result = _fhir(src, tmp_path / "out.ndjson", test_key_file)
    assert result.exit_code == 0, result.output
    assert not [name for name in names if name in note_text(ndjson(tmp_path / "out.ndjson")[0])]
