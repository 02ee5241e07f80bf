"""HL7v2 engine behaviour: escapes, split notes, Z-segments, the cross-format MRN, bad input and refusals."""
from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fhir_transforms.hl7v2 import message as er7
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import dtm_shift, dtm_year, load_hl7_profile
from fhir_transforms.errors import InputError, RecordRefused
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import FIXED_TODAY, make_engine
from text_deid.spans import DetectorError
from text_deid.stack import build_stack
from fhir_transforms.hl7v2 import rules as hl7_rules
from text_deid import stack
from adapter.cli.main import app

MSH = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000+0100||ADT^A01^ADT_A01|CTRL1|P|2.5.1"
PID = ("PID|1||MRN12345^^^HOSP&2.16.840.1.113883.19.5&ISO^MR||Quixote^Donna^Maria||19700312|F|||"
       "12 Elm Street^^Springfield^IL^62704||(217)555-0199")


def msg(*segments: str) -> str:
    return "\r".join((MSH, PID) + segments) + "\r"


@pytest.fixture(scope="module")
def deid(test_key) -> HL7Deidentifier:
    return HL7Deidentifier(load_hl7_profile("safe-harbor"), Pseudonymizer(test_key), build_stack("patterns"),
                           lambda: FIXED_TODAY)


def fields(out: str, sid: str) -> list[str]:
    return next(s for s in out.split("\r") if s.startswith(sid)).split("|")


D = er7.Delimiters()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40))
def test_escapes_round_trip(text):
    raw = er7.escape(text.replace("\r", "\n"), D)
    assert not any(c in raw for c in "|^~&\r")
    assert er7.decode(raw, D)[0] == text.replace("\r", "\n")
    assert er7.rewrite(raw, D, []) == raw


def test_rewrite_keeps_escapes_outside_spans():
    raw = "Seen by Quixote\\.br\\A\\T\\B \\H\\bold\\N\\ \\X41\\"
    text, _ = er7.decode(raw, D)
    assert text == "Seen by Quixote\nA&B bold A"
    start = text.index("Quixote")
    assert er7.rewrite(raw, D, [(start, start + 7, "[NAME]")]) == "Seen by [NAME]\\.br\\A\\T\\B \\H\\bold\\N\\ \\X41\\"


def test_dtm_adapter_keeps_precision_and_offset():
    assert dtm_year("198808181126+0215") == "1988"
    assert dtm_shift("198808181126+0215", 10) == "198808281126+0215"
    assert dtm_shift("20240229", 1) == "20240301"
    assert dtm_shift("202402", 3) == "202402"
    assert dtm_shift("20240101120000.123-0500", -1) == "20231231120000.123-0500"


def test_identifiers_split_over_two_obx_lines_are_caught(deid):
    """One note over consecutive OBX lines is read as one text: a phone number broken across them is found."""
    out = deid.deidentify(msg("OBR|1|ORD1||NOTE", "OBX|1|TX|||Seen with Donna, call (217) 555-||||||F",
                              "OBX|2|TX|||0199 tomorrow; Quixote to review.||||||F", "OBX|3|NM|X||5||||||F"))
    obx = [s.split("|")[5] for s in out.split("\r") if s.startswith("OBX")]
    assert obx == ["Seen with [NAME], call [PHONE_NUMBER]", "[PHONE_NUMBER] tomorrow; [NAME] to review.", "5"]


def test_patient_name_in_narrative_and_z_segment_is_masked(deid):
    out = deid.deidentify(msg("NTE|1||Donna Quixote called from (217)555-0199",
                              "ZPI|1|Quixote, Donna|12 Elm Street|note: MRN12345"))
    for value in ("Quixote", "Donna", "555-0199", "Elm Street", "MRN12345"):
        assert value not in out
    assert fields(out, "ZPI")[0] == "ZPI" and len(fields(out, "ZPI")) == 5


@pytest.mark.parametrize("family, given", [("Do", "Anh"), ("Miss", "Dana"), ("Smith", "Rev")])
def test_a_name_that_spells_a_title_is_masked_in_narrative(deid, family, given):
    """Do is a common family name and also the credential DO: a name's own components are names, whatever
    word they spell (titles have their own components, XPN.5 and XPN.4)."""
    pid = PID.replace("Quixote^Donna^Maria", f"{family}^{given}")
    out = deid.deidentify("\r".join((MSH, pid, f"NTE|1||{given} {family} seen; {family}, {given[0]}. to call")) + "\r")
    note = fields(out, "NTE")[3]
    assert family.lower() not in note.lower().replace("[name]", "") and given not in note, note


