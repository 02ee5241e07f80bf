"""Narrative and text attachments are read as rendered: attributes, markup that splits a word, character
references, and entities that cannot be read (issue #17, items 2, 3, 4 and 12)."""
from __future__ import annotations

import base64
import json

import pytest

from conformance import safe_harbor
from fhir_transforms.errors import InputError
from fhir_transforms.r4.record import output_texts
from fhir_transforms.r4.walker import WrittenSlots
from tests.conftest import run_cli

XHTML = 'xmlns="http://www.w3.org/1999/xhtml"'


def patient(div: str, given: str = "Harold", family: str = "Finch") -> dict:
    return {"resourceType": "Patient", "id": "p1", "name": [{"family": family, "given": [given]}],
            "identifier": [{"system": "http://hl7.org/fhir/sid/us-ssn", "value": "987-65-4329"}],
            "text": {"status": "generated", "div": f"<div {XHTML}>{div}</div>"}}


def document(content_type: str, note: str, given: str, family: str) -> dict:
    """A Bundle of a patient and a note about them in an attachment."""
    data = base64.b64encode(note.encode("utf-8")).decode()
    return {"resourceType": "Bundle", "type": "collection", "entry": [
        {"fullUrl": "urn:uuid:p1", "resource": {"resourceType": "Patient", "id": "p1",
                                                 "name": [{"family": family, "given": [given]}]}},
        {"fullUrl": "urn:uuid:d1", "resource": {
            "resourceType": "DocumentReference", "id": "d1", "status": "current", "subject": {"reference": "Patient/p1"},
            "content": [{"attachment": {"contentType": content_type, "data": data}}]}}]}


def note_of(out: dict) -> str:
    return base64.b64decode(out["entry"][1]["resource"]["content"][0]["attachment"]["data"]).decode("utf-8")


@pytest.mark.parametrize("markup", [
    '<table summary="Patient Harold Finch 987-65-4329"><tr><td>x</td></tr></table>',
    '<table><tr><td abbr="Harold Finch 987-65-4329">x</td></tr></table>',
    '<p class="Harold Finch 987-65-4329">x</p>',
    '<p id="Harold-Finch-987-65-4329">x</p>',
    '<p style="font-family: Harold Finch 987-65-4329">x</p>',
    '<p onclick="Harold Finch 987-65-4329">x</p>',
    '<table width="987-65-4329"><tr><td>x</td></tr></table>',
    '<p lang="Harold Finch">x</p>',
])
def test_no_attribute_carries_a_name_or_ssn_out(engine, markup):
    div = engine.deidentify(patient(markup)).resource["text"]["div"]
    assert "Harold" not in div and "Finch" not in div
    assert "987-65-4329" not in div and "987654329" not in div


def test_safe_attributes_are_kept_and_a_masked_title_stays(engine):
    markup = ('<table border="1" width="50%"><tr><td colspan="2" align="center" class="hdr">'
              '<a href="#n1" title="Chart of Harold Finch" id="n1">chart</a></td></tr></table>')
    div = engine.deidentify(patient(markup)).resource["text"]["div"]
    for kept in ('border="1"', 'width="50%"', 'colspan="2"', 'align="center"', 'class="hdr"', 'href="#n1"', 'id="n1"',
                 'title="Chart of [NAME]'):
        assert kept in div


@pytest.mark.parametrize("markup", [
    "Patient <span>Zyx</span>wvut Qqq<b>planted</b>",
    "Patient Zy<i>xw</i>vut <em>Qqq</em>planted",
])
def test_markup_that_splits_a_name_is_read_as_rendered(engine, markup):
    out = engine.deidentify(patient(markup, "Zyxwvut", "Qqqplanted"))
    rendered_out = out.resource["text"]["div"]
    for part in ("Zyx", "wvut", "Qqq", "planted", "xw"):
        assert part not in rendered_out
    assert "Patient" in rendered_out


def test_the_leak_guard_reads_a_name_split_by_inline_markup():
    """What the guard reads of a div holds the name as rendered, and the name's halves apart."""
    read = output_texts({"div": f"<div {XHTML}>Zyx<span>wvut</span> Qqq<b>planted</b></div>"}, WrittenSlots())
    assert any("Zyxwvut Qqqplanted" in text for text in read)
    assert any("Zyx wvut" in text for text in read)


def test_block_markup_keeps_words_apart(engine):
    """Cells are read apart: "Harold" and "Finch" in two cells are not one word "HaroldFinch"."""
    read = output_texts({"div": f"<div {XHTML}><table><tr><td>Harold</td><td>Finch</td></tr></table></div>"}, WrittenSlots())
    assert len(read) == 1 and "Harold\n\nFinch" in read[0]
    div = engine.deidentify(patient("<table><tr><td>Harold</td><td>Finch</td></tr></table>")).resource["text"]["div"]
    assert "Harold" not in div and "Finch" not in div and "[NAME]" in div


