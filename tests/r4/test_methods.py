"""The rule methods substitute, perturb, generalize and encrypt, date-shift offsets and scopes, entry rules and
marking, on FHIR: golden files (tests/cases/methods/fhir/<method>.yaml, a site's profile extending safe-harbor,
applied to bundle.json → <method>.expected.json under the fixed test keys and day), and what must hold besides.

To regenerate after an intended change: DEID_UPDATE_GOLDEN=1 python -m pytest tests/r4/test_methods.py."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fhir_transforms import rules, values
from fhir_transforms.encryption import ValueCipher
from fhir_transforms.errors import InputError
from fhir_transforms.fpe import FpeFormat
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier, validate
from fhir_transforms.rules import ProfileError, load_profile
from tests.conftest import CASES, FIXED_TODAY
from text_deid.stack import build_stack

METHOD_CASES = CASES / "methods" / "fhir"
BUNDLE = METHOD_CASES / "bundle.json"
VAULT_SECRET = bytes(range(64, 96))  # a fixed, public test vault key: the encrypt golden file is made with it
VAULT_KEY = Key(key_id_for(VAULT_SECRET, "vault"), VAULT_SECRET)
GOLDEN = sorted(METHOD_CASES.glob("*.yaml"))
SECURITY = "http://terminology.hl7.org/CodeSystem/v3-ObservationValue"


def site_profile(tmp_path: Path, monkeypatch, body: str, name: str = "site"):
    """A site's profile extending safe-harbor, read by the same loader as the packaged ones."""
    folder = tmp_path / "profiles"
    folder.mkdir(exist_ok=True)
    (folder / "safe-harbor.yaml").write_text((rules.MAPPINGS / "safe-harbor.yaml").read_text())
    (folder / f"{name}.yaml").write_text(f"extends: safe-harbor\nprofile: {name}\nversion: '1'\n" + body)
    monkeypatch.setattr(rules, "MAPPINGS", folder)
    rules.profile_names.cache_clear()
    load_profile.cache_clear()
    try:
        return load_profile(name)
    finally:
        load_profile.cache_clear()
        rules.profile_names.cache_clear()


def engine_for(profile, key: Key, vault: bool = True) -> Deidentifier:
    pseudo = Pseudonymizer(key)
    if vault:
        pseudo.use_vault_key(VAULT_KEY)
    return Deidentifier(profile, pseudo, build_stack("patterns"), lambda: FIXED_TODAY)


def bundle() -> dict:
    return json.loads(BUNDLE.read_text())


def entry(out: dict, rtype: str, n: int = 0) -> dict:
    return [e["resource"] for e in out["entry"] if e["resource"]["resourceType"] == rtype][n]


def labels(resource: dict) -> set[str]:
    return {s["code"] for s in resource.get("meta", {}).get("security", []) if s["system"] == SECURITY}


@pytest.mark.parametrize("case", GOLDEN, ids=lambda p: p.stem)
def test_golden(case: Path, test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, case.read_text(), case.stem)
    out = engine_for(profile, test_key).deidentify(bundle(), "bundle").resource
    expected = case.with_suffix(".expected.json")
    if os.environ.get("DEID_UPDATE_GOLDEN"):
        expected.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    assert out == json.loads(expected.read_text())


def test_substitute_gives_surrogates_of_the_same_kind_and_a_fixed_value(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "substitute.yaml").read_text())
    patient = entry(engine_for(profile, test_key).deidentify(bundle()).resource, "Patient")
    name = patient["name"][0]
    assert name["use"] == "official" and name["family"] != "Kowalczyk" and name["given"] != ["Marta"]
    phone, email = patient["telecom"]
    assert phone["system"] == "phone" and phone["value"] != "555-867-5309"
    assert [c.isdigit() for c in phone["value"]] == [c.isdigit() for c in "555-867-5309"]  # a phone's shape
    assert email["value"].endswith("@example.org")
    assert patient["address"][0]["city"] == "Anytown"
    assert {"PSEUDED", "REDACTED"} <= labels(patient)
    again = entry(engine_for(profile, test_key).deidentify(bundle()).resource, "Patient")
    assert again["name"] == patient["name"]  # keyed: the same surrogate every run


def test_perturb_is_deterministic_by_key_within_its_range_and_keeps_90_plus(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "perturb.yaml").read_text())
    out = engine_for(profile, test_key).deidentify(bundle()).resource
    weight = entry(out, "Observation")["valueQuantity"]
    assert 72.4 * 0.9 <= weight["value"] <= 72.4 * 1.1 and weight["value"] != 72.4
    assert round(weight["value"], 1) == weight["value"]
    history = entry(out, "FamilyMemberHistory")
    assert 85 <= history["ageAge"]["value"] <= 90 and isinstance(history["ageAge"]["value"], int)
    assert history["deceasedAge"]["value"] == 90 and history["deceasedAge"]["comparator"] == ">="  # 93: still 90+
    assert "ABSTRED" in labels(entry(out, "Observation"))
    assert engine_for(profile, test_key).deidentify(bundle()).resource == out
    other = Key(key_id_for(bytes(range(100, 132))), bytes(range(100, 132)))
    assert entry(engine_for(profile, other).deidentify(bundle()).resource, "Observation")["valueQuantity"] != weight


