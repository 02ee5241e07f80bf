"""The audit trail as the commands use it: `fhir` records every output, `audit verify|export`, the vault, keys.

Runs the CLI in-process (typer's CliRunner) against SQLite and a real PostgreSQL (tests/audit_stores.py).
"""
from __future__ import annotations

import base64
import csv
import io
import json

import pytest
from typer.testing import CliRunner

from adapter.audit.trail import AuditTrail, sha256_of
from adapter.cli.main import app
from fhir_transforms import keys
from fhir_transforms.pseudonym import Pseudonymizer
from text_deid.stack import DEFAULT_STACK
from tests.support import dump, store_url  # noqa: F401 — fixture
from tests.conftest import CASES, make_engine
from adapter.audit.vault import ReidentificationDenied, Vault, entries

NAME, FAMILY, MRN, STREET = "Zebulon", "Quixotefeld", "MRN-CANARY-7731", "42 Wobblesnout Lane"
MRN_SYSTEM = "http://hospital.example.org/mrn"
CANARIES = [NAME, FAMILY, MRN, STREET, "Wobblesnout", "1931-02-17"]


def canary_patient() -> dict:
    return {
        "resourceType": "Patient", "id": "pat-canary",
        "text": {"status": "generated",
                 "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{NAME} {FAMILY}, MRN {MRN}, lives at {STREET}; '
                        'born 1931-02-17.</div>'},
        "identifier": [{"system": MRN_SYSTEM, "value": MRN}],
        "name": [{"family": FAMILY, "given": [NAME]}],
        "birthDate": "1931-02-17",
        "address": [{"line": [STREET], "city": "Springfield", "state": "MA", "postalCode": "01103"}],
    }


def cli(*args: str, env: dict | None = None):
    result = CliRunner().invoke(app, list(args), env={"DEID_ADAPTER_KEY_FILE": None, **(env or {})})
    return result


@pytest.fixture
def setup(tmp_path, store_url, test_key_file):  # noqa: F811
    """Keys, the canary input, and the options naming the audit store and vault of this test."""
    audit_key = tmp_path / "audit.key"
    vault_key = tmp_path / "vault.key"
    assert cli("keys", "init", "--purpose", "audit", str(audit_key)).exit_code == 0
    assert cli("keys", "init", "--purpose", "vault", str(vault_key)).exit_code == 0
    src = tmp_path / "in" / "patient.json"
    src.parent.mkdir()
    src.write_text(json.dumps(canary_patient()))
    vault_store = store_url if not store_url.startswith("sqlite") else f"sqlite:///{tmp_path / 'vault.sqlite'}"
    env = {"DEID_ADAPTER_AUDIT": store_url, "DEID_ADAPTER_AUDIT_KEY_FILE": str(audit_key),
           "DEID_ADAPTER_VAULT": vault_store, "DEID_ADAPTER_ACTOR": "test-operator"}
    return {"tmp": tmp_path, "src": src, "audit_key": audit_key, "vault_key": vault_key, "env": env,
            "store": store_url, "vault_store": vault_store, "key_file": test_key_file}


def deidentify(s, *extra: str, out: str = "out.json"):
    target = s["tmp"] / out
    result = cli("fhir", str(s["src"]), str(target), "--key-file", str(s["key_file"]), "--today", "2026-01-15",
                 *extra, env=s["env"])
    assert result.exit_code == 0, result.output
    return json.loads(target.read_text())


def trail(s) -> AuditTrail:
    return AuditTrail(s["store"], [k for _, k, _ in keys.key_ring(s["audit_key"], "audit")])


