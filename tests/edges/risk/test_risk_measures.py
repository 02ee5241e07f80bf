"""Risk measures on small constructed populations whose answers are computed by hand (adapter/risk/measures.py)."""
from __future__ import annotations

import base64

import pytest

from adapter.risk import measures as risk

# Three classes over (birth_year, gender): sizes 3, 2 and 1; n = 6, J = 3.
ROWS = [("1950", "F")] * 3 + [("1960", "M")] * 2 + [("1970", "F")]
SENSITIVE = [frozenset({"a"}), frozenset({"a"}), frozenset({"a", "b"}),  # class 1: a held by all three
             frozenset({"b"}), frozenset(),                              # class 2: b and "none"
             frozenset({"c"})]                                           # class 3: one value
TABLE = risk.Table(("birth_year", "gender"), tuple(ROWS), tuple(SENSITIVE))


def test_k_anonymity_and_class_sizes():
    assert risk.k_anonymity(ROWS) == 1
    assert risk.size_distribution(ROWS) == {1: 1, 2: 1, 3: 1}
    assert risk.class_sizes(ROWS) == [3, 3, 3, 2, 2, 1]
    assert risk.share_below_k(ROWS, 2) == pytest.approx(1 / 6)
    assert risk.share_below_k(ROWS, 3) == pytest.approx(3 / 6)
    assert risk.share_below_k(ROWS, 4) == 1.0
    assert risk.k_anonymity([("x",)] * 5) == 5


def test_prosecutor_risk_is_one_over_class_size():
    r = risk.risks(ROWS)
    assert r["prosecutor_max"] == 1.0  # the singleton
    assert r["prosecutor_avg"] == pytest.approx(3 / 6)  # J / n = mean of (1/3,1/3,1/3,1/2,1/2,1)
    # Without a population the release is the population: journalist = prosecutor, marketer = J / n.
    assert r["journalist_max"] == r["prosecutor_max"]
    assert r["journalist_avg"] == pytest.approx(0.5)
    assert r["marketer"] == pytest.approx(0.5)


def test_journalist_and_marketer_risk_with_a_sampled_population():
    # N = 12, so pi = 1/2 and F = (6, 4, 2) for f = (3, 2, 1).
    assert risk.population_sizes([3, 2, 1], 6, 12) == [6, 4, 2]
    r = risk.risks(ROWS, population=12)
    assert r["prosecutor_max"] == 1.0
    assert r["journalist_max"] == pytest.approx(1 / 2)
    assert r["journalist_avg"] == pytest.approx((3 / 6 + 2 / 4 + 1 / 2) / 6)
    assert r["marketer"] == pytest.approx(0.25)
    # F never falls below f, and a population no larger than the release means the release is the population.
    assert risk.population_sizes([5], 5, 6) == [6]
    assert risk.population_sizes([3, 1], 4, 4) == [3, 1]


def test_l_diversity_counts_distinct_values_and_homogeneity():
    ld = risk.l_diversity(ROWS, SENSITIVE)
    assert ld["l"] == 1  # class 3 has one value
    assert ld["max_confidence"] == 1.0  # every member of class 1 holds "a"
    assert ld["homogeneous_classes"] == 2  # classes 1 and 3
    assert ld["classes_below_2"] == 1
    diverse = risk.l_diversity([("x",)] * 4, [frozenset({"a"}), frozenset({"b"}), frozenset({"c"}), frozenset()])
    assert diverse == {"l": 4, "max_confidence": 0.25, "homogeneous_classes": 0, "classes_below_2": 0}


def test_analyze_reports_every_figure():
    figures = risk.analyze(TABLE, k=2)
    assert figures["patients"] == 6 and figures["equivalence_classes"] == 3
    assert figures["class_size_distribution"] == {"1": 1, "2": 1, "3": 1}
    assert figures["below_k_patients"] == 1
    assert figures["l_diversity"]["l"] == 1
    # Leaving gender out merges nothing here (birth years differ); leaving birth year out merges F's: 4 F + 2 M.
    assert figures["risk_by_quasi_identifier"]["gender"]["below_k_share_without"] == pytest.approx(1 / 6)
    assert figures["risk_by_quasi_identifier"]["birth_year"]["below_k_share_without"] == 0.0
    assert "l_diversity" not in risk.analyze(TABLE, k=2, sensitive="none")


def test_generalization_hierarchies():
    assert [fn("1953") for _, fn in risk.HIERARCHIES["birth_year"]] == ["1950-1954", "1950-1959", "1940-1959", "*"]
    assert risk.HIERARCHIES["birth_year"][0][1]("90+") == "90+"
    assert [fn("021") for _, fn in risk.HIERARCHIES["zip3"]] == ["02", "0", "*"]
    assert [fn(n) for n in ("0", "1", "3", "7", "12", "40") for fn in [risk.HIERARCHIES["encounters"][0][1]]] == \
        ["0", "1", "2-4", "5-9", "10-19", "20+"]
    assert risk.HIERARCHIES["death_year"][1][1]("2001") == "deceased"
    assert risk.HIERARCHIES["death_year"][1][1]("") == ""


