"""`fpe` in the profiles: off by default, on in `longitudinal-fpe`; HL7v2 and FHIR still link; audited reversal."""
from __future__ import annotations

import json
import re
from datetime import date

import pytest
from typer.testing import CliRunner

from adapter.audit.trail import AuditTrail
from adapter.cli.main import app
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import load_hl7_profile
from fhir_transforms import keys
from fhir_transforms.rules import load_profile
from tests.conftest import make_engine
from text_deid.stack import build_stack
from fhir_transforms import rules

SYSTEM = "urn:oid:2.16.840.1.113883.19.5"
V2_0203 = "http://terminology.hl7.org/CodeSystem/v2-0203"
MRN, ACCOUNT, VISIT, OTHER = "00-4471-9023", "AC-88120456", "V-7781204", "55512345678"
MSH = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000+0100||ADT^A01^ADT_A01|CTRL1|P|2.5.1"


def hl7_message() -> str:
    pid = ["PID", "1", "", f"{MRN}^^^HOSP&2.16.840.1.113883.19.5&ISO^MR~{OTHER}^^^HOSP&2.16.840.1.113883.19.5&ISO^XX",
           "", "Quixote^Donna^Maria", "", "19700312", "F"] + [""] * 9 + [
           f"{ACCOUNT}^^^HOSP&2.16.840.1.113883.19.5&ISO^AN"]
    pv1 = ["PV1", "1", "I"] + [""] * 16 + [f"{VISIT}^^^HOSP&2.16.840.1.113883.19.5&ISO^VN"]
    obx = f"OBX|1|TX|NOTE||Donna Quixote, MRN {MRN}, account {ACCOUNT}, seen today.||||||F"
    return "\r".join([MSH, "|".join(pid), "|".join(pv1), obx]) + "\r"


def identifier(code: str, value: str) -> dict:
    return {"type": {"coding": [{"system": V2_0203, "code": code}]}, "system": SYSTEM, "value": value}


def fhir_bundle() -> dict:
    return {"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": {"resourceType": "Patient", "id": "p1",
                      "identifier": [identifier("MR", MRN), {"system": SYSTEM, "value": OTHER}],
                      "name": [{"family": "Quixote", "given": ["Donna"]}], "birthDate": "1970-03-12",
                      "text": {"status": "generated",
                               "div": f'<div xmlns="http://www.w3.org/1999/xhtml">Donna Quixote, MRN {MRN}</div>'}}},
        {"resource": {"resourceType": "Account", "id": "a1", "status": "active",
                      "identifier": [identifier("AN", ACCOUNT)], "subject": [{"reference": "Patient/p1"}]}},
        {"resource": {"resourceType": "Encounter", "id": "e1", "status": "finished",
                      "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "IMP"},
                      "identifier": [identifier("VN", VISIT)], "subject": {"reference": "Patient/p1"}}},
    ]}


def run_both(key, profile: str):
    fhir = make_engine(key, profile)
    out = fhir.deidentify(fhir_bundle()).resource  # raises RecordRefused if the leak guard finds an input value
    hl7 = HL7Deidentifier(load_hl7_profile(profile), fhir.pseudo, build_stack("patterns"), lambda: date(2026, 1, 15))
    msg = hl7.deidentify(hl7_message())  # likewise
    segs = {s.split("|")[0]: s.split("|") for s in msg.split("\r") if s}
    pid3 = [r.split("^")[0] for r in segs["PID"][3].split("~")]
    entries = [e["resource"] for e in out["entry"]]
    return {
        "fhir": {"mrn": entries[0]["identifier"][0]["value"], "other": entries[0]["identifier"][1]["value"],
                 "account": entries[1]["identifier"][0]["value"], "visit": entries[2]["identifier"][0]["value"]},
        "hl7": {"mrn": pid3[0], "other": pid3[1], "account": segs["PID"][18].split("^")[0],
                "visit": segs["PV1"][19].split("^")[0]},
        "texts": json.dumps(out) + msg,
    }


def test_longitudinal_keeps_the_keyed_pseudonym_by_default(test_key):
    assert load_profile("longitudinal").rules["Identifier.value"].method == "pseudonym"
    assert load_hl7_profile("longitudinal").datatypes["CX"].components[1].method == "pseudonym"
    got = run_both(test_key, "longitudinal")
    for fmt in ("fhir", "hl7"):
        assert all(re.fullmatch(r"[0-9a-f]{32}", v) for v in got[fmt].values())


def test_fpe_profile_keeps_shapes_and_hl7_and_fhir_still_link(test_key):
    got = run_both(test_key, "longitudinal-fpe")
    assert got["fhir"] == got["hl7"]  # same output for the same value and system, in both formats
    out = got["fhir"]
    assert re.fullmatch(r"\d\d-\d{4}-\d{4}", out["mrn"]) and out["mrn"] != MRN
    assert re.fullmatch(r"AC-\d{8}", out["account"]) and out["account"] != ACCOUNT
    assert re.fullmatch(r"V-\d{7}", out["visit"]) and out["visit"] != VISIT
    assert re.fullmatch(r"[0-9a-f]{32}", out["other"])  # an identifier of an unlisted type keeps the keyed pseudonym
    for original in (MRN, ACCOUNT, VISIT, OTHER, "Quixote"):  # the leak checks passed, and nothing came through
        assert original not in got["texts"]