def test_fhir_records_each_output_and_the_chain_verifies(setup):
    deidentify(setup)
    records = list(trail(setup).export())
    assert len(records) == 1
    rec = records[0]
    assert rec["operation"] == "deidentify" and rec["actor"] == "test-operator" and rec["channel"] == "cli"
    assert rec["profile"] == "safe-harbor" and rec["rules_version"] and rec["stack"] == DEFAULT_STACK
    assert rec["key_id"] == keys.load_key(setup["key_file"]).key_id
    assert rec["output_sha256"] == sha256_of((setup["tmp"] / "out.json").read_bytes())  # `sha256sum out.json`
    assert rec["input_sha256"] == sha256_of(setup["src"].read_bytes())  # the bytes as read: `sha256sum` of the input
    assert {"NAME", "GEOGRAPHIC_LOCATION"} <= {f["category"] for f in rec["findings"]}
    assert all(f["path"].startswith("Patient.") for f in rec["findings"])  # the file name never enters a path
    verify = cli("audit", "verify", "--json", env=setup["env"])
    assert verify.exit_code == 0, verify.output
    assert json.loads(verify.stdout)["records"] == 1


def test_refusal_is_recorded_without_an_output(setup):
    bad = json.loads((CASES / "refused" / "modifier-extension-refused.json").read_text())
    setup["src"].write_text(json.dumps(bad))
    result = cli("fhir", str(setup["src"]), str(setup["tmp"] / "out.json"), "--key-file", str(setup["key_file"]),
                 env=setup["env"])
    assert result.exit_code == 3
    assert not (setup["tmp"] / "out.json").exists()
    [rec] = list(trail(setup).export())
    assert rec["operation"] == "refuse" and rec["output_sha256"] == "" and rec["detail"]["reason"]
    assert str(setup["src"]) not in json.dumps(rec)


def test_no_phi_and_no_key_material_in_the_stores(setup):
    """Canary: distinctive values of the input never reach the audit store or the vault (searched as a dump)."""
    deidentify(setup, "--vault", "--vault-key-file", str(setup["vault_key"]))
    pseudo = Pseudonymizer(keys.load_key(setup["key_file"])).identifier(MRN_SYSTEM, MRN)
    relinked = cli("vault", "reidentify", pseudo, "--reason", "canary test",
                   "--vault-key-file", str(setup["vault_key"]), env=setup["env"])
    assert relinked.exit_code == 0 and MRN in relinked.stdout  # the vault does hold it, encrypted
    secrets = []
    for f in (setup["key_file"], setup["audit_key"], setup["vault_key"]):
        raw = base64.b64decode(json.loads(f.read_text())["secret"])
        secrets += [base64.b64encode(raw).decode(), raw.hex()]
    blobs = [dump(setup["store"]), dump(setup["vault_store"])]
    for p in setup["tmp"].glob("*.sqlite*"):  # the raw database files, WAL included
        blobs.append(p.read_bytes())
    for blob in blobs:
        for needle in CANARIES + secrets:
            assert needle.encode() not in blob, f"{needle!r} found in a store"


def test_audit_export_csv_and_json(setup):
    deidentify(setup)
    csv_out = cli("audit", "export", "--format", "csv", env=setup["env"])
    assert csv_out.exit_code == 0, csv_out.output
    rows = list(csv.DictReader(io.StringIO(csv_out.stdout)))
    assert rows[0]["operation"] == "deidentify" and "NAME:" in rows[0]["phi_categories"]
    json_file = setup["tmp"] / "accounting.json"
    assert cli("audit", "export", "--format", "json", "--out", str(json_file), env=setup["env"]).exit_code == 0
    assert json.loads(json_file.read_text())["count"] == 1


def test_export_refuses_a_broken_chain(setup):
    deidentify(setup)
    deidentify(setup, out="again.json")
    t = trail(setup)
    with t.engine.connect() as conn:
        conn.exec_driver_sql("UPDATE deid_audit_record SET actor = 'mallory' WHERE seq = 1")
        conn.commit()
    verify = cli("audit", "verify", env=setup["env"])
    assert verify.exit_code == 1 and "record 1" in verify.stdout and "changed" in verify.stdout
    assert cli("audit", "export", env=setup["env"]).exit_code == 1