def test_perturb_never_leaves_its_range(test_key):
    pseudo = Pseudonymizer(test_key)
    for n in range(200):
        fixed = values.perturb(pseudo, f"p{n}", 50, {"span": 4})
        assert 46 <= fixed <= 54 and isinstance(fixed, int)
        prop = values.perturb(pseudo, f"p{n}", 200.0, {"span": 0.25, "range": "proportional", "round_to": 2})
        assert 150 <= prop <= 250


def test_perturb_near_90_becomes_90_plus_when_the_noise_reaches_it(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, "rules:\n  FamilyMemberHistory.ageAge: {method: perturb, span: 30}\n")
    seen = set()
    for age in range(70, 90):
        doc = bundle()
        entry(doc, "FamilyMemberHistory")["ageAge"]["value"] = age
        got = entry(engine_for(profile, test_key).deidentify(doc).resource, "FamilyMemberHistory")["ageAge"]
        assert got["value"] < 90 or (got["value"] == 90 and got["comparator"] == ">=")
        seen.add(got.get("comparator"))
    assert ">=" in seen and None in seen


def test_generalize_cases_and_otherwise(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "generalize.yaml").read_text())
    out = engine_for(profile, test_key).deidentify(bundle()).resource
    assert entry(out, "Patient")["birthDate"] == "1960"
    assert entry(out, "Observation")["valueQuantity"]["value"] == 70
    assert entry(out, "Observation", 1)["valueCodeableConcept"]["coding"][0]["code"] == "77176002"
    assert entry(out, "Observation")["code"]["coding"][0]["code"] == "29463-7"  # otherwise: keep
    doc = bundle()
    entry(doc, "Observation")["valueQuantity"]["value"] = 120
    heavy = entry(engine_for(profile, test_key).deidentify(doc).resource, "Observation")
    assert "valueQuantity" not in heavy and "REDACTED" in labels(heavy)  # no case: removed


def test_encrypt_round_trips_with_the_vault_key(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "encrypt.yaml").read_text())
    patient = entry(engine_for(profile, test_key).deidentify(bundle()).resource, "Patient")
    mrn, city = patient["identifier"][0]["value"], patient["address"][0]["city"]
    assert mrn != "MRN00423917" and len(mrn) == len("MRN00423917") and mrn.startswith("MRN")
    assert city.startswith("enc1.") and "MASKED" in labels(patient)
    cipher = ValueCipher(VAULT_KEY)
    assert cipher.decrypt(city) == "Springfield"
    assert cipher.decrypt(mrn, FpeFormat(alphabet=FpeFormat.from_options({"alphabet": "alphanumeric"}).alphabet,
                                         keep_prefix=3)) == "MRN00423917"
    with pytest.raises(ValueError):
        ValueCipher(Key("k-other", bytes(range(1, 33)))).decrypt(city)


def test_encrypt_without_the_vault_key_is_a_clear_error(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "encrypt.yaml").read_text())
    with pytest.raises(InputError, match="vault key"):
        engine_for(profile, test_key, vault=False).deidentify(bundle())


def test_a_fixed_offset_shifts_every_date_by_it_birth_dates_included(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "shift.yaml").read_text())
    out = engine_for(profile, test_key).deidentify(bundle()).resource
    assert entry(out, "Patient")["birthDate"] == "1961-03-18"
    assert entry(out, "Observation")["effectiveDateTime"] == "2025-01-31T10:15:00+01:00"
    assert entry(out, "Composition")["date"] == "2025-01-31"


@pytest.mark.parametrize("scope", ["patient", "record", "release"])
def test_shift_scope(scope, test_key, tmp_path, monkeypatch):
    """patient: one offset per patient, the same in every record; record: one per record, so two records of a
    patient differ; release: one for everything (per release name)."""
    profile = site_profile(tmp_path, monkeypatch, f"rules:\n  date: {{method: shift, scope: {scope}}}\n"
                           f"  dateTime: {{method: shift, scope: {scope}, release: r1}}\n")
    engine = engine_for(profile, test_key)

    def dates(doc_id: str, patient_id: str) -> tuple[str, str]:
        doc = bundle()
        doc["id"] = doc_id
        for e in doc["entry"]:
            e["resource"].pop("subject", None) if e["resource"]["resourceType"] != "Patient" else None
        entry(doc, "Patient")["id"] = patient_id
        entry(doc, "Patient")["birthDate"] = "1990-01-01"
        out = engine.deidentify(doc).resource
        return entry(out, "Patient")["birthDate"], entry(out, "Composition")["date"]

    same_patient_other_record = dates("b1", "p1") == dates("b2", "p1")
    other_patient_same_record = dates("b1", "p1") == dates("b1", "p2")
    assert same_patient_other_record == (scope in ("patient", "release"))
    assert other_patient_same_record == (scope in ("record", "release"))


