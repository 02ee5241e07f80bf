"""HL7 batch and file envelopes (FHS, BHS, BTS, FTS) get the known identifiers of the messages they wrap
(issue #36 item 2): a patient's name, MRN or phone in a header's or trailer's free text is masked, or the
file refused, never written."""
from __future__ import annotations

import pytest

from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import load_hl7_profile
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import FIXED_TODAY
from text_deid.stack import build_stack

MSH = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000+0100||ADT^A01^ADT_A01|CTRL1|P|2.5.1"
PID = "PID|1||MRN4471902^^^HOSP^MR||Zyxwvut^Qqqplanted||19700312|F|||||(217)555-0199"
MESSAGE = f"{MSH}\r{PID}\r"


@pytest.fixture(scope="module")
def deid(test_key) -> HL7Deidentifier:
    return HL7Deidentifier(load_hl7_profile("safe-harbor"), Pseudonymizer(test_key), build_stack("patterns"),
                           lambda: FIXED_TODAY)


@pytest.mark.parametrize("envelope, segment, field", [
    ("FHS|^~\\&|APP|||||||Zyxwvut file for Qqqplanted\rBHS|^~\\&|APP\r{m}BTS|1\rFTS|1\r", "FHS", 9),
    ("BHS|^~\\&|APP|||||||batch of Qqqplanted Zyxwvut\r{m}BTS|1\r", "BHS", 9),
    ("BHS|^~\\&|APP\r{m}BTS|1|last: Zyxwvut, MRN4471902\r", "BTS", 2),
    ("FHS|^~\\&|APP\r{m}FTS|1|call (217)555-0199 for Zyxwvut\r", "FTS", 2),
])
def test_an_envelope_gets_the_known_identifiers_of_its_messages(deid, envelope, segment, field):
    out = deid.deidentify_file_text(envelope.format(m=MESSAGE))
    for value in ("Zyxwvut", "Qqqplanted", "MRN4471902", "555-0199"):
        assert value not in out
    line = next(s for s in out.split("\r") if s.startswith(segment))
    assert "[NAME]" in line.split("|")[field]


def test_an_envelope_before_its_messages_is_written_first(deid):
    out = deid.deidentify_file_text(f"FHS|^~\\&|APP|||||||for Zyxwvut\r{MESSAGE}{MESSAGE}FTS|2\r")
    assert [s[:3] for s in out.split("\r") if s] == ["FHS", "MSH", "PID", "MSH", "PID", "FTS"]