def test_values_and_routing(deid, test_key):
    out = deid.deidentify(msg("PV1|1|I|WARD^12^B|||||||||||||||||VISIT987^^^HOSP^VN|||||||||||||||||||||||||20240101"))
    pid = fields(out, "PID")
    assert pid[7] == "1970" and pid[5] == "^^" and pid[13] == ""
    assert pid[11].split("^")[3:5] == ["IL", "627"]
    msh = fields(out, "MSH")
    assert msh[2:6] == ["APP", "FAC", "RCV", "RFAC"] and msh[6] == "2024"
    assert msh[7] == f"deid/{test_key.key_id}/safe-harbor"
    assert fields(out, "PV1")[3] == "^^" and fields(out, "PV1")[-1] == "2024"
    assert "VISIT987" not in out


def test_control_id_is_a_keyed_pseudonym_per_sender(deid, test_key):
    """MSH-10 may embed a date or an MRN: the output carries a 20-character keyed token, the same for a resend
    (receivers drop duplicates by it) and another one for another sender's same id."""
    control_id = fields(deid.deidentify(msg()), "MSH")[9]
    assert control_id == Pseudonymizer(test_key).token("control-id|APP|FAC", "CTRL1", 20)
    assert fields(deid.deidentify(msg()), "MSH")[9] == control_id
    assert fields(deid.deidentify(msg().replace("|APP|FAC|", "|LAB|FAC|")), "MSH")[9] != control_id
    dated = deid.deidentify(msg().replace("|CTRL1|", "|MRN12345-19700312|"))
    assert "MRN12345" not in dated and "19700312" not in dated


def site_profile(tmp_path, monkeypatch, yaml_text: str):
    """A site's profile that extends safe-harbor, read by the same loader as the shipped ones."""
    for name in ("safe-harbor",):
        (tmp_path / f"{name}.yaml").write_text((hl7_rules.MAPPINGS / f"{name}.yaml").read_text())
    (tmp_path / "site.yaml").write_text("extends: safe-harbor\nprofile: site\nversion: '1'\n" + yaml_text)
    monkeypatch.setattr(hl7_rules, "MAPPINGS", tmp_path)
    load_hl7_profile.cache_clear()
    try:
        return load_hl7_profile("site")
    finally:
        load_hl7_profile.cache_clear()


def test_a_kept_control_id_is_still_read_by_the_leak_guard(deid, tmp_path, monkeypatch):
    keep = HL7Deidentifier(site_profile(tmp_path, monkeypatch, "fields: {MSH.10: keep}\n"), deid.pseudo, deid.stack,
                           deid.clock)
    assert fields(keep.deidentify(msg()), "MSH")[9] == "CTRL1"
    with pytest.raises(RecordRefused, match="MSH"):
        keep.deidentify(msg().replace("|CTRL1|", "|MRN12345|"))


def test_a_site_can_pseudonymize_sending_application_and_facility(deid, tmp_path, monkeypatch):
    """Kept by default (as FHIR keeps Organization.name); a site may give HD-1 a keyed token and drop the OIDs."""
    profile = site_profile(tmp_path, monkeypatch, "fields: {MSH.3: HD, MSH.4: HD}\n"
                           "datatypes: {HD: {1: {method: pseudonym, namespace: hd, length: 20}, default: remove}}\n")
    site = HL7Deidentifier(profile, deid.pseudo, deid.stack, deid.clock)
    text = msg().replace("|APP|FAC|", "|APP|FAC^2.16.840.1.113883.19.5^ISO|")
    msh = fields(site.deidentify(text), "MSH")
    assert msh[2] == deid.pseudo.token("hd", "APP", 20) and msh[3] == deid.pseudo.token("hd", "FAC", 20) + "^^"
    assert msh[4:6] == ["RCV", "RFAC"] and "2.16.840" not in "|".join(msh)
    assert fields(site.deidentify(text), "MSH")[9] == fields(site.deidentify(text), "MSH")[9]


def test_cross_message_links_match(deid):
    a = deid.deidentify(msg("ORC|NW|PLAC1^LAB|FILL1^LAB", "OBR|1|PLAC1^LAB|FILL1^LAB|X"))
    b = deid.deidentify(msg("MRG|MRN12345^^^HOSP&2.16.840.1.113883.19.5&ISO^MR"))
    assert fields(a, "ORC")[2] == fields(a, "OBR")[2] and fields(a, "ORC")[3] == fields(a, "OBR")[3]
    assert fields(b, "MRG")[1].split("^")[0] == fields(b, "PID")[3].split("^")[0]