def test_entry_rules_remove_entries_and_the_references_to_them(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "entries.yaml").read_text())
    out = engine_for(profile, test_key).deidentify(bundle()).resource
    types = [e["resource"]["resourceType"] for e in out["entry"]]
    assert "Provenance" not in types and "DocumentReference" not in types and len(types) == 6
    composition = entry(out, "Composition")
    assert composition["author"] == [{"extension": [{"url": "http://hl7.org/fhir/StructureDefinition/data-absent-reason",
                                                     "valueCode": "masked"}]}]  # required: present, and why empty
    assert len(composition["section"][0]["entry"]) == 1
    urls = {e["fullUrl"] for e in out["entry"]}
    refs = [r for r in json.dumps(out).split('"reference": "')[1:]]
    assert all(r.split('"')[0] in urls for r in refs)  # every reference resolves
    assert "REDACTED" in labels(out) and "REDACTED" in labels(composition)
    validate(out, "out")  # the R4B models accept it


def test_an_entry_rule_by_code_leaves_other_types_of_document(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, "entries:\n  remove:\n    - {resource: DocumentReference, "
                           "element: type, code: '34108-1'}\n")
    out = engine_for(profile, test_key).deidentify(bundle()).resource
    assert len(out["entry"]) == 8 and "REDACTED" not in labels(out)


def test_marking_records_what_was_done_on_each_element(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, (METHOD_CASES / "marking.yaml").read_text())
    out = engine_for(profile, test_key).deidentify(bundle()).resource
    patient = entry(out, "Patient")
    marks = {(x["url"].rsplit("/", 1)[-1], x.get("valueCode") or x["valueCoding"]["code"])
             for x in patient["name"][0]["extension"]}
    assert marks == {("extension-inline-sec-label", "PSEUDED"), ("deid-method", "substitute")}
    assert {x.get("valueCode") for x in patient["_birthDate"]["extension"]} >= {"generalize"}
    assert {x.get("valueCode") for x in entry(out, "Observation")["valueQuantity"]["extension"]} >= {"perturb"}
    assert "extension" not in entry(out, "Composition").get("subject", {})  # rules without marking: none


def test_marking_for_the_whole_profile_keeps_the_bundle_valid(test_key, tmp_path, monkeypatch):
    profile = site_profile(tmp_path, monkeypatch, "marking: true\n")
    out = engine_for(profile, test_key).deidentify(bundle()).resource  # validated on the way out
    assert "_birthDate" in entry(out, "Patient") and "_reference" in entry(out, "Observation")["subject"]


@pytest.mark.parametrize("body, message", [
    ("rules:\n  HumanName: {method: substitute}\n", "either value"),
    ("rules:\n  HumanName: {method: substitute, kind: pet}\n", "kind is one of"),
    ("rules:\n  Quantity: {method: perturb}\n", "span"),
    ("rules:\n  Quantity: {method: perturb, span: 1, rounding: 2}\n", "unknown setting 'rounding'"),
    ("rules:\n  Quantity: {method: perturb, span: '5'}\n", "span is a number"),
    ("rules:\n  code: {method: generalize, cases: [{to: x}]}\n", "case 1"),
    ("rules:\n  code: {method: generalize, cases: [{value: a, to: b}], otherwise: drop}\n", "otherwise is one of"),
    ("rules:\n  string: {method: encrypt, format: rot13}\n", "format is one of"),
    ("rules:\n  string: {method: encrypt, alphabet: digits}\n", "go with format: fpe"),
    ("rules:\n  date: {method: shift, offset_days: 1.5}\n", "offset_days is an integer"),
    ("rules:\n  date: {method: shift, scope: visit}\n", "scope is one of"),
    ("rules:\n  date: {method: shift, offset_days: 3, scope: record}\n", "not both"),
    ("rules:\n  date: {method: year, marking: 'yes'}\n", "marking is a boolean"),
    ("entries:\n  remove: [{resource: Provenance, code: x}]\n", "entry rule"),
    ("marking: 1\n", "marking: true or false"),
])
def test_bad_settings_are_refused_when_the_profile_loads(body, message, tmp_path, monkeypatch):
    with pytest.raises(ProfileError, match=message):
        site_profile(tmp_path, monkeypatch, body)
