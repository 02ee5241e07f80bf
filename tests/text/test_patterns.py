"""PatternDetector: shaped PHI (dates, phones, ids, ...) with offsets only, failing closed."""
from __future__ import annotations

import dataclasses

import pytest
import regex
from hypothesis import given, settings, strategies as st

from text_deid.detectors import patterns as patmod
from text_deid.detectors.patterns import PatternDetector, bounded_per_position, vin_check_digit_ok
from text_deid.spans import DetectorError, Span
from text_deid.detectors.patterns import _Scan

DET = PatternDetector()


def found(text: str) -> set[tuple[str, str]]:
    return {(text[s.start:s.end], s.category) for s in DET.detect(text, [])}


def cats_over(text: str, needle: str) -> set[str]:
    i = text.index(needle)
    j = i + len(needle)
    return {s.category for s in DET.detect(text, []) if s.start < j and i < s.end}


POSITIVES = [
    ("Seen on 2021-03-07 for f/u.", "2021-03-07", "DATE"),
    ("Seen on 3/7/2021 for f/u.", "3/7/2021", "DATE"),
    ("Seen on 03-07-21 for f/u.", "03-07-21", "DATE"),
    ("Seen on 03/07 for f/u.", "03/07", "DATE"),
    ("Admitted March 7, 2021.", "March 7, 2021", "DATE"),
    ("Admitted Mar 7th 2021.", "Mar 7th 2021", "DATE"),
    ("Admitted 7 Mar 2021.", "7 Mar 2021", "DATE"),
    ("Admitted 7th of March 2021.", "7th of March 2021", "DATE"),
    ("Admitted in March 2021.", "March 2021", "DATE"),
    ("ts=2021-03-07T10:00:00Z ok", "2021-03-07T10:00:00Z", "DATE"),
    ("operated on May 30th, 2022 (ID: 1)", "May 30th, 2022", "DATE"),
    ("seen Jan 15 '23 here", "Jan 15 '23", "DATE"),
    ("SSN: 123-45-6789.", "123-45-6789", "SOCIAL_SECURITY_NUMBER"),
    ("ssn 999-12-3456 (Synthea)", "999-12-3456", "SOCIAL_SECURITY_NUMBER"),
    ("Call 555-814-8772 today", "555-814-8772", "PHONE_NUMBER"),
    ("Phone: (415) 555-1234.", "(415) 555-1234", "PHONE_NUMBER"),
    ("intl +44 20 7946 0958 ok", "+44 20 7946 0958", "PHONE_NUMBER"),
    ("Fax: 650-123-4567.", "650-123-4567", "FAX_NUMBER"),
    ("F: 650-123-4567.", "650-123-4567", "FAX_NUMBER"),
    ("email john.doe@example.com now", "john.doe@example.com", "EMAIL_ADDRESS"),
    ("see https://portal.example.org/p?id=7.", "https://portal.example.org/p?id=7", "URL"),
    ("see www.example.com for info", "www.example.com", "URL"),
    ("host 192.168.1.20 down", "192.168.1.20", "IP_ADDRESS"),
    ("host fe80::1ff:fe23:4567:890a down", "fe80::1ff:fe23:4567:890a", "IP_ADDRESS"),
    ("MRN: 12345678", "12345678", "MEDICAL_RECORD_NUMBER"),
    ("MRN#1234567 x", "1234567", "MEDICAL_RECORD_NUMBER"),
    ("medical record number 55-1234", "55-1234", "MEDICAL_RECORD_NUMBER"),
    ("Her MRN is CG-123987.", "CG-123987", "MEDICAL_RECORD_NUMBER"),
    ("acct no. 998877", "998877", "ACCOUNT_NUMBER"),
    ("account 123456", "123456", "ACCOUNT_NUMBER"),
    ("member ID ABC123456", "ABC123456", "HEALTH_PLAN_BENEFICIARY_NUMBER"),
    ("policy # HP-987654", "HP-987654", "HEALTH_PLAN_BENEFICIARY_NUMBER"),
    ("license no. CLN-112233", "CLN-112233", "CERTIFICATE_LICENSE_NUMBER"),
    ("DEA AB1234563", "AB1234563", "CERTIFICATE_LICENSE_NUMBER"),
    ("NPI 1234567893", "1234567893", "UNIQUE_IDENTIFIER"),
    ("(ID: 987654321)", "987654321", "UNIQUE_IDENTIFIER"),
    ("patient ID 4455", "4455", "UNIQUE_IDENTIFIER"),
    ("card 4111 1111 1111 1111 on file", "4111 1111 1111 1111", "ACCOUNT_NUMBER"),
    ("car 1HGCM82633A004352 towed", "1HGCM82633A004352", "VEHICLE_IDENTIFIER"),
    ("Springfield, IL 62704 USA", "62704", "GEOGRAPHIC_LOCATION"),
    ("Austin, Texas 78701-1234.", "78701-1234", "GEOGRAPHIC_LOCATION"),
    ("zip: 02115", "02115", "GEOGRAPHIC_LOCATION"),
    ("lives at 123 Main St with wife", "123 Main St", "GEOGRAPHIC_LOCATION"),
    ("lives at 45 Oak Avenue Apt 4, Boston", "45 Oak Avenue Apt 4", "GEOGRAPHIC_LOCATION"),
    ("a 92-year-old woman", "92", "AGE_OVER_89"),
    ("age 95, frail", "95", "AGE_OVER_89"),
    ("95 yo F", "95", "AGE_OVER_89"),
    ("aged 101 years", "101", "AGE_OVER_89"),
]


