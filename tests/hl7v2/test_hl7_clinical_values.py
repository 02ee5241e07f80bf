"""HL7v2 places that hold clinical values, not narrative, have structured rules (mappings/hl7v2/safe-harbor.yaml):
reference ranges (OBX-7), sub-ids (OBX-4), units and interpretation flags (OBX-6, OBX-8), repeat patterns (TQ1-3,
RPT) with their coding systems, and substance lot numbers (RXA-15) come out as they went in, in every profile;
a device's lot and serial number (PRT-19, PRT-20) are removed. A kept value that holds the patient's identifier is
still removed, and a number a sender typed into a name is not a name token that masks or refuses a kept range."""
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
PROFILES = ("safe-harbor", "longitudinal", "longitudinal-fpe")


def _engine(test_key, stack, profile: str = "safe-harbor") -> HL7Deidentifier:
    return HL7Deidentifier(load_hl7_profile(profile), Pseudonymizer(test_key), stack, lambda: FIXED_TODAY)


def _field(out: str, sid: str, n: int) -> str:
    return next(s for s in out.split("\r") if s.startswith(sid + "|")).split("|")[n]


def _message(*segments: str, pid: str = PID) -> str:
    return "\r".join((MSH, pid) + segments) + "\r"


@pytest.fixture(scope="module")
def default_stack():
    return build_stack(DEFAULT_STACK)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("reference_range", ["3.3-5.1", "36.0-78.0", "10.2 to 14.5", "160-370", "0.51-0.95", "11-47"])
def test_a_reference_range_is_kept_as_sent(test_key, default_stack, profile, reference_range):
    out = _engine(test_key, default_stack, profile).deidentify(_message(
        f"OBX|1|NM|2823-3^Potassium^LN|1|4.2|mmol/L^millimole per liter^UCUM|{reference_range}|N|||F"))
    assert _field(out, "OBX", 7) == reference_range
    assert _field(out, "OBX", 4) == "1"


@pytest.mark.parametrize("profile", PROFILES)
def test_units_and_flags_are_vocabulary_even_without_their_code(test_key, profile):
    stack = FlagsEveryText()
    out = _engine(test_key, stack, profile).deidentify(_message(
        "OBX|1|NM|2823-3^Potassium^LN|1a|3.2|^mEq/L^^^^^^^mEq per L|3.5-5.1|^Low^^^^^^^below normal|||F"))
    assert _field(out, "OBX", 6) == "^mEq/L^^^^^^^mEq per L"
    assert _field(out, "OBX", 8) == "^Low^^^^^^^below normal"
    assert _field(out, "OBX", 4) == "1a"
    assert stack.seen == ["IL"]  # PID-11's state, and nothing of OBX-4, 6, 7 or 8


@pytest.mark.parametrize("profile", PROFILES)
def test_a_repeat_pattern_keeps_its_code_coding_system_and_schedule(test_key, default_stack, profile):
    tq1 = "TQ1|1||BID&Twice a day at institution specified times&HL70335^^^^12^h^^PC^30^min|||||20240101"
    out = _engine(test_key, default_stack, profile).deidentify(_message(tq1))
    assert _field(out, "TQ1", 3) == "BID&Twice a day at institution specified times&HL70335^^^^12^h^^PC^30^min"


def test_a_repeat_patterns_general_timing_specification_is_still_read_as_text(test_key):
    stack = FlagsEveryText()
    out = _engine(test_key, stack).deidentify(_message("TQ1|1||Q6H&Every 6 hours&HL70335^^^^^^^^^^after meals"))
    assert _field(out, "TQ1", 3) == "Q6H&Every 6 hours&HL70335^^^^^^^^^^[NAME] meals"
    assert "Every 6 hours" not in stack.seen and "after meals" in stack.seen


@pytest.mark.parametrize("profile", PROFILES)
def test_a_vaccine_lot_number_is_kept_and_a_devices_lot_and_serial_are_removed(test_key, default_stack, profile):
    out = _engine(test_key, default_stack, profile).deidentify(_message(
        "RXA|0|1|20240101||49281021588^TENIVAC^NDC|0.5|mL^mL^UCUM||||||||Z0860BB|20251231|PMC^Sanofi Pasteur^MVX",
        "PRT||AD||AD||PPT|||||||||||||123ABC|SN-4471193"))
    assert _field(out, "RXA", 15) == "Z0860BB"
    assert _field(out, "RXA", 7) == "mL^mL^UCUM"
    assert _field(out, "PRT", 19) == ""
    assert _field(out, "PRT", 20) == ""


def test_a_kept_clinical_value_that_holds_the_patients_identifier_is_removed(test_key):
    out = _engine(test_key, build_stack("patterns")).deidentify(_message(
        "RXA|0|1|20240101||49281021588^TENIVAC^NDC|0.5|mL||||||||MRN12345",
        "OBX|1|ST|X-1^Panel^L||pending||Quixote||||F"))
    assert _field(out, "RXA", 15) == ""
    assert _field(out, "OBX", 7) == ""


def test_a_number_typed_into_a_name_does_not_mask_or_refuse_a_kept_range(test_key, default_stack):
    pid = "PID|1||MRN12345^^^HOSP^MR||Quixote 29^Donna||19700312|F|||12 Elm Street^^Springfield^IL^62704"
    out = _engine(test_key, default_stack).deidentify(_message(
        "OBX|1|NM|39156-5^BMI^LN||24.1|kg/m2|21-29|N|||F", "NTE|1||Ms Quixote is well", pid=pid))
    assert _field(out, "OBX", 7) == "21-29"
    assert "Quixote" not in out
