"""HL7v2 as real feeds send it: queries by their profiles, values one field off, the oldest versions, table codes.

Every message here is synthetic, written for these tests.
"""
from __future__ import annotations

import dataclasses
import re

import pytest

from fhir_transforms.errors import LeakFound
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import Rule, load_hl7_profile, readable_year
from fhir_transforms.hl7v2.standard import field_type
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import FIXED_TODAY
from text_deid.stack import build_stack

PSEUDONYM = r"[0-9a-f]{32}"
# the patient of the queries: every value below must be gone from the output
SECRETS = ("44556", "Quorlan", "Vexabeth", "Tamsin", "20100412", "12 Elm Row", "Springfield", "62704", "5550199")
Z34 = ("QPD|Z34^Request Immunization History^CDCPHINVS|Q0001|44556^^^REGISTRY^MR|Quorlan^Vexabeth^R^^^^L|Tamsin^F|"
       "20100412|F|12 Elm Row^^Springfield^IL^62704^USA^L|^PRN^PH^^^217^5550199")


def msh(event: str, version: str = "2.5.1", stamp: str = "20240101120000", msh18: str = "") -> str:
    return f"MSH|^~\\&|MYEHR|MYCLINIC|IIS|IIS|{stamp}||{event}|CTRL1|P|{version}||||||{msh18}"


def message(*segments: str) -> str:
    return "\r".join(segments) + "\r"


def engine(key, profile: str = "safe-harbor") -> HL7Deidentifier:
    return HL7Deidentifier(load_hl7_profile(profile), Pseudonymizer(key), build_stack("patterns"), lambda: FIXED_TODAY)


@pytest.fixture(scope="module")
def deid(test_key) -> HL7Deidentifier:
    return engine(test_key)


def field(out: str, sid: str, n: int, k: int = 0) -> str:
    parts = [s for s in out.split("\r") if s.startswith(sid + "|")][k].split("|")
    n -= sid == "MSH"
    return parts[n] if len(parts) > n else ""


def assert_gone(out: str, secrets=SECRETS) -> None:
    for value in secrets:
        assert value not in out, value


# --- queries
def test_cdc_immunization_query_parameters_by_their_profile(deid):
    """QBP^Q11 Z34: the patient id pseudonymized as a CX, names and phone removed, birth date to its year, the
    state kept and the ZIP to 3 digits, sex kept; the query name, tag and RCP kept."""
    out = deid.deidentify(message(msh("QBP^Q11^QBP_Q11"), Z34, "RCP|I|5^RD&Records&HL70126"))
    assert_gone(out)
    assert re.fullmatch(PSEUDONYM + r"\^\^\^\^MR", field(out, "QPD", 3))
    assert field(out, "QPD", 1) == "Z34^Request Immunization History^CDCPHINVS"
    assert field(out, "QPD", 2) == "Q0001"
    assert (field(out, "QPD", 6), field(out, "QPD", 7)) == ("2010", "F")
    assert field(out, "QPD", 8) == "^^^IL^627^^"
    assert field(out, "RCP", 2) == "5^RD&Records&HL70126"


def test_rsp_k11_echo_keeps_no_maiden_name_and_matches_the_pid(deid):
    """RSP^K11: the echoed QPD is ruled as the query's, the same MRN gets the same pseudonym as in PID-3, and
    QAK is kept."""
    out = deid.deidentify(message(
        msh("RSP^K11^RSP_K11"), "MSA|AA|CTRL1", "QAK|Q0001|OK|Z34^Request Immunization History^CDCPHINVS", Z34,
        "PID|1||44556^^^REGISTRY^MR||Quorlan^Vexabeth^R^^^^L|Tamsin^F^^^^^M|20100412|F"))
    assert_gone(out)
    assert field(out, "QPD", 3) == field(out, "PID", 3)
    assert field(out, "QAK", 1) == "Q0001" and field(out, "QAK", 3).startswith("Z34^")