@pytest.mark.parametrize("text,value,category", POSITIVES)
def test_positive(text, value, category):
    assert (value, category) in found(text), found(text)


NEGATIVES = [
    ("He was diagnosed back in 2021.", None),  # bare year
    ("Dose given at 10:30 today.", None),  # time alone
    ("Follow up on Monday.", None),  # weekday alone
    ("a 89-year-old man", None),  # age 89 is not PHI
    ("a 55-year-old male", None),
    ("patient ID 445", None),  # 3-digit identifier
    ("BP 120/80, HR 72", None),
    ("Pain 5/10 at rest", None),
    ("rates pain 7/10", None),
    ("Hgb 12.5, Cr 1.2, K 4.1", None),
    ("furosemide 10 mg PO daily", None),
    ("LOINC 8302-2 body height", None),
    ("SNOMED 22298006 myocardial infarction", None),
    ("take 1/2 tab daily", None),
    ("strength 5/5 bilaterally", None),
    ("patients may 2 weeks later improve", None),
]


@pytest.mark.parametrize("text,_", NEGATIVES)
def test_negative(text, _):
    assert found(text) == set()


@pytest.mark.parametrize("ssn", ["000-12-3456", "666-12-3456", "123-00-4567", "123-45-0000", "111-11-1111", "123-45 6789"])
def test_ssn_invalid_forms_rejected(ssn):
    assert "SOCIAL_SECURITY_NUMBER" not in {c for _, c in found(f"number {ssn} here")}


def test_ssn_sample_and_9xx_kept():
    # presidio rejects the published sample 123-45-6789; we keep it (must not leak). 9xx (ITIN/Synthea) kept.
    for ssn in ("123-45-6789", "987-65-4321", "999-44-1234"):
        assert (ssn, "SOCIAL_SECURITY_NUMBER") in found(f"number {ssn} here")


def test_luhn_card():
    assert ("4111111111111111", "ACCOUNT_NUMBER") in found("cc 4111111111111111 x")
    assert not any(c == "ACCOUNT_NUMBER" for _, c in found("cc 4111111111111112 x"))


def test_dea_checksum():
    assert ("AB1234563", "CERTIFICATE_LICENSE_NUMBER") in found("prescriber AB1234563 signed")
    assert found("prescriber AB1234567 signed") == set()


def test_vin_check_digit():
    assert vin_check_digit_ok("1HGCM82633A004352")
    assert not vin_check_digit_ok("1HGCM82643A004352")
    assert found("car 1HGCM82643A004352 towed") == set()


def test_labelled_value_only_and_offsets():
    text = "Pt seen 2023-01-05 (MRN: 12345678), phone 555-814-8772."
    spans = DET.detect(text, [])
    mrn = [s for s in spans if s.category == "MEDICAL_RECORD_NUMBER"]
    assert len(mrn) == 1 and text[mrn[0].start:mrn[0].end] == "12345678"
    assert spans == sorted(spans)
    for s in spans:
        assert isinstance(s, Span) and s.detector == "patterns" and 0 < s.confidence <= 1
        assert 0 <= s.start < s.end <= len(text)
    assert "text" not in {f.name for f in dataclasses.fields(Span)}


