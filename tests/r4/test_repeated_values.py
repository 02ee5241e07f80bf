"""A record rewrites a value it has seen before (a reference, a coding's display; a date, within its patient's
resources) from the outcome it had the first time (fhir_transforms/r4/walker.py, methods.reused_by): the output
must be what applying the rule to every occurrence gives, which is what the walk does when each pseudonym issued
is reported (no reuse)."""
from __future__ import annotations

import json

import pytest

from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.rules import load_profile
from tests.conftest import DATA, FIXED_TODAY
from text_deid.stack import build_stack

BUNDLES = sorted((DATA / "fhir" / "synthea-bundles").glob("*.json"))
PRACTITIONER = "urn:uuid:5b8e2e8c-6a0c-4a31-9a55-0d7a2f5d4c11"
PATIENT = "urn:uuid:0f3c3a0e-1d1b-4f59-9a0d-6f2b1d9a7e42"


def engine(key, reported: list | None = None, profile: str = "safe-harbor") -> Deidentifier:
    on_issue = None if reported is None else (lambda *issued: reported.append(issued[1]))
    return Deidentifier(load_profile(profile), Pseudonymizer(key, on_issue=on_issue), build_stack("patterns"),
                        lambda: FIXED_TODAY, validate=False)


def observation(n: int) -> dict:
    """An Observation without an id: its only pseudonyms are its references, so its labels come from them."""
    return {"resourceType": "Observation", "status": "final",
            "code": {"coding": [{"system": "http://loinc.org", "code": "8302-2", "display": "Body Height"}]},
            "subject": {"reference": PATIENT},
            # Observation.performer may point at people or organizations: only the reference tells which
            "performer": [{"reference": PRACTITIONER, "display": "Dr. Quentin Smithers"}],
            "valueQuantity": {"value": 170 + n, "unit": "cm"}}


def repeated() -> dict:
    return {"resourceType": "Bundle", "type": "collection", "entry": [
        {"fullUrl": PATIENT, "resource": {"resourceType": "Patient", "id": "0f3c3a0e-1d1b-4f59-9a0d-6f2b1d9a7e42",
                                          "name": [{"family": "Doe", "given": ["Ann"]}]}},
        {"fullUrl": PRACTITIONER, "resource": {"resourceType": "Practitioner",
                                               "id": "5b8e2e8c-6a0c-4a31-9a55-0d7a2f5d4c11"}},
        *({"resource": observation(n)} for n in range(3))]}


def labels(resource: dict) -> set[str]:
    return {s["code"] for s in resource.get("meta", {}).get("security", [])}


def test_each_occurrence_of_a_repeated_reference_gets_the_first_ones_outcome(test_key):
    out = engine(test_key).deidentify(repeated()).resource
    observations = [e["resource"] for e in out["entry"][2:]]
    assert len({json.dumps(o["subject"]) for o in observations}) == 1
    for o in observations:
        assert "PSEUDED" in labels(o)  # a label the first occurrence gave is given again, resource by resource
        # the display of a reference to a Practitioner is a name, however often the reference was seen before
        assert "Smithers" not in json.dumps(o["performer"])
    assert out == engine(test_key, reported=[]).deidentify(repeated()).resource


def test_each_pseudonym_issued_is_still_reported_when_values_repeat(test_key):
    reported: list = []
    engine(test_key, reported).deidentify(repeated())
    # three Observations point at the patient and the practitioner; the entries' fullUrls and ids once each
    assert reported.count("0f3c3a0e-1d1b-4f59-9a0d-6f2b1d9a7e42") == 3 + 2
    assert reported.count("5b8e2e8c-6a0c-4a31-9a55-0d7a2f5d4c11") == 3 + 2


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.stem)
def test_reusing_outcomes_gives_the_same_bytes_as_applying_every_rule(path, test_key):
    text = path.read_text()
    reused = engine(test_key).deidentify(json.loads(text), consume=True)
    applied = engine(test_key, reported=[]).deidentify(json.loads(text), consume=True)
    assert json.dumps(reused.resource) == json.dumps(applied.resource)
    assert reused.findings == applied.findings


DAY = "2019-03-04"


def dated(patient: str, rtype: str = "Encounter", **more) -> dict:
    status = {"Encounter": "finished", "Observation": "final"}.get(rtype, "completed")
    return {"resourceType": rtype, "status": status,
            **({"class": {"code": "AMB"}} if rtype == "Encounter" else {"code": {"text": "Body Height"}}),
            ("subject" if rtype != "FamilyMemberHistory" else "patient"): {"reference": f"Patient/{patient}"},
            **more}