def test_pdq_query_qbp_q22(deid):
    """QBP^Q22 (IHE PDQ): the demographics pairs go, the query name, tag and RCP stay."""
    out = deid.deidentify(message(
        msh("QBP^Q22^QBP_Q21", "2.5"),
        "QPD|Q22^Find Candidates^HL70471|Q0002|@PID.5.1^Quorlan~@PID.5.2^Vexabeth~@PID.7^20100412~@PID.3.1^44556",
        "RCP|I|10^RD"))
    assert_gone(out)
    assert field(out, "QPD", 3).startswith("@PID.5.1^~@PID.5.2^~@PID.7^2010~@PID.3.1^")
    assert (field(out, "QPD", 1), field(out, "QPD", 2), field(out, "RCP", 2)) == (
        "Q22^Find Candidates^HL70471", "Q0002", "10^RD")


def test_pdq_qip_pairs_are_ruled_by_the_field_they_name(deid):
    """RSP^K22 (IHE PDQ): each `@PID.n^value` pair ruled as PID-n, an id with its authority as PID-3 rules the
    same id; a pair naming no field is removed."""
    out = deid.deidentify(message(
        msh("RSP^K22^RSP_K21", "2.5"), "MSA|AA|CTRL1", "QAK|Q0002|OK",
        "QPD|IHE PDQ Query|Q0002|@PID.5.1^Quorlan~@PID.5.2^Vexabeth~@PID.7^20100412~@PID.3.1^44556~"
        "@PID.3.4.1^REGISTRY~@PID.11.5^62704~@ZZZ.1^Tamsin|||||^^^REGISTRY",
        "PID|1||44556^^^REGISTRY^MR||Quorlan^Vexabeth"))
    assert_gone(out)
    pairs = field(out, "QPD", 3).split("~")
    assert pairs[:3] == ["@PID.5.1^", "@PID.5.2^", "@PID.7^2010"]
    assert pairs[3] == "@PID.3.1^" + field(out, "PID", 3).split("^")[0] and re.fullmatch(PSEUDONYM, pairs[3][9:])
    assert pairs[4:] == ["@PID.3.4.1^", "@PID.11.5^627", "@ZZZ.1^"]


def test_unknown_query_parameters_are_removed_and_known(deid):
    """A query no profile names: every parameter from QPD-3 on removed, and known: the name in a note is masked."""
    out = deid.deidentify(message(
        msh("QBP^Z99"), "QPD|X99^Some query^L|Q9|Quorlan^Vexabeth|20100412|77889911",
        "NTE|1||Asked for Vexabeth Quorlan, record 77889911"))
    assert_gone(out, ("Quorlan", "Vexabeth", "20100412", "77889911"))
    assert field(out, "QPD", 1) == "X99^Some query^L"


def test_old_vxq_query_subject(deid):
    """VXQ^V01 (v2.3.1): QRD-8 names the patient (known: masked in a note), QRF-5's subject values removed."""
    out = deid.deidentify(message(
        msh("VXQ^V01", "2.3.1"),
        "QRD|20240101120000|R|I|Q0005|||25^RD|^Quorlan^Vexabeth^R|VXI^VACCINE INFORMATION^HL70048|^SIIS",
        "QRF|MA0000||||256946789~20100412~IL~IL99999999~88888888~Quorlan^Tamsin~Fennimore~898666725",
        "NTE|1||Vexabeth Quorlan asked"))
    assert_gone(out, ("Quorlan", "Vexabeth", "Tamsin", "Fennimore", "20100412", "256946789", "IL99999999"))
    assert field(out, "QRD", 4) == "Q0005"


# --- values one field off
def test_a_date_in_a_code_field_of_a_visit_is_cut_to_its_year(deid):
    """PV2-7 (IS) and PV2-3 (CE) holding care dates (v2.5.1): years; an 8-digit code elsewhere stays."""
    out = deid.deidentify(message(
        msh("ADT^A01"), "PID|1||MRN12345^^^HOSP^MR||Quixote^Donna||19700312|F",
        "PV2|||20240305^^L||||20240309", "OBX|1|NM|20231115^Some code^L||5"))
    assert field(out, "PV2", 3) == "2024^^L"
    assert field(out, "PV2", 7) == "2024"
    assert field(out, "OBX", 3) == "20231115^Some code^L"


def test_a_zip_in_the_state_is_ruled_as_a_zip(deid):
    out = deid.deidentify(message(
        msh("ADT^A01"), "PID|1||MRN12345^^^HOSP^MR||Quixote^Donna||19700312|F|||1 Main St^^Boston^02139^^USA"))
    assert field(out, "PID", 11) == "^^^021^^"


