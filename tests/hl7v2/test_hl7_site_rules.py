"""Site rules over HL7v2: a field rule with a condition on a component, true and false; the rules hash in MSH-8."""
from __future__ import annotations

import pytest

from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import hl7_site_profile, load_hl7_profile
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.site_rules import read_site_rules
from tests.conftest import FIXED_TODAY
from text_deid.stack import build_stack

MSH = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000+0100||ADT^A01^ADT_A01|CTRL1|P|2.5.1"
PID = ("PID|1||MRN12345^^^HOSP&2.16.840.1.113883.19.5&ISO^MR||Quixote^Donna^Maria||19700312|F|||"
       "12 Elm Street^^Springfield^IL^62704||(217)555-0199^PRN^PH~(217)555-0142^WPN^PH")
SITE = """extends: safe-harbor
hl7v2:
  fields:
    PID.13: {method: keep, where: {component: 2, in: [WPN]}}   # work numbers kept, the others by XTN
"""


@pytest.fixture
def site(tmp_path):
    (tmp_path / "site.yaml").write_text(SITE)
    return read_site_rules(tmp_path / "site.yaml")


def run(profile, test_key, *segments: str) -> list[list[str]]:
    engine = HL7Deidentifier(profile, Pseudonymizer(test_key), build_stack("patterns"), lambda: FIXED_TODAY)
    out = engine.deidentify("\r".join((MSH, PID) + segments) + "\r")
    return [s.split("|") for s in out.split("\r") if s]


def test_a_repetition_whose_component_matches_gets_the_rule_the_others_the_next(site, test_key):
    pid = next(s for s in run(hl7_site_profile(site), test_key) if s[0] == "PID")
    home, work = pid[13].split("~")
    assert work == "(217)555-0142^WPN^PH"  # condition true: kept
    assert home == "^^"  # condition false: the XTN datatype's rule (removed)
    packaged = next(s for s in run(load_hl7_profile("safe-harbor"), test_key) if s[0] == "PID")
    assert "555-0142" not in packaged[13]


def test_without_a_matching_component_the_condition_is_false(site, test_key):
    profile = hl7_site_profile(site)
    engine = HL7Deidentifier(profile, Pseudonymizer(test_key), build_stack("patterns"), lambda: FIXED_TODAY)
    out = engine.deidentify(MSH + "\r" + PID.replace("^WPN^PH", "").replace("^PRN^PH", "^WPN^PH") + "\r")
    work, unmarked = next(s for s in out.split("\r") if s.startswith("PID")).split("|")[13].split("~")
    assert work == "(217)555-0199^WPN^PH" and "555-0142" not in unmarked


def test_msh8_carries_the_rules_hash(site, test_key, tmp_path):
    # keeping the patient's own work number (PID-13) is more than Safe Harbor allows: named by the hash alone
    msh = run(hl7_site_profile(site), test_key)[0]
    assert msh[7] == f"deid/{test_key.key_id}/site.{site.sha256[:12]}/not-safe-harbor"
    (tmp_path / "staff.yaml").write_text("extends: safe-harbor\nhl7v2:\n  fields:\n    STF.10: keep\n")
    staff = read_site_rules(tmp_path / "staff.yaml")
    msh = run(hl7_site_profile(staff), test_key)[0]
    assert msh[7] == f"deid/{test_key.key_id}/safe-harbor+{staff.sha256[:12]}"
    assert run(load_hl7_profile("safe-harbor"), test_key)[0][7] == f"deid/{test_key.key_id}/safe-harbor"
