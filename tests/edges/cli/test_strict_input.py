"""Strict input (issue #17): duplicate keys and deep nesting are bad input, profiles come only from the
packaged set, degenerate keys are refused, and writes stay inside OUTPUT."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapter import json_input
from adapter.cli.main import app
from fhir_transforms import keys, rules
from tests.conftest import write_key

DUPLICATED = ('{"resourceType": "Patient", "id": "p1", "name": [{"family": "Zyxwortel", "family": "Quorvath"}], '
              '"text": {"status": "generated", "div": "<div xmlns=\\"http://www.w3.org/1999/xhtml\\">Zyxwortel</div>"}}')
PATIENT = {"resourceType": "Patient", "id": "p2", "name": [{"family": "Jones"}]}


def cli(*args: str, key_file: Path | None = None):
    env = {"DEID_ADAPTER_KEY_FILE": str(key_file) if key_file else None, "DEID_ADAPTER_AUDIT": "off"}
    return CliRunner().invoke(app, list(args), env=env)


def fhir(src: Path, out: Path, key_file: Path, *extra: str):
    return cli("fhir", str(src), str(out), "--today", "2026-01-15", *extra, key_file=key_file)


def nested(levels: int) -> dict:
    """A Patient whose extensions nest `levels` deep (two JSON levels each: an object and its array)."""
    ext = {"url": "http://example.org/x", "valueString": "v"}
    for _ in range(levels):
        ext = {"url": "http://example.org/x", "extension": [ext]}
    return {"resourceType": "Patient", "id": "deep", "extension": [ext]}


# --- duplicate keys ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, path", [
    ('{"id": 1, "id": 2}', "id"),
    ('{"entry": [{"resource": {"name": [{"family": "x", "family": "y"}]}}]}', "entry[0].resource.name[0].family"),
    ('{"text": {"Quorvath Zelbrindex": 1, "Quorvath Zelbrindex": 2}}', "text.?"),
    # only element names FHIR defines are shown: a name-shaped key is a sender's, and may be a name
    ('{"Zyxwortel": {"_birthDate": {"Quorvath": 1, "Quorvath": 2}}}', "?._birthDate.?"),
])
def test_a_duplicate_key_is_refused_naming_its_path(text, path):
    with pytest.raises(json_input.JsonInputError) as e:
        json_input.loads(text)
    assert str(e.value) == f"duplicate JSON key at {path}"


def test_a_duplicate_key_is_bad_input_in_a_file_and_an_ndjson_line(tmp_path, test_key_file):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "dup.json").write_text(DUPLICATED)
    (tmp_path / "in" / "lines.ndjson").write_text(json.dumps(PATIENT) + "\n" + DUPLICATED + "\n")
    result = fhir(tmp_path / "in", tmp_path / "out", test_key_file)
    assert result.exit_code == 2
    assert "dup.json: duplicate JSON key at name[0].family" in result.output
    assert "lines.ndjson: line 2: duplicate JSON key at name[0].family" in result.output
    assert "Zyxwortel" not in result.output and "Quorvath" not in result.output
    assert not (tmp_path / "out" / "dup.json").exists() and not (tmp_path / "out" / "lines.ndjson").exists()


# --- nesting depth ----------------------------------------------------------------------------------------

def test_depth_is_limited_while_real_fhir_depths_pass():
    json_input.loads("[" * json_input.MAX_DEPTH + "]" * json_input.MAX_DEPTH)
    for levels in (json_input.MAX_DEPTH + 1, 5000):  # 5000: past the json module's own recursion limit
        with pytest.raises(json_input.JsonInputError, match="nested deeper than 100 levels"):
            json_input.loads("[" * levels + "]" * levels)


def test_a_deeply_nested_file_is_bad_input_and_the_folder_run_goes_on(tmp_path, test_key_file):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a_deep.json").write_text(json.dumps(nested(150)))  # 300 JSON levels: a RecursionError before
    (tmp_path / "in" / "b_ok.json").write_text(json.dumps(PATIENT))
    result = fhir(tmp_path / "in", tmp_path / "out", test_key_file)
    assert result.exit_code == 2, result.output
    assert "a_deep.json: JSON nested deeper than 100 levels" in result.output
    assert (tmp_path / "out" / "b_ok.json").exists() and not (tmp_path / "out" / "a_deep.json").exists()


# --- profiles ---------------------------------------------------------------------------------------------

def test_only_packaged_profile_names_load(tmp_path):
    (tmp_path / "keeps-dates.yaml").write_text((rules.MAPPINGS / "safe-harbor.yaml").read_text())
    outside = os.path.relpath(tmp_path / "keeps-dates", rules.MAPPINGS)
    for name in (outside, "./safe-harbor", "././safe-harbor", "safe-harbor.yaml", "SAFE-HARBOR"):
        with pytest.raises(rules.ProfileError, match="unknown profile"):
            rules.load_profile(name)
    assert rules.load_profile("safe-harbor").name == "safe-harbor"


def test_a_profile_path_on_the_command_line_exits_2(tmp_path, test_key_file):
    (tmp_path / "p.json").write_text(json.dumps(PATIENT))
    (tmp_path / "keeps-dates.yaml").write_text((rules.MAPPINGS / "safe-harbor.yaml").read_text())
    result = fhir(tmp_path / "p.json", tmp_path / "o.json", test_key_file, "--profile",
                  os.path.relpath(tmp_path / "keeps-dates", rules.MAPPINGS))
    assert result.exit_code == 2 and "unknown profile" in result.output and not (tmp_path / "o.json").exists()


# --- keys -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("secret", [bytes(32), b"\x07" * 32, b"ab" * 16, bytes(range(8)) * 4], ids=[
    "all-zero", "one-byte", "two-byte-pattern", "eight-byte-pattern"])
def test_a_degenerate_key_is_refused_at_load(tmp_path, secret, test_key_file):
    path = write_key(tmp_path / "weak.key", secret)
    with pytest.raises(keys.KeyError_, match="degenerate"):
        keys.load_key(path)
    (tmp_path / "p.json").write_text(json.dumps(PATIENT))
    result = fhir(tmp_path / "p.json", tmp_path / "o.json", path)
    assert result.exit_code == 2 and "degenerate" in result.output and not (tmp_path / "o.json").exists()


# --- OUTPUT -----------------------------------------------------------------------------------------------

def test_a_link_inside_OUTPUT_does_not_send_writes_outside_it(tmp_path, test_key_file):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "sub" / "x.json").write_text(json.dumps(PATIENT))
    (tmp_path / "in" / "top.json").write_text(json.dumps(PATIENT))
    (tmp_path / "outside").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sub").symlink_to(tmp_path / "outside")
    result = fhir(tmp_path / "in", tmp_path / "out", test_key_file)
    assert result.exit_code == 2 and "leads outside it" in result.output
    assert list((tmp_path / "outside").iterdir()) == []
    assert (tmp_path / "out" / "top.json").exists()


def test_an_OUTPUT_that_is_a_file_exits_2_before_anything_is_audited(tmp_path, test_key_file):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "p.json").write_text(json.dumps(PATIENT))
    (tmp_path / "out").write_text("a file")
    audit_key = tmp_path / "audit.key"
    assert cli("keys", "init", "--purpose", "audit", str(audit_key)).exit_code == 0
    store = tmp_path / "audit.sqlite"
    result = cli("fhir", str(tmp_path / "in"), str(tmp_path / "out"), "--today", "2026-01-15", "--audit", str(store),
                 "--audit-key-file", str(audit_key), key_file=test_key_file)
    assert result.exit_code == 2 and "is not a folder" in result.output
    assert not store.exists()
    assert (tmp_path / "out").read_text() == "a file"


# --- bulk -------------------------------------------------------------------------------------------------

def test_bulk_refuses_deep_and_duplicated_lines_and_finishes_the_run(tmp_path):
    from tests.support import run_bulk

    (tmp_path / "in").mkdir()
    lines = [json.dumps(PATIENT), json.dumps(nested(150)), DUPLICATED.replace('"p1"', '"p3"'), json.dumps(dict(PATIENT, id="p4"))]
    (tmp_path / "in" / "Patient.000.ndjson").write_text("\n".join(lines) + "\n")
    out = run_bulk(tmp_path / "out", tmp_path / "in", workers=1)
    summary = json.loads((out / "deid-summary.json").read_text())
    assert summary["resources"] == {"Patient": 2}
    assert [(r["line"], r["reason"]) for r in summary["refusals"]] == [(2, "invalid-json"), (3, "invalid-json")]