def test_mrn_pseudonym_equals_the_fhir_one(deid, test_key):
    """A Patient with identifier system S and value V, and PID-3 = V with an authority that maps to S."""
    patient = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": {
        "resourceType": "Patient", "id": "p1",
        "identifier": [{"type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203", "code": "MR"}]},
                        "system": "urn:oid:2.16.840.1.113883.19.5", "value": "MRN12345"}]}}]}
    fhir_out = make_engine(test_key).deidentify(patient).resource
    fhir_mrn = fhir_out["entry"][0]["resource"]["identifier"][0]["value"]
    hl7_mrn = fields(deid.deidentify(msg()), "PID")[3].split("^")[0]
    assert hl7_mrn == fhir_mrn
    # the configured table: namespace "GOOD HEALTH HOSPITAL" → the same system
    other = msg().replace("HOSP&2.16.840.1.113883.19.5&ISO", "GOOD HEALTH HOSPITAL")
    assert fields(deid.deidentify(other), "PID")[3].split("^")[0] == fhir_mrn


def test_ed_text_payload_is_scanned_and_pdf_removed(deid):
    note = base64.b64encode(b"Discharge summary for Donna Quixote").decode()
    out = deid.deidentify(msg(f"OBX|1|ED|NOTE||^TEXT^PLAIN^Base64^{note}||||||F",
                              "OBX|2|ED|PDF||^application^pdf^Base64^JVBERi0xLjQK||||||F"))
    ed = fields(out, "OBX")[5].split("^")
    assert base64.b64decode(ed[4]).decode() == "Discharge summary for [NAME] [NAME]"
    assert [s for s in out.split("\r") if s.startswith("OBX|2")][0].split("|")[5] == "^application^pdf^Base64^"


def test_file_text_with_batch_envelope_and_line_feeds(deid):
    text = "\ufeffFHS|^~\\&|APP\nBHS|^~\\&|APP\n" + msg().replace("\r", "\r\n") + msg() + "BTS|2\nFTS|1\n"
    out = deid.deidentify_file_text(text)
    assert [s[:3] for s in out.split("\r") if s] == ["FHS", "BHS", "MSH", "PID", "MSH", "PID", "BTS", "FTS"]
    assert "Quixote" not in out


def test_bad_input_and_refusal(deid, monkeypatch):
    with pytest.raises(InputError):
        deid.deidentify("hello, world")
    with pytest.raises(InputError):
        deid.deidentify(msg() + msg())

    def broken(texts, known):
        raise DetectorError("patterns: crashed")

    monkeypatch.setattr(deid.stack, "detect_many", broken)
    with pytest.raises(RecordRefused) as e:
        deid.deidentify(msg("NTE|1||Donna Quixote"))
    assert "Quixote" not in str(e.value)


def test_longitudinal_shifts_one_offset_per_patient(test_key):
    deid = HL7Deidentifier.from_names("longitudinal", Pseudonymizer(test_key), build_stack("patterns"), lambda: FIXED_TODAY)
    out = deid.deidentify(msg("EVN|A01|20240101120000+0100"))
    born, event = fields(out, "PID")[7], fields(out, "EVN")[2]
    assert len(born) == 8 and born != "19700312" and event.endswith("120000+0100") and len(event) == 19


def test_cli_bad_message_exit_2_and_detector_failure_exit_3_write_nothing(tmp_path, test_key_file, monkeypatch):
    from typer.testing import CliRunner

    src = tmp_path / "in"
    src.mkdir()
    (src / "bad.hl7").write_text("not an HL7 message\n")
    (src / "good.hl7").write_bytes(msg("NTE|1||Donna Quixote").encode())
    runner = CliRunner()
    args = ["hl7", str(src), str(tmp_path / "out"), "--key-file", str(test_key_file)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert not (tmp_path / "out" / "bad.hl7").exists() and (tmp_path / "out" / "good.hl7").exists()
    (src / "bad.hl7").unlink()

    def boom(self, texts, known):
        raise DetectorError("patterns: injected")

    monkeypatch.setattr(stack.TextStack, "detect_many", boom)
    result = runner.invoke(app, ["hl7", str(src), str(tmp_path / "out2"), "--key-file", str(test_key_file)])
    assert result.exit_code == 3
    assert "Quixote" not in result.output
    assert not (tmp_path / "out2" / "good.hl7").exists()