def test_same_mrn_in_two_systems_maps_differently(test_key):
    engine = make_engine(test_key, "longitudinal-fpe")
    bundle = fhir_bundle()
    bundle["entry"][0]["resource"]["identifier"] = [identifier("MR", MRN),
                                                   {**identifier("MR", MRN), "system": "urn:oid:1.2.3.4"}]
    a, b = (i["value"] for i in engine.deidentify(bundle).resource["entry"][0]["resource"]["identifier"])
    assert a != b and re.fullmatch(r"\d\d-\d{4}-\d{4}", b)
    assert engine.deidentify(fhir_bundle()).resource["entry"][0]["resource"]["identifier"][0]["value"] == a


def test_a_site_profile_can_turn_on_fpe_for_plain_string_identifiers(test_key, tmp_path, monkeypatch):
    """The snippet in the README: a site's own profile that extends `longitudinal` with `fpe` settings."""
    (tmp_path / "site.yaml").write_text(
        "extends: longitudinal\nprofile: site\nversion: '1'\nrules:\n"
        "  Identifier.value: {method: fpe, alphabet: digits, check_digit: luhn}\n")
    for name in ("safe-harbor", "longitudinal"):
        (tmp_path / f"{name}.yaml").write_text((rules.MAPPINGS / f"{name}.yaml").read_text())
    monkeypatch.setattr(rules, "MAPPINGS", tmp_path)
    rules.load_profile.cache_clear()
    try:
        engine = make_engine(test_key, "site")
        patient = {"resourceType": "Patient", "id": "p", "identifier": [{"system": SYSTEM, "value": "7992739871-3"}]}
        value = engine.deidentify(patient).resource["identifier"][0]["value"]
    finally:
        rules.load_profile.cache_clear()
    assert re.fullmatch(r"\d{10}-\d", value) and value != "7992739871-3"
    digits = value.replace("-", "")
    assert sum(int(d) if i % 2 == 0 else (2 * int(d) - 9 if int(d) > 4 else 2 * int(d))
               for i, d in enumerate(reversed(digits))) % 10 == 0  # the Luhn check still holds


def cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env={"DEID_ADAPTER_KEY_FILE": None, **(env or {})})


def test_reversal_only_through_the_vault_command_with_the_key_and_a_reason(test_key, test_key_file, other_key_file,
                                                                           tmp_path):
    audit_key = tmp_path / "audit.key"
    assert cli("keys", "init", "--purpose", "audit", str(audit_key)).exit_code == 0
    env = {"DEID_ADAPTER_AUDIT": f"sqlite:///{tmp_path / 'audit.sqlite'}", "DEID_ADAPTER_AUDIT_KEY_FILE": str(audit_key),
           "DEID_ADAPTER_ACTOR": "test-operator"}
    mrn = run_both(test_key, "longitudinal-fpe")["fhir"]["mrn"]
    reason = "IRB-2026-17 recontact"

    ok = cli("vault", "reverse-fpe", mrn, "--system", SYSTEM, "--reason", reason, "--key-file", str(test_key_file),
             env=env)
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout) == {"pseudonym": mrn, "namespace": f"identifier|{SYSTEM}", "key_id": test_key.key_id,
                                     "original": MRN}
    no_reason = cli("vault", "reverse-fpe", mrn, "--system", SYSTEM, "--key-file", str(test_key_file), env=env)
    assert no_reason.exit_code == 2 and MRN not in no_reason.output
    no_key = cli("vault", "reverse-fpe", mrn, "--system", SYSTEM, "--reason", reason, env=env)
    assert no_key.exit_code == 2 and MRN not in no_key.output
    missing = cli("vault", "reverse-fpe", mrn, "--system", SYSTEM, "--reason", reason,
                  "--key-file", str(tmp_path / "nope.key"), env=env)
    assert missing.exit_code == 2 and MRN not in missing.output
    wrong = cli("vault", "reverse-fpe", mrn, "--system", SYSTEM, "--reason", reason, "--key-file", str(other_key_file),
                env=env)
    assert wrong.exit_code == 0 and MRN not in wrong.output  # FF3-1 cannot tell: the key id in the answer can
    assert json.loads(wrong.stdout)["key_id"] != test_key.key_id

    trail = AuditTrail(env["DEID_ADAPTER_AUDIT"], [k for _, k, _ in keys.key_ring(audit_key, "audit")])
    records = list(trail.export())
    assert [r["operation"] for r in records] == ["reidentify", "reidentify-denied", "reidentify"]
    assert records[0]["detail"]["reason"] == reason and records[0]["detail"]["method"] == "fpe"
    assert records[0]["key_id"] == test_key.key_id
    assert MRN not in json.dumps(records)  # the trail names the pseudonym, never the original
    assert trail.verify().ok


@pytest.mark.parametrize("profile", ["longitudinal-fpe"])
def test_fpe_profiles_load_in_both_formats(profile):
    assert load_profile(profile).rules["date"].method == "shift"  # still longitudinal underneath
    cx = load_hl7_profile(profile).datatypes["CX"]
    assert cx.components[1].method == "fpe" and cx.components[5].method == "keep"