@pytest.mark.parametrize("content_type,note", [
    ("text/html", "<p>Seen: Jos&eacute; Garc&iacute;a and Zyxw&#118;ut Qqq&#x70;lanted</p>"),
    ("text/html", "<p>Seen: Jos&#233; Garc&#237;a and Zyx<span>wvut</span> Qqqplanted</p>"),
    ("application/xml", "<note><who>Jos&#233; Garc&#xED;a</who><also>Zyxw&#118;ut Qqqplanted</also></note>"),
    ("text/rtf", r"{\rtf1\ansi Seen: Jos\'e9 Garc\u237?a and Zyxw\b vut\b0  Qqqplanted\par}"),
])
def test_character_references_in_attachments_are_decoded_before_detection(engine, content_type, note):
    bundle = document(content_type, note, "José", "García")
    bundle["entry"].append({"fullUrl": "urn:uuid:p2", "resource": {
        "resourceType": "Patient", "id": "p2", "name": [{"family": "Qqqplanted", "given": ["Zyxwvut"]}]}})
    out = note_of(engine.deidentify(bundle).resource)
    for part in ("Jos", "Garc", "Zyx", "vut", "Qqq", "&#118;", "&#x70;", "&eacute;", "\\'e9", "\\u237"):
        assert part not in out
    assert "Seen" in out or content_type == "application/xml"


def test_an_entity_xml_does_not_define_in_an_xml_attachment_is_bad_input(engine):
    with pytest.raises(InputError, match="entity"):
        engine.deidentify(document("application/xml", "<note>Jos&eacute; Garc&iacute;a</note>", "José", "García"))


@pytest.mark.parametrize("div,reason", [
    ('<!DOCTYPE div [<!ENTITY x "Harold">]><div ' + XHTML + '>Harold &x; Finch</div>', "DOCTYPE"),
    (f"<div {XHTML}>Harold &x; Finch</div>", "entity XHTML does not define"),
    (f"<div {XHTML}>Jos&eacute; Garc&iacute;a</div>", "entity XHTML does not define"),
])
def test_an_entity_that_cannot_be_read_is_bad_input_through_the_cli(tmp_path, test_key_file, div, reason):
    source = patient("x")
    source["text"]["div"] = div
    (tmp_path / "in.json").write_text(json.dumps(source))
    proc = run_cli("fhir", str(tmp_path / "in.json"), str(tmp_path / "out.json"), "--stack", "patterns",
                   "--audit", "off", key_file=test_key_file)
    assert proc.returncode == 2
    assert reason in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr and "Harold" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out.json").exists()


def test_the_conformance_check_reads_markup_as_rendered():
    before = patient("x", "Zyxwvut", "Garcíaz")
    after = {"resourceType": "Patient", "text": {"div": f"<div {XHTML}>Zyx<span>wvut</span></div>"},
             "content": [{"attachment": {"contentType": "text/html",
                                         "data": base64.b64encode(b"Garc&iacute;az").decode()}}]}
    assert safe_harbor.leaks_in(before, after) == ["name", "name"]


@pytest.mark.parametrize("written", ["Jose Garciaz", "Zyx\u200bwvut", "Z\u0443xwvut", "\uff3ayxwvut", "the Zyxwvuts",
                                     "MrGarciaz", "tuvwxyZ", "Zyx\\H\\wvut", "\\u005ayxwvut"])
def test_the_conformance_check_reads_names_in_normal_form(written):
    """The checker has a normal form of its own (it shares no code with the engine): accents, invisible and
    look-alike characters, fullwidth forms, a plural, a glued title, a reversal, HL7 and JSON escapes (issue #36)."""
    before = patient("x", "Zyxwvut", "Garcíaz")
    after = {"resourceType": "Patient", "text": {"div": f"<div {XHTML}>Seen {written} today</div>"}}
    assert safe_harbor.leaks_in(before, after) == ["name"]


@pytest.mark.parametrize("markup", [
    '<table summary="Patient 987-65-4329"><tr><td>x</td></tr></table>',
    '<table><tr><td abbr="SSN 987-65-4329">x</td></tr></table>',
    '<p class="ssn 987-65-4329">x</p>',
    '<p id="ssn-987-65-4329">x</p>',
])
def test_attributes_go_through_the_text_stack_where_no_identifier_is_known(engine, markup):
    """An Observation knows no SSN: only the text stack can find it in an attribute."""
    obs = {"resourceType": "Observation", "status": "final", "code": {"text": "x"},
           "text": {"status": "generated", "div": f"<div {XHTML}>{markup}</div>"}}
    div = engine.deidentify(obs).resource["text"]["div"]
    assert "987-65-4329" not in div and ">x<" in div
