"""A release's known identifiers (text_deid/detectors/release.py): every patient's, found in any record's text
(issue #36 item 2: a name of another patient in the release is still a name)."""
from __future__ import annotations

import pytest

from text_deid.detectors.release import ReleaseMatcher
from text_deid.spans import KnownIdentifier as K

RELEASE = (
    K("Zyxwvut604 Qqqplanted", "NAME"), K("Zyxwvut604", "NAME"), K("Qqqplanted", "NAME"),
    K("Mark Young", "NAME"), K("Mark", "NAME"), K("Young", "NAME"),
    K("617-555-0199", "PHONE_NUMBER"), K("999-12-9623", "SOCIAL_SECURITY_NUMBER"), K("1961-07-04", "DATE"),
)


@pytest.fixture(scope="module")
def release() -> ReleaseMatcher:
    return ReleaseMatcher(RELEASE)


def values(found: set[K]) -> set[str]:
    return {k.value for k in found}


@pytest.mark.parametrize("text, expected", [
    ("Seen with Zyxwvut Qqqplanted.", {"zyxwvut", "zyxwvut604", "qqqplanted"}),
    ("seen with qqqplanted", {"qqqplanted"}),  # a name no English word spells: in any case
    ("Zyxwvut604 called", {"zyxwvut", "zyxwvut604"}),  # with the digits a generator appends
    ("Ｑｑｑｐｌａｎｔｅｄ called", {"qqqplanted"}),  # in normal form (fullwidth Latin)
    ("Mr Young called; Mark will come", {"young", "mark"}),
    ("young man, mark the site", set()),  # English words, not capitalized: the words, not the name
    ("the Qqqplantedness of it, unQqqplanted", set()),  # inside a longer word
    ("call (617) 555-0199 or SSN 999 12 9623", {"617-555-0199", "999-12-9623"}),
    ("born 1961-07-04", set()),  # dates are left out: the release's birth dates would cover most days
])
def test_the_release_identifiers_a_text_holds(release, text, expected):
    assert values(release.known_in([text])) == expected


def test_found_identifiers_are_masked_and_guarded_as_the_records_own(engine):
    """A record whose note names a patient of the release it does not hold: masked with the release, and the
    name is among the identifiers the leak guard checks; without the release it stays (as on main)."""
    note = "Spoke with Qqqplanted about her mother; young patient, call 617 555 0199."
    record = {"resourceType": "Observation", "id": "obs-1", "status": "final", "code": {"text": "note"},
              "note": [{"text": note}]}
    assert "Qqqplanted" in engine.deidentify(record).resource["note"][0]["text"]
    engine.release = ReleaseMatcher(RELEASE)
    result = engine.deidentify(record)
    text = result.resource["note"][0]["text"]
    assert "Qqqplanted" not in text and "555 0199" not in text and "young patient" in text
    assert {K("qqqplanted", "NAME"), K("617-555-0199", "PHONE_NUMBER")} <= set(result.known)