def test_bp_not_date_but_real_date_is():
    text = "BP 120/80 on 3/7/2021"
    assert cats_over(text, "120/80") == set()
    assert cats_over(text, "3/7/2021") == {"DATE"}


@pytest.mark.parametrize("text, date", [
    ("DOB:03/12/1980 per chart", "03/12/1980"),
    ("Date:2021-03-07", "2021-03-07"),
    ("dob:03/12/1980x", "03/12/1980"),
])
def test_a_date_right_after_a_labels_colon_is_a_date(text, date):
    assert cats_over(text, date) == {"DATE"}


@pytest.mark.parametrize("text", ["at 10:30-11-15", "seen 12:03/12/2020", "BP:120/80", "ratio:3/4", "K:3.5-5.1"])
def test_a_time_or_a_value_after_a_colon_is_no_date(text):
    assert "DATE" not in {category for _, category in found(text)}


def test_fail_closed_on_timeout(monkeypatch):
    secret = "John Smith SSN 123-45-6789 lives here"

    class Boom:
        def finditer(self, *a, **k):
            raise TimeoutError("regex timed out on " + secret)

        match = search = finditer

    det = PatternDetector()
    monkeypatch.setattr(det, "_ssn", Boom())
    with pytest.raises(DetectorError) as ei:
        det.detect(secret, [])
    msg = str(ei.value)
    assert msg.startswith("patterns:")
    assert "Smith" not in msg and "123-45" not in msg


def test_fail_closed_real_regex_timeout():
    det = PatternDetector(timeout=1e-9, timeout_per_mb=0.0)
    text = ("MRN 1234567 seen on March 3, 2021, phone 555-814-8772. " * 4000)
    with pytest.raises(DetectorError) as ei:
        det.detect(text, [])
    assert "MRN" not in str(ei.value) and "555" not in str(ei.value)


def test_non_string_input_fails_closed():
    with pytest.raises(DetectorError):
        DET.detect(None, [])  # type: ignore[arg-type]


def test_detector_protocol_shape():
    assert PatternDetector.name == "patterns"
    assert patmod.DETECTOR == "patterns"
    assert DET.detect("", []) == []


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789-/.:@ ()#+aAbMRNmarchJnSe,\n\t")) , max_size=200) | st.text(max_size=200))
def test_property_offsets_in_range(text):
    for s in DET.detect(text, []):
        assert 0 <= s.start < s.end <= len(text)


def test_unlabelled_long_numbers_are_identifiers_but_decimals_and_short_numbers_are_not():
    text = "Person seed: 8227062227814166433  value 1234567.891011 and 123456789 and 2.0123456789"
    spans = PatternDetector().detect(text)
    covered = {text[s.start:s.end]: s.category for s in spans}
    assert covered.get("8227062227814166433") == "UNIQUE_IDENTIFIER"
    assert "1234567.891011" not in covered and "0123456789" not in covered


@pytest.mark.parametrize("source, bounded", [
    (r"\d{1,4}[-/.]\d{1,2}", True),
    (r"\b(?:mrn|mr|med)", True),
    (r"[+*]\d\+", True),  # quantifier characters inside a class or escaped are not quantifiers
    (r"(?:\s|[:#=]){0,8}?x", True),
    (r"\d{10,}", False),
    (r"a\s+b", False),
    (r"a\s*b", False),
    (r"(?P<x>a)(?P=x)", False),
    (r"(?:a|(?R))", False),
])
def test_only_regexes_with_bounded_quantifiers_run_without_a_timeout(source, bounded):
    assert bounded_per_position(source) is bounded


def test_every_unbounded_detector_regex_keeps_its_timeout():
    import time

    det = PatternDetector()
    scan = _Scan("x", "x", time.monotonic() + 60, det._bounded)
    patterns = [v for v in vars(det).values() if isinstance(v, regex.Pattern)]
    unbounded = [p for p in patterns if not bounded_per_position(p.pattern)]
    assert unbounded and all(0 < scan.limit(p) <= 60 for p in unbounded)
    assert all(scan.limit(p) is None for p in patterns if p not in unbounded)
