"""The unit refused: an NDJSON line (its neighbours are written), a Bundle or resource file (all or nothing)."""
from __future__ import annotations

import json

import pytest

from adapter.audit.vault import ReidentificationDenied, Vault
from adapter.cli.common import EXIT_REFUSED
from fhir_transforms import keys
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import run_cli
from tests.edges.audit.test_audit_cli import cli, setup, trail  # noqa: F401 — setup is a fixture
from tests.support import store_url  # noqa: F401 — fixture

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


def test_each_refused_line_is_audited_and_only_written_lines_are_vaulted(setup):  # noqa: F811
    src = setup["src"].with_name("Patient.ndjson")
    lines = [_patient("bad-1", modifierExtension=UNKNOWN_MODIFIER), _patient("good"),
             _patient("bad-2", modifierExtension=UNKNOWN_MODIFIER)]
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = setup["tmp"] / "out.ndjson"
    result = cli("fhir", str(src), str(out), "--key-file", str(setup["key_file"]), "--vault",
                 "--vault-key-file", str(setup["vault_key"]), env=setup["env"])
    assert result.exit_code == EXIT_REFUSED
    assert len(out.read_text().splitlines()) == 1
    records = list(trail(setup).export())
    assert sorted(r["operation"] for r in records) == ["deidentify", "refuse", "refuse"]
    vault, ring = Vault(setup["vault_store"]), [keys.load_key(setup["vault_key"], "vault")]
    pseudo = Pseudonymizer(keys.load_key(setup["key_file"]))
    assert [r.original for r in vault.reidentify(pseudo.resource_id("good"), ring)] == ["good"]
    for refused in ("bad-1", "bad-2"):  # a refused line's pseudonyms are not kept
        with pytest.raises(ReidentificationDenied):
            vault.reidentify(pseudo.resource_id(refused), ring)
