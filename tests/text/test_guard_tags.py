"""A patient whose name is a category's word ("Date", "Name", "Url") is not found by the leak guard inside the
tags the stack wrote ("[DATE]"), so a masked record is written, not refused; the same word anywhere else is."""
from __future__ import annotations

import copy

import pytest

from fhir_transforms.errors import LeakFound
from tests.conftest import make_engine
from text_deid import leak_guard
from text_deid.spans import KnownIdentifier


@pytest.mark.parametrize("family", ["Date", "Name", "Url", "Age"])
def test_the_guard_does_not_read_a_name_inside_the_stacks_tags(family):
    known = (KnownIdentifier(f"Ann {family}", "NAME"), KnownIdentifier(family, "NAME"))
    tags = "seen [NAME] on [DATE], [URL], [AGE_OVER_89] [GEOGRAPHIC_LOCATION]"
    assert leak_guard.clean([tags], known) and not leak_guard.scan([("x", tags)], known)
    for written in (f"seen {family} today", f"[{family}]", f"[{family.lower()}]", f"({family.upper()})"):
        assert not leak_guard.clean([written], known), written
        assert leak_guard.scan([("x", written)], known)


PATIENT = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Date", "given": ["Ann"]}],
           "text": {"status": "generated",
                    "div": '<div xmlns="http://www.w3.org/1999/xhtml">Ann Date, seen 2020-03-04 by Dr Ann Date</div>'}}


def test_a_patient_named_date_is_masked_and_written(test_key):
    out = make_engine(test_key).deidentify(copy.deepcopy(PATIENT), "Patient").resource
    div = out["text"]["div"]
    assert "[DATE]" in div and "[NAME]" in div and "Ann" not in div and "2020" not in div


@pytest.mark.parametrize("family, element", [("Generated", "text.status"), ("Female", "gender")])
def test_a_patient_named_as_a_code_of_the_record_is_refused_at_the_code(test_key, family, element):
    """A kept code is read by the guard (a name written into Patient.language is a leak), so a name that spells
    one of the record's codes refuses the record, by design, at the code and not at the masked narrative."""
    patient = copy.deepcopy(PATIENT)
    patient.update(gender="female", name=[{"family": family, "given": ["Ann"]}])
    patient["text"]["div"] = f'<div xmlns="http://www.w3.org/1999/xhtml">Ann {family} seen</div>'
    with pytest.raises(LeakFound) as e:
        make_engine(test_key, validate=False).deidentify(patient, "Patient")
    assert f"Patient.{element}" in str(e.value) and "text.div" not in str(e.value) and family not in str(e.value)
