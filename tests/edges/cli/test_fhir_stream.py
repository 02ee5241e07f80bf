"""`fhir --validate off` writes a Bundle entry by entry: the same bytes as the whole Bundle serialized, and
nothing at all (no output, no temporary file) when the Bundle is refused after entries were written out."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from typer.testing import CliRunner

from adapter import files
from adapter.cli.common import EXIT_REFUSED
from adapter.cli import fhir as fhir_command
from adapter.cli.main import app
from fhir_transforms.errors import DetectorFailed
from fhir_transforms.r4 import stream
from fhir_transforms.r4.record import Deidentifier
from tests.conftest import DATA, FIXED_TODAY, make_engine

SAMPLES = DATA / "fhir"
BUNDLE = sorted((SAMPLES / "synthea-bundles").glob("*.json"))[0]


@pytest.fixture(autouse=True)
def stream_every_bundle(monkeypatch):
    monkeypatch.setattr(fhir_command, "STREAM_FROM_BYTES", 0)  # the sample Bundles are smaller than the threshold


def _run(src: Path, out: Path, key_file: Path):
    return CliRunner().invoke(app, ["fhir", str(src), str(out), "--key-file", str(key_file), "--audit", "off",
                                    "--stack", "patterns", "--validate", "off", "--today", FIXED_TODAY.isoformat()])


def test_streamed_file_is_the_whole_bundle_serialized(tmp_path, test_key_file, test_key, monkeypatch):
    monkeypatch.setattr(stream, "BATCH", 7)
    result = _run(BUNDLE, tmp_path / "out.json", test_key_file)
    assert result.exit_code == 0, result.output
    whole = make_engine(test_key, validate=False).deidentify(json.loads(BUNDLE.read_text()), consume=True).resource
    assert (tmp_path / "out.json").read_bytes() == files.serialize([whole], False)


def test_a_bundle_refused_after_entries_were_written_out_leaves_nothing(tmp_path, test_key_file, monkeypatch):
    monkeypatch.setattr(stream, "BATCH", 1)
    calls = []
    replace_texts = Deidentifier.replace_texts

    def failing(self, ctx, known, path):
        calls.append(path)
        if len(calls) == 3:  # two entries already handed to the writer
            raise DetectorFailed(f"{path}: text detector failed: test")
        return replace_texts(self, ctx, known, path)

    monkeypatch.setattr(Deidentifier, "replace_texts", failing)
    folder = tmp_path / "out"
    folder.mkdir()
    result = _run(BUNDLE, folder / "out.json", test_key_file)
    assert result.exit_code == EXIT_REFUSED, result.output
    assert len(calls) == 3 and "refused" in result.output
    assert list(folder.iterdir()) == []  # neither the output nor a temporary file


def test_a_bundle_under_the_threshold_is_done_whole(tmp_path, test_key_file, monkeypatch):
    monkeypatch.setattr(fhir_command, "STREAM_FROM_BYTES", BUNDLE.stat().st_size + 1)
    streamed = []
    monkeypatch.setattr(stream, "deidentify_entries", lambda *a, **k: streamed.append(a))
    result = _run(BUNDLE, tmp_path / "out.json", test_key_file)
    assert result.exit_code == 0, result.output
    assert streamed == [] and (tmp_path / "out.json").exists()