def two_patients(old_birth: str) -> dict:
    """The same day in resources of two patients, the first born `old_birth`, the other 40."""
    patients = [{"resourceType": "Patient", "id": "old", "birthDate": old_birth},
                {"resourceType": "Patient", "id": "young", "birthDate": "1985-06-01"}]
    resources = [dated(p, period={"start": DAY, "end": DAY}) for p in ("young", "old", "young", "old")]
    resources += [dated(p, "Observation", effectiveDateTime=DAY, issued=DAY + "T10:00:00Z") for p in ("young", "old")]
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in patients + resources]}


@pytest.mark.parametrize("profile", ["safe-harbor", "longitudinal"])
@pytest.mark.parametrize("old_birth", ["1935-01-01", "1950-01-01"], ids=["aged-91", "aged-76"])
def test_a_repeated_date_is_ruled_for_each_patient_as_if_it_were_applied_every_time(profile, old_birth, test_key):
    reused = engine(test_key, profile=profile).deidentify(two_patients(old_birth)).resource
    assert reused == engine(test_key, reported=[], profile=profile).deidentify(two_patients(old_birth)).resource
    periods = [(e["resource"]["period"].get("start"), e["resource"]["period"].get("end")) for e in reused["entry"][2:6]]
    young, old = periods[0], periods[1]
    assert periods == [young, old, young, old]  # the same day comes out the same for one patient
    if old_birth == "1935-01-01":  # 2019 is before the year they turned 90 (2025): it would tell the age
        assert old == (None, None) and young[0] is not None  # masked for the one aged 90+, on every occurrence
    elif profile == "longitudinal":
        assert old != young  # each patient's own shift
    else:
        assert old == young == ("2019", "2019")


def test_a_relatives_dates_beside_the_patients_own_are_each_ruled_by_whose_they_are(test_key):
    """A FamilyMemberHistory of a relative aged 90+ (born 1920: 90 in 2010): a day of the relative's (deceasedDate)
    is masked; the same day as the record's own date, or in the patient's resources, is not."""
    day = "2005-02-03"
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in [
        {"resourceType": "Patient", "id": "p", "birthDate": "1980-01-01"},
        dated("p", period={"start": day}),
        dated("p", "FamilyMemberHistory", bornDate="1920", date=day, deceasedDate=day,
              relationship={"coding": [{"code": "FTH"}]}),
        dated("p", period={"start": day})]]}
    out = engine(test_key).deidentify(bundle).resource
    assert out == engine(test_key, reported=[]).deidentify(bundle).resource
    family = out["entry"][2]["resource"]
    assert "deceasedDate" not in family and family["date"] == "2005"
    assert [out["entry"][i]["resource"]["period"]["start"] for i in (1, 3)] == ["2005", "2005"]


def test_the_same_display_is_ruled_by_what_each_reference_points_at(test_key):
    """A Reference.display's outcome is reused only for the same reference (and type) at the same element:
    one text on references to an Organization, to a Practitioner, and to what only `type` names."""
    org, doc = "urn:uuid:11111111-2222-4333-8444-555555555555", "urn:uuid:66666666-7777-4888-9999-000000000000"
    name = "Dr. Quentin Smithers"

    def claim(n: int, provider: dict) -> dict:
        return {"resourceType": "Claim", "status": "active", "use": "claim", "created": "2020-01-01",
                "type": {"text": "professional"}, "priority": {"text": "normal"},
                "patient": {"reference": PATIENT}, "provider": provider, "insurance": [], "id": f"c{n}"}

    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [
        {"fullUrl": PATIENT, "resource": {"resourceType": "Patient", "id": PATIENT[9:]}},
        {"fullUrl": org, "resource": {"resourceType": "Organization", "id": org[9:], "name": name}},
        {"fullUrl": doc, "resource": {"resourceType": "Practitioner", "id": doc[9:]}},
        *({"resource": claim(n, provider)} for n, provider in enumerate([
            {"reference": org, "display": name}, {"reference": doc, "display": name},
            {"reference": org, "display": name}, {"type": "Practitioner", "display": name},
            {"reference": doc, "display": name}, {"type": "Organization", "display": name}]))]}
    out = engine(test_key).deidentify(bundle).resource
    assert out == engine(test_key, reported=[]).deidentify(bundle).resource
    displays = [e["resource"]["provider"].get("display") for e in out["entry"][3:]]
    # a person's display is a name, removed (and known: in a facility's display, a term, it is masked)
    assert displays == ["Dr. [NAME]", None, "Dr. [NAME]", None, None, "Dr. [NAME]"]