def test_a_non_standard_timestamp_keeps_its_year(deid):
    out = deid.deidentify(message(msh("ADT^A01", stamp="2024-01-01T12:00:00"),
                                  "PID|1||MRN12345^^^HOSP^MR||Quixote^Donna"))
    assert field(out, "MSH", 7) == "2024"
    out = deid.deidentify(message(msh("ADT^A01", stamp="Jan first"), "PID|1||MRN12345^^^HOSP^MR||Quixote^Donna"))
    assert field(out, "MSH", 7) == ""


@pytest.mark.parametrize("value, year", [("2024-01-01T12:00", "2024"), ("20240101 1200", "2024"),
                                         ("01/02/2024", "2024"), ("01/02/24", None), ("1700-01-01", None)])
def test_readable_year(value, year):
    assert readable_year(value) == year


# --- the oldest versions and withdrawn fields
@pytest.mark.parametrize("version, sid, n, datatype", [
    ("2.1", "PID", 6, "XPN"), ("2.1", "PID", 4, "CX"), ("2.2", "ORC", 2, "EI"), ("2.2", "OBR", 3, "EI"),
    ("2.1", "PID", 5, "XPN"), ("2.1", "PV1", 19, "CX"), ("2.1", "PV1", 3, "PL"),  # PN, a number, a code
    ("2.1", "PID", 7, "DT"), ("2.2", "OBX", 5, None),   # not an identifier, name, place or phone: as it was
    ("2.8", "PID", 2, "CX"), ("2.7", "PID", 4, "CX"),   # withdrawn: the last version that defined it
    ("2.8", "PR1", 8, "XCN"),                           # withdrawn, spelled `wd` in hl7apy's v2.6
    ("2.7", "QRD", 8, "XCN"),                           # a withdrawn segment
    ("2.5.1", "PID", 5, "XPN")])
def test_field_types_of_old_and_withdrawn_fields(version, sid, n, datatype):
    assert field_type(version, sid, n) == datatype


def test_v21_mothers_maiden_name_and_alternate_id(deid):
    """v2.1 PID-4 (ST) and PID-6 (ST) are an identifier and a name, as from v2.3 (CX, XPN)."""
    out = deid.deidentify(message(msh("ADT^A01", "2.1"),
                                  "PID|1||MRN12345||Quixote^Donna|Tamsin^Fennimore|19700312|F"))
    assert "Tamsin" not in out and "Fennimore" not in out
    out = deid.deidentify(message(msh("ADT^A01", "2.1"), "PID|1||MRN12345|ALT778899|Quixote^Donna||19700312|F"))
    assert re.fullmatch(PSEUDONYM, field(out, "PID", 4))


def test_v22_names_are_known_identifiers(deid):
    """A v2.2 PN (PID-5, NK1-2) is ruled as an XPN: its name is known, so the text stack masks it in a note."""
    out = deid.deidentify(message(msh("ADT^A01", "2.2"), "PID|1||MRN12345||Quixote^Donna||19700312|F",
                                  "NK1|1|Fennimore^Tamsin|MTH", "NTE|1||Donna Quixote and Tamsin Fennimore called"))
    assert field(out, "NTE", 3) == "[NAME] and [NAME] called"


def test_v22_placer_and_filler_order_numbers_are_pseudonymized(deid):
    """v2.2 ORC-2/3 and OBR-2/3 (CM): pseudonymized as EI, the same as the same number in v2.5.1."""
    old = deid.deidentify(message(msh("ORM^O01", "2.2"), "PID|1||MRN12345||Quixote^Donna",
                                  "ORC|NW|PL778899^EPIC|FL445566^LAB", "OBR|1|PL778899^EPIC|FL445566^LAB"))
    new = deid.deidentify(message(msh("ORM^O01", "2.5.1"), "PID|1||MRN12345||Quixote^Donna",
                                  "ORC|NW|PL778899^EPIC|FL445566^LAB", "OBR|1|PL778899^EPIC|FL445566^LAB"))
    assert "PL778899" not in old and "FL445566" not in old
    assert re.fullmatch(PSEUDONYM + r"\^", field(old, "ORC", 2))
    assert field(old, "ORC", 2) == field(new, "ORC", 2) and field(old, "OBR", 3) == field(new, "OBR", 3)


