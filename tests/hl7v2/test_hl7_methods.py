"""substitute, perturb, generalize, encrypt and a fixed date offset on HL7v2 fields: golden files
(tests/cases/methods/hl7v2/<method>.yaml, a site's profile extending safe-harbor, applied to message.hl7 →
<method>.expected.hl7 under the fixed test keys and day), and what must hold besides.

To regenerate after an intended change: DEID_UPDATE_GOLDEN=1 python -m pytest tests/hl7v2/test_hl7_methods.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from fhir_transforms.encryption import ValueCipher
from fhir_transforms.errors import InputError
from fhir_transforms.fpe import FpeFormat
from fhir_transforms.hl7v2 import rules as hl7_rules
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import load_hl7_profile
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.rules import ProfileError, profile_names
from tests.conftest import CASES, FIXED_TODAY
from tests.r4.test_methods import VAULT_KEY
from text_deid.stack import build_stack

METHOD_CASES = CASES / "methods" / "hl7v2"
MESSAGE = (METHOD_CASES / "message.hl7").read_text()
GOLDEN = sorted(METHOD_CASES.glob("*.yaml"))


def site_profile(tmp_path: Path, monkeypatch, body: str, name: str = "site"):
    """A site's HL7v2 profile extending safe-harbor, read by the same loader as the packaged ones."""
    (tmp_path / "safe-harbor.yaml").write_text((hl7_rules.MAPPINGS / "safe-harbor.yaml").read_text())
    (tmp_path / f"{name}.yaml").write_text(f"extends: safe-harbor\nprofile: {name}\nversion: '1'\n" + body)
    monkeypatch.setattr(hl7_rules, "MAPPINGS", tmp_path)
    profile_names.cache_clear()
    load_hl7_profile.cache_clear()
    try:
        return load_hl7_profile(name)
    finally:
        load_hl7_profile.cache_clear()
        profile_names.cache_clear()


def engine_for(profile, key, vault: bool = True) -> HL7Deidentifier:
    pseudo = Pseudonymizer(key)
    if vault:
        pseudo.use_vault_key(VAULT_KEY)
    return HL7Deidentifier(profile, pseudo, build_stack("patterns"), lambda: FIXED_TODAY)


def segment(out: str, sid: str, n: int = 0) -> list[str]:
    return [s for s in out.split("\r") if s.startswith(sid + "|")][n].split("|")


def run(case: str, key, tmp_path, monkeypatch) -> str:
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / f"{case}.yaml").read_text(), case)
    return engine_for(profile, key).deidentify(MESSAGE)


@pytest.mark.parametrize("case", GOLDEN, ids=lambda p: p.stem)
def test_golden(case: Path, test_key, tmp_path, monkeypatch):
    out = run(case.stem, test_key, tmp_path, monkeypatch)
    expected = case.with_suffix(".expected.hl7")
    if os.environ.get("DEID_UPDATE_GOLDEN"):
        expected.write_text(out.replace("\r", "\n"))
    assert out == expected.read_text().replace("\n", "\r")


def test_substitute_on_name_phone_and_city(test_key, tmp_path, monkeypatch):
    pid = segment(run("substitute", test_key, tmp_path, monkeypatch), "PID")
    family, given = pid[5].split("^")[:2]
    assert family and given and family != "Kowalczyk" and given != "Marta"
    phone = pid[13].split("^")[0]
    assert phone != "555-867-5309" and [c.isdigit() for c in phone] == [c.isdigit() for c in "555-867-5309"]
    assert pid[11].split("^")[2] == "Anytown"


def test_perturb_numbers_and_ages(test_key, tmp_path, monkeypatch):
    out = run("perturb", test_key, tmp_path, monkeypatch)
    weight, age, old = (float(segment(out, "OBX", i)[5]) for i in range(3))
    assert 69.4 <= weight <= 75.4 and weight != 72.4
    assert 85 <= age <= 90 and old == 90  # 93: still 90
    assert run("perturb", test_key, tmp_path, monkeypatch) == out


def test_generalize_birth_date_and_code(test_key, tmp_path, monkeypatch):
    out = run("generalize", test_key, tmp_path, monkeypatch)
    assert segment(out, "PID")[7] == "1960"
    assert segment(out, "OBX", 3)[5].split("^")[:3] == ["77176002", "", "SCT"]
    assert segment(out, "OBX", 3)[3].split("^")[0] == "72166-2"  # otherwise: keep


def test_encrypt_round_trips(test_key, tmp_path, monkeypatch):
    pid = segment(run("encrypt", test_key, tmp_path, monkeypatch), "PID")
    mrn, city = pid[3].split("^")[0], pid[11].split("^")[2]
    assert mrn.startswith("MRN") and len(mrn) == len("MRN00423917") and mrn != "MRN00423917"
    cipher = ValueCipher(VAULT_KEY)
    assert cipher.decrypt(city) == "Springfield"
    fmt = FpeFormat(alphabet=FpeFormat.from_options({"alphabet": "alphanumeric"}).alphabet, keep_prefix=3)
    assert cipher.decrypt(mrn, fmt) == "MRN00423917"


def test_encrypt_without_the_vault_key_is_a_clear_error(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "encrypt.yaml").read_text())
    assert "encrypt" in profile.methods
    with pytest.raises(InputError, match="vault key"):
        engine_for(profile, test_key, vault=False).deidentify(MESSAGE)


def test_a_fixed_offset_shifts_every_date(test_key, tmp_path, monkeypatch):
    out = run("shift", test_key, tmp_path, monkeypatch)
    assert segment(out, "PID")[7] == "19610318"
    assert segment(out, "OBR")[7] == "20250131101500"


@pytest.mark.parametrize("scope", ["patient", "record", "release"])
def test_shift_scope(scope, test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, f"datatypes:\n  DTM: {{method: shift, scope: {scope}}}\n")
    engine = engine_for(profile, test_key)

    def birth(control_id: str, mrn: str) -> str:
        return segment(engine.deidentify(MESSAGE.replace("CTRL1", control_id).replace("MRN00423917", mrn)), "PID")[7]

    assert (birth("C1", "MRN1") == birth("C2", "MRN1")) == (scope in ("patient", "release"))
    assert (birth("C1", "MRN1") == birth("C1", "MRN2")) == (scope in ("record", "release"))


def test_marking_is_a_fhir_setting(tmp_path, monkeypatch):
    with pytest.raises(ProfileError, match="unknown setting 'marking'"):
        site_profile(tmp_path, monkeypatch, "fields: {PID.8: {method: remove, marking: true}}\n")