def test_suggested_generalization_reaches_k():
    # Five women born 1950-1954: unique by year, one class of 5 in 5-year bands.
    table = risk.Table(("birth_year", "gender"), tuple((str(1950 + i), "female") for i in range(5)))
    s = risk.suggest_generalizations(table, 5)
    assert s["reached"] is True
    assert s["steps"] == [{"quasi_identifier": "birth_year", "to": "5-year bands", "k": 5, "below_k_share": 0.0,
                           "classes": 1}]
    assert s["levels"] == {"birth_year": "5-year bands", "gender": "as released"}
    assert risk.suggest_generalizations(table, 1) == {"target_k": 1, "reached": True, "steps": [],
                                                      "levels": {"birth_year": "as released", "gender": "as released"}}


def test_thresholds_parse_and_check():
    checks = risk.parse_thresholds(["k_anonymity>=5, prosecutor_max<=0.2", "residual_phi_chars_upper<=10"])
    assert [str(c) for c in checks] == ["k_anonymity >= 5", "prosecutor_max <= 0.2", "residual_phi_chars_upper <= 10"]
    results = risk.check(checks, risk.analyze(TABLE, k=2))
    assert [r["passed"] for r in results] == [False, False, False]
    assert results[2]["note"] == "not measured"  # no gold sample: the check fails closed
    passing = risk.check(risk.parse_thresholds(["k_anonymity>=1,prosecutor_avg<=0.5,l>=1"]), risk.analyze(TABLE, k=2))
    assert all(r["passed"] for r in passing)
    for bad in ("k_anonymity>5", "k=5", "bogus<=1"):
        with pytest.raises(ValueError):
            risk.parse_thresholds([bad])


def test_patient_row_reads_the_deidentified_forms():
    patient = {
        "resourceType": "Patient", "id": "p1", "gender": "female", "deceasedBoolean": True,
        "_birthDate": {"extension": [{"url": risk.AGE_OVER_89_URL, "valueString": "90+"}]},
        "address": [{"postalCode": "021", "state": "MA"}],
        "extension": [{"url": risk.RACE_URL, "extension": [
            {"url": "ombCategory", "valueCoding": {"code": "2106-3"}},
            {"url": "ombCategory", "valueCoding": {"code": "2028-9"}}, {"url": "text", "valueString": "x"}]}],
    }
    assert risk.patient_row(patient) == {"birth_year": "90+", "gender": "female", "zip3": "021",
                                         "race": "2028-9+2106-3", "ethnicity": "", "death_year": "deceased",
                                         "encounters": "0"}
    assert risk.patient_row({"birthDate": "1961", "deceasedDateTime": "2020"})["death_year"] == "2020"


def test_narrative_characters():
    note = base64.b64encode("twelve chars".encode()).decode()
    doc = {"resourceType": "DocumentReference", "text": {"div": "<div xmlns='x'><p>a &amp; b</p></div>"},
           "description": "four", "note": [{"text": "abc"}],
           "content": [{"attachment": {"contentType": "text/plain", "data": note}},
                       {"attachment": {"contentType": "image/png", "data": "AAAA"}}],
           "contained": [{"resourceType": "Basic", "text": {"div": "<div>not counted here</div>"}}]}
    assert risk.narrative_chars(doc) == len("a & b") + 4 + 3 + 12


def test_hl7_rows_from_a_folder(tmp_path):
    msg = ("MSH|^~\\&|A|B|C|D|2021|deid/k-abc/safe-harbor|ADT^A01|1|P|2.5\r"
           "PID|1||p-one^^^^MR||^^||1950|F||2106-3^White^HL70005|^^^MA^021^^|||||||||||N^Not Hispanic^HL70189|||||||2019\r"
           "PV1|1|I||||||||||||||||||v1^^^^VN\rDG1|1|I9|250.0^Diabetes^I9\r"
           "OBX|1|TX|note^Note^L||twelve chars||||||F\rNTE|1||abcd\r")
    (tmp_path / "a.hl7").write_text(msg)
    (tmp_path / "b.hl7").write_text(msg.replace("v1^^^^VN", "v2^^^^VN"))
    release = risk.read_release(tmp_path)
    assert release.format == "hl7v2" and release.items == 2
    assert release.rows == {"p-one": {"birth_year": "1950", "gender": "F", "zip3": "021", "race": "2106-3",
                                      "ethnicity": "N", "death_year": "2019", "encounters": "2"}}
    assert release.sensitive["p-one"] == {"250.0"}
    assert release.narrative_chars == 2 * (12 + 4)
    assert dict(release.key_ids) == {"k-abc": 2} and dict(release.profiles) == {"safe-harbor": 2}


def test_an_empty_folder_is_refused(tmp_path):
    with pytest.raises(risk.ReleaseError):
        risk.read_release(tmp_path)
