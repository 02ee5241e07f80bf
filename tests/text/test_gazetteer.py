"""Gazetteer detector: hand-written cases with exact offsets."""
import pytest

from text_deid.detectors.gazetteer import GazetteerDetector

NAME, PLACE = "NAME", "GEOGRAPHIC_LOCATION"


@pytest.fixture(scope="module")
def gazetteer():
    return GazetteerDetector()


def found(detector, text):
    return [(s.start, s.end, s.category) for s in detector.detect(text, [])]


@pytest.mark.parametrize("text, expected", [
    ("seen by Dr. John L. at Mt. Sinai on Feb 21", [(8, 19, NAME), (23, 32, PLACE)]),
    ("a 50-year-old woman, Anna S., was seen", [(21, 28, NAME)]),
    ("pt name Bob Williams, tx'd at St. Luke's Hospital today", [(8, 20, NAME), (30, 49, PLACE)]),
    ("Mr. D. Jones was seen", [(0, 12, NAME)]),
    ("patient JOHN SMITH admitted", [(8, 18, NAME)]),
    ("admitted to Johns Hopkins Hospital, Baltimore, MD for CABG", [(12, 49, PLACE)]),
    ("seen at our Dallas clinic, then in Austin, TX", [(12, 25, PLACE), (35, 45, PLACE)]),
    ("operated at St. Vincent's on May 30th", [(12, 25, PLACE)]),
    ("Mayo Clinic in Rochester, MN on July 20th", [(0, 28, PLACE)]),
    ("transferred to 4 West overnight", [(15, 21, PLACE)]),
    ("Jack B. and Lily A. are siblings", [(0, 7, NAME), (12, 19, NAME)]),
])
def test_exact_offsets(gazetteer, text, expected):
    assert found(gazetteer, text) == expected


@pytest.mark.parametrize("text", [
    "Will the patient hope to go home in May?",
    "Bill the insurer for the visit; grace period applies.",
    "Recommendations from Mayo Clinic for chronic gout.",
    "Latest treatment for a 70-year-old Hispanic male with COPD.",
    "Is the Wells score useful in a 60-year-old woman?",
])
def test_no_span_without_evidence(gazetteer, text):
    assert found(gazetteer, text) == []


def test_title_gives_any_word_name_context(gazetteer):
    assert found(gazetteer, "Dr. Parkinson saw the patient") == [(0, 13, NAME)]


def test_confidence_below_one_for_weak_evidence(gazetteer):
    spans = gazetteer.detect("May Smith was seen in Framingham", [])
    assert spans and all(0 < s.confidence < 1 for s in spans)


def test_deterministic(gazetteer):
    text = "Dr. Alan S. saw Mary Johnson at Cedars-Sinai Medical Center, Los Angeles, CA."
    assert gazetteer.detect(text, []) == gazetteer.detect(text, []) == GazetteerDetector().detect(text, [])
