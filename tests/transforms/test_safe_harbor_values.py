"""Table-driven edge cases for the value transforms: ZIP, dates, ages (with an injected clock)."""
from datetime import date

import pytest

from fhir_transforms import dates, zipcodes
from tests.conftest import make_engine


@pytest.mark.parametrize("value,expected", [
    ("01801", "018"),
    ("01801-1234", "018"),
    ("018011234", "018"),
    ("03601", "000"),  # restricted prefix 036
    ("89301", "000"),  # restricted prefix 893
    ("20301", "000"),
    ("20401", "204"),  # not on the HHS 2000 list
    ("K1A 0B1", None),  # not a US ZIP: removed
    ("123", None),
])
def test_zip3(value, expected):
    assert zipcodes.zip3(value) == expected


@pytest.mark.parametrize("value,expected", [
    ("1991", "1991"), ("1991-07", "1991"), ("1991-07-08", "1991"),
    ("1991-07-08T01:39:26+00:00", "1991"), ("2024-02-29T23:59:59.123-05:00", "2024"),
])
def test_year_only(value, expected):
    assert dates.year_only(value) == expected


@pytest.mark.parametrize("value,days,expected", [
    ("2021-03-07", 10, "2021-03-17"),
    ("2024-02-28", 1, "2024-02-29"),  # leap day
    ("2024-02-29", 365, "2025-02-28"),
    ("2021-12-31T23:59:59+02:00", 1, "2022-01-01T23:59:59+02:00"),  # time and zone kept
    ("2021-03-07T10:00:00.123Z", -7, "2021-02-28T10:00:00.123Z"),
    ("2021-03", 30, "2021-04"),  # month precision kept
    ("2021", -200, "2020"),  # year precision kept
])
def test_shift_keeps_precision_and_zone(value, days, expected):
    assert dates.shift(value, days) == expected


@pytest.mark.parametrize("birth,today,age", [
    ("1936-01-16", date(2026, 1, 15), 89),
    ("1936-01-15", date(2026, 1, 15), 90),
    ("1936", date(2026, 1, 15), 90),  # a coarse date counts from its earliest day
    ("1936-02", date(2026, 1, 15), 89),
    ("1936-02-29", date(2026, 2, 28), 89),
])
def test_age_in_years(birth, today, age):
    assert dates.age_in_years(birth, today) == age


@pytest.mark.parametrize("birth,keeps_year", [("1936-01-16", True), ("1936-01-15", False), ("1920-06-01", False)])
def test_birth_dates_over_89_become_90_plus(test_key, birth, keeps_year):
    engine = make_engine(test_key, today=date(2026, 1, 15))
    out = engine.deidentify({"resourceType": "Patient", "id": "p1", "birthDate": birth}).resource
    if keeps_year:
        assert out["birthDate"] == "1936"
    else:
        assert "birthDate" not in out
        exts = {e["url"]: e for e in out["_birthDate"]["extension"]}
        assert exts["http://deid-adapter.org/fhir/StructureDefinition/age-over-89"]["valueString"] == "90+"


@pytest.mark.parametrize("value,unit,expected_value,comparator", [
    (89, "a", 89, None), (90, "a", 90, ">="), (104, "a", 90, ">="), (1200, "mo", 90, ">="), (1000, "mo", 1000, None),
])
def test_ages_over_89(test_key, value, unit, expected_value, comparator):
    engine = make_engine(test_key)
    cond = {"resourceType": "Condition", "id": "c1", "subject": {"reference": "Patient/p1"},
            "onsetAge": {"value": value, "unit": unit, "system": "http://unitsofmeasure.org", "code": unit}}
    out = engine.deidentify(cond).resource
    assert out["onsetAge"]["value"] == expected_value
    assert out["onsetAge"].get("comparator") == comparator


def test_instants_cannot_hold_a_year_so_optional_ones_are_removed_and_required_ones_floored(test_key):
    engine = make_engine(test_key)
    prov = {"resourceType": "Provenance", "id": "x", "target": [{"reference": "Patient/p1"}],
            "recorded": "2015-02-07T13:28:17.239+02:00", "agent": [{"who": {"reference": "Practitioner/d1"}}],
            "meta": {"lastUpdated": "2015-02-07T13:28:17.239+02:00"}}
    out = engine.deidentify(prov).resource
    assert out["recorded"] == "2015-01-01T00:00:00Z"
    assert "lastUpdated" not in out["meta"]


def test_longitudinal_shifts_every_resource_of_a_patient_by_one_offset(test_key):
    engine = make_engine(test_key, profile="longitudinal")
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [
        {"fullUrl": "urn:uuid:11111111-1111-4111-8111-111111111111",
         "resource": {"resourceType": "Patient", "id": "11111111-1111-4111-8111-111111111111", "birthDate": "1980-05-01"}},
        {"resource": {"resourceType": "Encounter", "id": "e1", "status": "finished",
                      "class": {"code": "AMB"}, "subject": {"reference": "urn:uuid:11111111-1111-4111-8111-111111111111"},
                      "period": {"start": "2020-05-01T10:00:00-04:00", "end": "2020-05-03T10:00:00-04:00"}}},
    ]}
    out = engine.deidentify(bundle).resource
    birth = date.fromisoformat(out["entry"][0]["resource"]["birthDate"])
    start = out["entry"][1]["resource"]["period"]["start"]
    assert start.endswith("T10:00:00-04:00")  # time and zone kept
    assert (date.fromisoformat(start[:10]) - birth).days == (date(2020, 5, 1) - date(1980, 5, 1)).days
    assert out["entry"][0]["resource"]["birthDate"] != "1980-05-01"
