"""A Bundle too large for full validation is refused before any work, naming the limit and --validate sample;
under sample or off the same file is de-identified."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from adapter import files
from adapter.cli.main import app

BUNDLE = {"resourceType": "Bundle", "type": "collection",
          "entry": [{"resource": {"resourceType": "Patient", "id": f"p{i}", "name": [{"family": "Zyxwortel"}]}}
                    for i in range(20)]}


def test_full_validation_over_the_limit_is_refused_up_front(tmp_path, test_key_file, monkeypatch):
    monkeypatch.setattr(files, "MAX_VALIDATED_BYTES", 1000)
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a-small.json").write_text(json.dumps(BUNDLE["entry"][0]["resource"]))
    (folder / "b-big.json").write_text(json.dumps(BUNDLE))
    args = [str(folder), str(tmp_path / "out"), "--key-file", str(test_key_file), "--audit", "off", "--stack", "patterns"]
    result = CliRunner().invoke(app, ["fhir", *args])
    assert result.exit_code == 2
    assert "b-big.json" in result.output and "--validate sample" in result.output and "full validation" in result.output
    assert not (tmp_path / "out").exists()  # refused before the small file was written
    for mode in ("sample", "off"):
        result = CliRunner().invoke(app, ["fhir", *args[:1], str(tmp_path / f"out-{mode}"), *args[2:], "--validate", mode])
        assert result.exit_code == 0, result.output
        assert (tmp_path / f"out-{mode}" / "b-big.json").exists()
