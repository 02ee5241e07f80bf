"""`fhir` reads an NDJSON file a line at a time (issue #36 item 3): memory is that of a line, not of the file;
the output is written as it goes to a temporary file renamed into place, so a file found bad at its last line
publishes nothing, and a refused line is still audited and left out of the output."""
from __future__ import annotations

import json
import gc
from pathlib import Path

from typer.testing import CliRunner

from adapter.cli.main import app
from fhir_transforms.r4.record import Deidentifier
from tests.conftest import FIXED_TODAY


def observation(n: int) -> dict:
    return {"resourceType": "Observation", "id": f"obs-{n:08d}", "status": "final",
            "code": {"coding": [{"system": "http://loinc.org", "code": "2345-7", "display": "Glucose"}]},
            "subject": {"reference": f"Patient/pat-{n % 7:04d}"}, "effectiveDateTime": "2021-03-04T08:30:00Z",
            "valueQuantity": {"value": 80 + n % 60, "unit": "mg/dL", "system": "http://unitsofmeasure.org",
                              "code": "mg/dL"}}


def _run(src: Path, out: Path, key_file: Path):
    return CliRunner().invoke(app, ["fhir", str(src), str(out), "--key-file", str(key_file), "--audit", "off",
                                    "--stack", "patterns", "--validate", "off", "--today", FIXED_TODAY.isoformat()])


def _observations() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is dict and o.get("resourceType") == "Observation")


def test_an_ndjson_file_is_never_held_whole(tmp_path, test_key_file, monkeypatch):
    """While its last line is de-identified, the records of the lines before it are gone (their outputs too)."""
    lines = 300
    src = tmp_path / "obs.ndjson"
    src.write_text("".join(json.dumps(observation(n)) + "\n" for n in range(lines)))
    alive: list[int] = []
    deidentify = Deidentifier.deidentify

    def counting(self, resource, *args, **kwargs):
        if resource.get("id") == f"obs-{lines - 1:08d}":
            alive.append(_observations() - before)
        return deidentify(self, resource, *args, **kwargs)

    monkeypatch.setattr(Deidentifier, "deidentify", counting)
    before = _observations()  # other tests' records may still be alive in this process
    result = _run(src, tmp_path / "out.ndjson", test_key_file)
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "out.ndjson").read_text().splitlines()) == lines
    assert alive and alive[0] <= 3  # held whole: every line's record (or output) alive at once


def test_a_bad_last_line_publishes_nothing(tmp_path, test_key_file):
    src = tmp_path / "obs.ndjson"
    src.write_text("".join(json.dumps(observation(n)) + "\n" for n in range(50)) + '{"resourceType": \n')
    result = _run(src, tmp_path / "out" / "obs.ndjson", test_key_file)
    assert result.exit_code == 2 and "line 51" in result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # no output, no temporary file


def test_a_file_without_resources_is_skipped_and_a_line_without_a_type_is_bad_input(tmp_path, test_key_file):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "log.ndjson").write_text('{"url": "x"}\n{"url": "y"}\n')
    (tmp_path / "in" / "obs.ndjson").write_text(json.dumps(observation(1)) + '\n{"url": "y"}\n')
    result = _run(tmp_path / "in", tmp_path / "out", test_key_file)
    assert "log.ndjson: holds no FHIR resources" in result.output
    assert "obs.ndjson: resource 2 has no resourceType" in result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))
