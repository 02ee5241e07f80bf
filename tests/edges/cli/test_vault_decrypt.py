"""`encrypt`'s other half: `vault decrypt` returns the original only with the vault key and a reason, and every
attempt is an audit record first; an engine whose profile encrypts needs the vault key from the start."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from adapter.audit.trail import AuditTrail
from adapter.cli.main import app
from adapter.engines import with_vault_key
from fhir_transforms import keys
from fhir_transforms.encryption import ValueCipher
from fhir_transforms.errors import SettingsError
from fhir_transforms.fpe import FpeFormat
from fhir_transforms.pseudonym import Pseudonymizer

CITY, MRN = "Springfield", "MRN00423917"


def cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env={"DEID_ADAPTER_KEY_FILE": None,
                                                    "DEID_ADAPTER_VAULT_KEY_FILE": None, **(env or {})})


@pytest.fixture
def vault_keys(tmp_path):
    paths = []
    for name in ("vault.key", "other-vault.key"):
        path = tmp_path / name
        assert cli("keys", "init", "--purpose", "vault", str(path)).exit_code == 0
        paths.append(path)
    return paths


def test_decrypt_needs_the_vault_key_and_a_reason_and_is_audited(vault_keys, tmp_path):
    vault_key, other = vault_keys
    audit_key = tmp_path / "audit.key"
    assert cli("keys", "init", "--purpose", "audit", str(audit_key)).exit_code == 0
    env = {"DEID_ADAPTER_AUDIT": f"sqlite:///{tmp_path / 'audit.sqlite'}", "DEID_ADAPTER_AUDIT_KEY_FILE": str(audit_key),
           "DEID_ADAPTER_ACTOR": "test-operator"}
    cipher = ValueCipher(keys.load_key(vault_key, "vault"))
    sealed = cipher.encrypt(CITY)
    shaped = cipher.encrypt(MRN, FpeFormat(alphabet=FpeFormat.from_options({"alphabet": "alphanumeric"}).alphabet,
                                           keep_prefix=3))
    reason = "IRB-2026-17 recontact"

    ok = cli("vault", "decrypt", sealed, "--reason", reason, "--vault-key-file", str(vault_key), env=env)
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["original"] == CITY
    fpe = cli("vault", "decrypt", shaped, "--reason", reason, "--vault-key-file", str(vault_key), "--format", "fpe",
              "--alphabet", "alphanumeric", "--keep-prefix", "3", env=env)
    assert fpe.exit_code == 0 and json.loads(fpe.stdout)["original"] == MRN
    wrong = cli("vault", "decrypt", sealed, "--reason", reason, "--vault-key-file", str(other), env=env)
    assert wrong.exit_code == 2 and CITY not in wrong.output  # AES-SIV authenticates: a wrong key is refused
    no_key = cli("vault", "decrypt", sealed, "--reason", reason, env=env)
    assert no_key.exit_code == 2 and CITY not in no_key.output
    no_reason = cli("vault", "decrypt", sealed, "--vault-key-file", str(vault_key), env=env)
    assert no_reason.exit_code == 2

    trail = AuditTrail(env["DEID_ADAPTER_AUDIT"], [k for _, k, _ in keys.key_ring(audit_key, "audit")])
    records = list(trail.export())
    assert [r["operation"] for r in records] == ["reidentify", "reidentify", "reidentify-denied", "reidentify-denied"]
    assert records[0]["detail"]["method"] == "encrypt" and records[0]["detail"]["reason"] == reason
    assert CITY not in json.dumps(records) and MRN not in json.dumps(records)
    assert trail.verify().ok


def test_an_encrypting_profile_needs_the_vault_key(test_key, vault_keys, tmp_path):
    pseudo = Pseudonymizer(test_key)
    with_vault_key(pseudo, {"remove", "keep"})  # no encrypt rule: no vault key read
    assert pseudo.cipher is None
    with pytest.raises(SettingsError, match="vault key"):
        with_vault_key(pseudo, {"encrypt"})
    with pytest.raises(SettingsError, match="vault key"):
        with_vault_key(pseudo, {"encrypt"}, tmp_path / "missing.key")
    with_vault_key(pseudo, {"encrypt"}, vault_keys[0])
    assert pseudo.cipher.decrypt(pseudo.cipher.encrypt(CITY)) == CITY