def test_vault_round_trip_denials_and_one_chain_across_edges(setup):
    deidentify(setup, "--vault", "--vault-key-file", str(setup["vault_key"]))
    pseudo = Pseudonymizer(keys.load_key(setup["key_file"])).resource_id("pat-canary")
    reason = "IRB-2026-17 recontact"

    ok = cli("vault", "reidentify", pseudo, "--reason", reason, "--vault-key-file", str(setup["vault_key"]),
             env=setup["env"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout.splitlines()[0])["original"] == "pat-canary"

    no_key = cli("vault", "reidentify", pseudo, "--reason", reason, env=setup["env"])
    assert no_key.exit_code == 2 and "pat-canary" not in no_key.output
    wrong = setup["tmp"] / "wrong-vault.key"
    assert cli("keys", "init", "--purpose", "vault", str(wrong)).exit_code == 0
    wrong_key = cli("vault", "reidentify", pseudo, "--reason", reason, "--vault-key-file", str(wrong), env=setup["env"])
    assert wrong_key.exit_code == 2 and "pat-canary" not in wrong_key.output
    no_reason = cli("vault", "reidentify", pseudo, "--vault-key-file", str(setup["vault_key"]), env=setup["env"])
    assert no_reason.exit_code == 2 and "pat-canary" not in no_reason.output

    # The service and the MLLP listener append to the same trail through the API.
    t = trail(setup)
    engine = make_engine(keys.load_key(setup["key_file"]))
    result = engine.deidentify(canary_patient())
    t.record_deidentification(engine, actor="client-a", channel="service", data_format="fhir",
                              input=canary_patient(), output=result.resource, findings=result.findings)
    t.record_refusal(engine, actor="10.0.0.7:51234", channel="mllp", data_format="hl7v2", input=b"MSH|^~\\&|...",
                     reason="message: leak guard refused the output: NAME at PID-5")
    ops = [(r["operation"], r["channel"], r["actor"]) for r in t.export()]
    assert ops == [("deidentify", "cli", "test-operator"), ("reidentify", "vault", "test-operator"),
                   ("reidentify-denied", "vault", "test-operator"), ("reidentify-denied", "vault", "test-operator"),
                   ("deidentify", "service", "client-a"), ("refuse", "mllp", "10.0.0.7:51234")]
    granted = [r for r in t.export() if r["operation"] == "reidentify"][0]
    assert granted["detail"]["reason"] == reason and granted["detail"]["pseudonym"] == pseudo
    assert "pat-canary" not in json.dumps(list(t.export()))
    assert t.verify().ok


def test_a_vault_key_of_the_wrong_purpose_is_audited_as_such(setup):
    # issue #36: the denial's recorded reason is what was wrong (a pseudonym key given), not "no vault key given"
    deidentify(setup, "--vault", "--vault-key-file", str(setup["vault_key"]))
    pseudo = Pseudonymizer(keys.load_key(setup["key_file"])).resource_id("pat-canary")
    denied = cli("vault", "reidentify", pseudo, "--reason", "IRB-2026-17", "--vault-key-file", str(setup["key_file"]),
                 env=setup["env"])
    assert denied.exit_code == 2 and "pat-canary" not in denied.output
    record = [r for r in trail(setup).export() if r["operation"] == "reidentify-denied"][-1]
    assert "not a vault key" in record["detail"]["denied"]


def test_vault_entry_moved_to_another_pseudonym_does_not_decrypt(setup):
    deidentify(setup, "--vault", "--vault-key-file", str(setup["vault_key"]))
    vault = Vault(setup["vault_store"])
    table = entries()
    with vault.engine.connect() as conn:
        rows = conn.execute(table.select().order_by(table.c.id)).all()
        conn.execute(table.update().where(table.c.id == rows[1].id).values(nonce=rows[0].nonce,
                                                                              ciphertext=rows[0].ciphertext))
        conn.commit()
    with pytest.raises(ReidentificationDenied):
        vault.reidentify(rows[1].pseudonym, [keys.load_key(setup["vault_key"], "vault")])


def test_key_rotation_changes_pseudonyms_and_keeps_the_old_key(setup, tmp_path):
    key_file = tmp_path / "site.key"
    assert cli("keys", "init", str(key_file)).exit_code == 0
    setup["key_file"] = key_file
    before = deidentify(setup, out="before.json")
    rotated = cli("keys", "rotate", str(key_file))
    assert rotated.exit_code == 0, rotated.output
    after = deidentify(setup, out="after.json")
    assert before["id"] != after["id"]
    assert before["identifier"][0]["value"] != after["identifier"][0]["value"]
    tag = {t["system"]: t["code"] for t in before["meta"]["tag"]}
    tag_after = {t["system"]: t["code"] for t in after["meta"]["tag"]}
    assert tag != tag_after  # the key id travels with the data
    listing = cli("keys", "list", str(key_file))
    lines = listing.stdout.splitlines()
    assert len(lines) == 2 and "current" in lines[0] and "retired" in lines[1]
    old = keys.key_ring(key_file)[1][1]
    assert old.key_id in tag.values()
    assert old.key_id in {r["key_id"] for r in trail(setup).export()}
    for f in tmp_path.glob("site.key*"):
        assert f.stat().st_mode & 0o077 == 0


def test_key_files_refused_when_open_or_for_another_purpose(setup):
    setup["audit_key"].chmod(0o640)
    result = cli("audit", "verify", env=setup["env"])
    assert result.exit_code == 2 and "readable by group or others" in result.output
    setup["audit_key"].chmod(0o600)
    wrong_purpose = cli("fhir", str(setup["src"]), str(setup["tmp"] / "o.json"), "--key-file", str(setup["vault_key"]),
                        env=setup["env"])
    assert wrong_purpose.exit_code == 2 and "vault key, not a pseudonym key" in wrong_purpose.output
    secret = json.loads(setup["vault_key"].read_text())["secret"]
    assert secret not in wrong_purpose.output


def _tables(url: str) -> list[str]:
    from sqlalchemy import create_engine, inspect

    engine = create_engine(url)
    try:
        return sorted(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_verify_is_read_only_and_fails_on_a_missing_or_empty_trail(setup):
    """Issue #17 item 14: no "ok: 0 records" for a missing store, missing tables or an empty trail, and
    verify writes nothing (no schema, no genesis head, the SQLite file byte-identical)."""
    sqlite_file = setup["tmp"] / "audit.sqlite" if setup["store"].startswith("sqlite") else None

    missing = cli("audit", "verify", env=setup["env"])
    assert missing.exit_code == 2, missing.output
    assert ("does not exist" if sqlite_file else "deid_audit_record, deid_audit_head missing") in missing.output
    assert "--allow-empty" in missing.output
    assert (not sqlite_file.exists()) if sqlite_file else _tables(setup["store"]) == []  # nothing was created
    assert cli("audit", "verify", "--allow-empty", env=setup["env"]).exit_code == 0

    trail(setup).close()  # a writer made the tables and the genesis head: an empty trail
    empty = cli("audit", "verify", env=setup["env"])
    assert empty.exit_code == 1 and "holds no records" in empty.output
    assert cli("audit", "verify", "--allow-empty", env=setup["env"]).exit_code == 0

    deidentify(setup)
    before = dump(setup["store"]), sqlite_file.read_bytes() if sqlite_file else b""
    ok = cli("audit", "verify", env=setup["env"])
    assert ok.exit_code == 0 and ok.stdout.startswith("ok: 1 records"), ok.output
    assert (dump(setup["store"]), sqlite_file.read_bytes() if sqlite_file else b"") == before

    t = trail(setup)
    with t.engine.connect() as conn:
        conn.exec_driver_sql("DROP TABLE deid_audit_record")
        conn.commit()
    t.close()
    dropped = cli("audit", "verify", env=setup["env"])
    assert dropped.exit_code == 2 and "deid_audit_record missing" in dropped.output, dropped.output
    assert "deid_audit_record" not in _tables(setup["store"])


def test_verify_of_a_mistyped_path_is_a_clear_error(setup):
    typo = setup["tmp"] / "no-such-dir" / "audt.sqlite"
    result = cli("audit", "verify", "--audit", str(typo), env=setup["env"])
    assert result.exit_code == 2 and f"no audit trail at {typo}: the file does not exist" in result.output
    assert not typo.parent.exists()