def test_withdrawn_pid2_keeps_its_shape_under_fpe(test_key):
    """PID-2 (withdrawn in v2.7) in a v2.8 message is ruled as a CX: `longitudinal-fpe` keeps the MRN's shape."""
    out = engine(test_key, "longitudinal-fpe").deidentify(message(
        msh("ADT^A01", "2.8"), "PID|1|1234567^4^M11^test^MR|PATID1234^^^test1^MR||Quixote^Donna||19700312|F"))
    pid2 = field(out, "PID", 2).split("^")
    assert re.fullmatch(r"\d{7}", pid2[0]) and pid2[0] != "1234567"
    assert pid2[4] == "MR"


# --- table codes
def test_a_surname_part_equal_to_a_table_code_is_no_leak(deid):
    """A surname prefix `Mr` and the identifier type `MR` of CX-5: not a leak; the name itself is removed."""
    out = deid.deidentify(message(msh("ADT^A01"), "PID|1||MRN12345^^^HOSP^MR||Mr&Mr&Quixote^Donna||19700312|F",
                                  "IN1|1|BC-CNY^Plan^L|||||||||||||||Test^Patient^BC"))
    assert "Quixote" not in out and "Donna" not in out
    assert field(out, "PID", 3).endswith("^MR")
    assert field(out, "IN1", 2) == "BC-CNY^Plan^L"


@pytest.mark.parametrize("name, kept, refused", [
    ("Mr&Mr&Quixote^Donna", "MR", False),        # a prefix equal to a code: not looked for on its own
    ("Mr&Mr&Quixote^Donna", "Quixote", True),    # the surname is
    ("Wu^Li", "Li Wu", True),                    # a name of short words only: looked for whole
    ("Wu^Li", "LI", True)])                      # ... word by word, as before: a rare refusal rather than a leak
def test_the_guard_reads_names_less_their_short_words(test_key, name, kept, refused):
    profile = load_hl7_profile("safe-harbor")
    keeping = dataclasses.replace(profile, fields={**profile.fields, "NTE.3": Rule(method="keep")},
                                  _rules={}, _resolved={}, _guard={})
    deid = HL7Deidentifier(keeping, Pseudonymizer(test_key), build_stack("patterns"), lambda: FIXED_TODAY)
    text = message(msh("ADT^A01"), f"PID|1||MRN12345^^^HOSP^MR||{name}||19700312|F", f"NTE|1||{kept}")
    if refused:
        with pytest.raises(LeakFound):
            deid.deidentify(text)
    else:
        assert field(deid.deidentify(text), "NTE", 3) == kept


# A sender that lost a segment break: "PID|…|PV1|1|O|…", PV1 written into PID's last fields. Found in a peer
# project's suite (LinuxForHealth's FHIR converter): the doctors' names were kept as PID text.
GLUED_PID = ("PID|1||44556^^^HOSP^MR||Quorlan^Vexabeth||20100412|F||||||||||||||||||||||||PV1|1|O|||||"
             "2740^Tsadok^Janetary|2913^Merrit^Darren^F|3065^Mahoney^Paul^J||||||||9052^Winter^Oscar^||1001918")


@pytest.mark.parametrize("version", ["2.3.1", "2.5.1"])
def test_a_segment_glued_onto_another_is_ruled_as_its_own_fields(deid, version):
    out = deid.deidentify(message(msh("ADT^A08", version), GLUED_PID))
    for value in ("Tsadok", "Janetary", "Merrit", "Darren", "Mahoney", "Winter", "Oscar", "1001918", "Quorlan", "44556"):
        assert value not in out, value
    pid = next(s for s in out.split("\r") if s.startswith("PID")).split("|")
    at = pid.index("PV1")
    assert pid[at + 1:at + 3] == ["1", "O"]  # the glued segment's codes stay, as in a PV1 of its own


def test_a_segment_id_as_a_code_is_not_a_glued_segment(deid):
    """A facility coded "MSH" (PV1-39) followed by no set ID: the fields after it keep their own rules."""
    pv1 = "PV1|1|O" + "|" * 37 + "MSH||A|||20010101000000"
    out = deid.deidentify(message(msh("ADT^A04", "2.3"), "PID|1||44556^^^HOSP^MR||Quorlan^Vexabeth||20010101|F", pv1))
    fields = next(s for s in out.split("\r") if s.startswith("PV1")).split("|")
    assert fields[41] == "A" and fields[44] in ("2001", "")  # PV1-44, the admit date: ruled as a date
