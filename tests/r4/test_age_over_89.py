"""Safe Harbor (C) for a person aged 90 or more: no date of theirs keeps a year that tells the age."""
from __future__ import annotations

from fhir_transforms.r4.methods import DATA_ABSENT
from tests.conftest import make_engine

PATIENT_ID = "pat-94"
BIRTH = "1931-06-01"  # 94 on the fixed test day (2026-01-15); turned 90 in 2021


def _bundle(birth: str = BIRTH) -> dict:
    patient = {
        "resourceType": "Patient", "id": PATIENT_ID, "birthDate": birth,
        "address": [{"state": "MA", "period": {"start": birth}}],
    }
    encounters = [
        {"resourceType": "Encounter", "id": f"enc-{y}", "status": "finished",
         "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
         "subject": {"reference": f"Patient/{PATIENT_ID}"}, "period": {"start": f"{y}-03-04T10:00:00Z"}}
        for y in (1931, 1990, 2021, 2022, 2025)
    ]
    immunization = {
        "resourceType": "Immunization", "id": "imm", "status": "completed",
        "vaccineCode": {"coding": [{"system": "http://hl7.org/fhir/sid/cvx", "code": "140"}]},
        "patient": {"reference": f"Patient/{PATIENT_ID}"}, "occurrenceDateTime": "2001-10-01",
    }
    given = {
        "resourceType": "MedicationAdministration", "id": "given", "status": "completed",
        "medicationCodeableConcept": {"text": "aspirin"},
        "subject": {"reference": f"Patient/{PATIENT_ID}"}, "effectiveDateTime": "1999-05-05T08:00:00Z",
    }
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"resource": r} for r in [patient, *encounters, immunization, given]]}


def _by_type(out: dict) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for e in out["entry"]:
        found.setdefault(e["resource"]["resourceType"], []).append(e["resource"])
    return found


def test_a_94_year_olds_address_period_at_birth_loses_its_year(engine):
    patient = _by_type(engine.deidentify(_bundle()).resource)["Patient"][0]
    assert "birthDate" not in patient
    period = patient["address"][0]["period"]
    assert "start" not in period
    assert period["_start"]["extension"] == [{"url": DATA_ABSENT, "valueCode": "masked"}]
    assert "1931" not in str(patient)


def test_dates_through_the_year_they_turned_90_lose_their_year_later_ones_keep_it(engine):
    out = _by_type(engine.deidentify(_bundle()).resource)
    starts = [e["period"].get("start") for e in out["Encounter"]]
    assert starts == [None, None, None, "2022", "2025"]
    # a required choice (occurrence[x], effective[x]) stays present, as data-absent, in a type the models accept
    imm = out["Immunization"][0]
    assert "occurrenceDateTime" not in imm and imm["_occurrenceString"]["extension"][0]["url"] == DATA_ABSENT
    assert any(c["code"] == "AGGRED" for c in imm["meta"]["security"])
    given = out["MedicationAdministration"][0]
    assert "effectiveDateTime" not in given and given["effectivePeriod"]["_start"]["extension"][0]["url"] == DATA_ABSENT


def test_an_89_year_old_keeps_every_year(engine):
    out = _by_type(engine.deidentify(_bundle("1936-06-01")).resource)
    assert out["Patient"][0]["birthDate"] == "1936"
    assert out["Patient"][0]["address"][0]["period"]["start"] == "1936"
    assert [e["period"]["start"] for e in out["Encounter"]] == ["1931", "1990", "2021", "2022", "2025"]


def test_the_longitudinal_profile_removes_the_same_dates(test_key):
    out = _by_type(make_engine(test_key, profile="longitudinal").deidentify(_bundle()).resource)
    assert [("start" in e["period"]) for e in out["Encounter"]] == [False, False, False, True, True]
    assert "start" not in out["Patient"][0]["address"][0]["period"]


def _family(**born) -> dict:
    return {"resourceType": "FamilyMemberHistory", "id": "fmh", "status": "completed",
            "patient": {"reference": "Patient/p"},
            "relationship": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-RoleCode", "code": "FTH"}]},
            **born}


def test_a_relatives_birth_death_and_age_follow_the_same_rule(engine):
    out = engine.deidentify(_family(bornDate="1920", deceasedDate="2005-02-03")).resource
    assert "bornDate" not in out and "deceasedDate" not in out  # born 1920: 2005 is before they turned 90 (2010)
    assert "1920" not in str(out) and "2005" not in str(out)
    later = engine.deidentify(_family(bornDate="1920", deceasedDate="2012-02-03")).resource
    assert later["deceasedDate"] == "2012"
    young = engine.deidentify(_family(bornDate="1950", deceasedDate="2005-02-03")).resource
    assert young["bornDate"] == "1950" and young["deceasedDate"] == "2005"


def test_a_relatives_age_range_reaching_90_becomes_90_and_over(engine):
    age = {"system": "http://unitsofmeasure.org", "code": "a", "unit": "yr"}
    out = engine.deidentify(_family(ageRange={"low": {**age, "value": 85}, "high": {**age, "value": 95}})).resource
    assert out["ageRange"] == {"low": {"value": 90, "unit": "a", "system": "http://unitsofmeasure.org", "code": "a"}}
    kept = engine.deidentify(_family(ageRange={"low": {**age, "value": 60}, "high": {**age, "value": 70}})).resource
    assert kept["ageRange"]["high"]["value"] == 70
