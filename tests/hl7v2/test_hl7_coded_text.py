"""HL7v2 coded text is terminology: a CE/CWE/CNE text component beside its code (2 by 1, 5 by 4, 11 by 10) is
kept, with only the message's known identifiers masked in it; a text component without its code, and CWE-9
(original text), go through the text stack. An organisation's name (XON-1) is a facility name: kept the same way."""
from __future__ import annotations

import pytest

from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import load_hl7_profile
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import FIXED_TODAY
from tests.support import FlagsEveryText
from text_deid.stack import DEFAULT_STACK, build_stack

MSH = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000+0100||ORU^R01^ORU_R01|CTRL1|P|2.5.1"
PID = "PID|1||MRN12345^^^HOSP^MR||Quixote^Donna^Maria||19700312|F|||12 Elm Street^^Springfield^IL^62704"



def _engine(test_key, stack) -> HL7Deidentifier:
    return HL7Deidentifier(load_hl7_profile("safe-harbor"), Pseudonymizer(test_key), stack, lambda: FIXED_TODAY)


def _field(out: str, sid: str, n: int) -> str:
    return next(s for s in out.split("\r") if s.startswith(sid)).split("|")[n]


def _message(*segments: str) -> str:
    return "\r".join((MSH, PID) + segments) + "\r"


@pytest.fixture(scope="module")
def default_stack():
    return build_stack(DEFAULT_STACK)


@pytest.mark.parametrize("obx3", ["45211-7^Octanoylcarnitine (C8)^LN",
                                  "4548-4^Hemoglobin A1c/Hemoglobin.total in Blood^LN^HBA1C^Glycated haemoglobin^L",
                                  "2160-0^Serum creatinine^LN"])
def test_observation_codes_keep_their_text_with_the_default_stack(test_key, default_stack, obx3):
    out = _engine(test_key, default_stack).deidentify(_message(f"OBX|1|NM|{obx3}||0.12|umol/L|||||F"))
    assert _field(out, "OBX", 3) == obx3


def test_coded_text_is_not_sent_through_the_stack_and_text_without_its_code_is(test_key):
    stack = FlagsEveryText()
    out = _engine(test_key, stack).deidentify(_message(
        "OBX|1|CWE|8867-4^Heart rate^LN||^Irregular rhythm~LA6576-8^Positive^LN^^^^^^Positive per clinician note|||||F"))
    assert _field(out, "OBX", 3) == "8867-4^Heart rate^LN"
    assert _field(out, "OBX", 5) == "^[NAME] rhythm~LA6576-8^Positive^LN^^^^^^[NAME] per clinician note"
    assert "Heart rate" not in stack.seen and "Positive" not in stack.seen
    assert {"Irregular rhythm", "Positive per clinician note"} <= set(stack.seen)


def test_alternate_text_beside_its_alternate_code_is_kept(test_key):
    stack = FlagsEveryText()
    out = _engine(test_key, stack).deidentify(_message("OBX|1|NM|4548-4^HbA1c^LN^HBA1C^Glycated haemoglobin^L||6.1|%|||||F"))
    assert _field(out, "OBX", 3) == "4548-4^HbA1c^LN^HBA1C^Glycated haemoglobin^L"
    assert stack.seen == ["IL"]  # PID-11's state, and nothing of OBX-3


def test_coded_text_holding_the_patients_name_or_town_loses_it(test_key):
    out = _engine(test_key, build_stack("patterns")).deidentify(_message(
        "OBX|1|ST|X-1^Quixote family panel^L~X-2^Springfield screening^L||negative||||||F"))
    assert _field(out, "OBX", 3) == "X-1^[NAME] family panel^L~X-2^[GEOGRAPHIC_LOCATION] screening^L"


def test_an_organisation_name_is_a_facility_name_kept_and_its_other_parts_removed(test_key):
    stack = FlagsEveryText()
    out = _engine(test_key, stack).deidentify(_message("PD1|||Lindas Test Organization^^SIISCLIENT818"))
    assert _field(out, "PD1", 3) == "Lindas Test Organization^^"
    assert stack.seen == ["IL"]  # PID-11's state, and nothing of PD1-3


def test_coded_text_keeps_a_word_that_only_a_member_of_staff_is_named(test_key):
    """Safe Harbor's identifiers are the patient's and their people's: an attending surnamed TEST does not mask
    "test" in a LOINC display, while the patient's name, and the staff member's whole name, still are masked in one."""
    out = _engine(test_key, FlagsEveryText()).deidentify(_message(
        "PV1|1|O|||||1234^TEST^ANN^^^DR", "OBX|1|ST|30954-2^Reason for lab test^LN||done|||||F",
        "OBX|2|ST|99999-1^Quixote test panel^L||done|||||F", "OBX|3|ST|99999-2^Ann Test follow-up^L||done|||||F"))
    assert _field(out, "OBX", 3) == "30954-2^Reason for lab test^LN"
    assert "Quixote" not in out.split("OBX|2|")[1]
    assert "Ann Test" not in out.split("OBX|3|")[1]  # a staff member's whole name stays masked
