"""Property: any known name, in any of the spellings of the red team (issue #36), in any narrative place of a FHIR
record or an HL7v2 message, is masked or the record refused (exit 3): never written with success."""
from __future__ import annotations

import base64
import json
import re
import sys
import unicodedata

import pytest

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fhir_transforms.errors import RecordRefused
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.message import Delimiters, decode
from fhir_transforms.hl7v2.rules import load_hl7_profile
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import FIXED_TODAY, TEST_SECRET, make_engine
from text_deid.stack import build_stack

KEY = Key(key_id_for(TEST_SECRET), TEST_SECRET)
FHIR = make_engine(KEY, validate=False)
HL7 = HL7Deidentifier(load_hl7_profile("safe-harbor"), Pseudonymizer(KEY), build_stack("patterns"), lambda: FIXED_TODAY)

CYRILLIC = str.maketrans("aceopxyiABCEHKMOPTXY", "асеорхуіАВСЕНКМОРТХУ")


def _strip(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", s) if not unicodedata.combining(c))


def _inside(mark: str):
    return lambda p: p[:2] + mark + p[2:]


# name -> (the text written for each part, what joins the parts); each part's text must not survive
SPELLINGS = {
    "as written": (lambda p: p, " "),
    "NFD": (lambda p: unicodedata.normalize("NFD", p), " "),
    "accents stripped": (_strip, " "),
    "zero-width space": (_inside("\u200b"), " "),
    "zero-width joiner": (_inside("\u200d"), " "),
    "soft hyphen": (_inside("\u00ad"), " "),
    "right-to-left mark": (_inside("\u200f"), " "),
    "Cyrillic look-alikes": (lambda p: p.translate(CYRILLIC), " "),
    "fullwidth Latin": (lambda p: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in p), " "),
    "capitals plural": (lambda p: p.upper() + "S", " "),
    "plural": (lambda p: p + "s", " and the "),
    "possessive": (lambda p: p + "'s", " "),
    "glued title": (lambda p: "Mr" + p, " "),
    "digits": (lambda p: p + "604", " "),
    "glued to a word": (lambda p: "seen" + p, " "),
    "HL7 .sp": (lambda p: p, r"\.sp2\ "[:-1]),
    "HL7 .in": (lambda p: p, r"\.in2\ "[:-1]),
    "HL7 .ti": (lambda p: p, r"\.ti3\ "[:-1]),
    "HL7 .sk": (lambda p: p, r"\.sk1\ "[:-1]),
    "HL7 component escape": (lambda p: p, r"\S\ "[:-1]),
    "HL7 repetition escape": (lambda p: p, r"\R\ "[:-1]),
    "HL7 highlight inside": (lambda p: p[:2] + r"\H\ "[:-1] + p[2:], " "),
    "reversed": (lambda p: p[::-1], " "),
    "table cells": (lambda p: p, "</td><td>"),
}
MARKUP = {  # readable only where the place's text is markup, JSON or not HL7
    "HTML references": (lambda p: "".join(f"&#{ord(c)};" for c in p), " "),
    "JSON \\u escapes": (lambda p: "".join(f"\\u{ord(c):04x}" for c in p), " "),
}
HL7_ONLY = {"HL7 component separator": (lambda p: p, "^"), "HL7 repetition separator": (lambda p: p, "~")}
FHIR_PLACES = ("text.div", "note", "text/plain attachment", "application/json attachment")
HL7_PLACES = ("OBX-5 TX", "NTE-3")


def fhir_output(given_name: str, family: str, text: str, place: str) -> str | None:
    """Everything a reader of the output sees, or None when the record is refused."""
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": family, "given": [given_name]}]}
    other = {"resourceType": "Observation", "id": "o1", "status": "final", "code": {"text": "note"},
             "subject": {"reference": "Patient/p1"}}
    if place == "text.div":
        other["text"] = {"status": "generated",
                         "div": f'<div xmlns="http://www.w3.org/1999/xhtml">Seen {text} today.</div>'}
    elif place == "note":
        other["note"] = [{"text": f"Seen {text} today."}]
    else:
        json_note = place.startswith("application/json")
        body = json.dumps({"note": "Seen @ today."}).replace("@", text) if json_note else f"Seen {text} today."
        other = {"resourceType": "DocumentReference", "id": "d1", "status": "current", "subject": {"reference": "Patient/p1"},
                 "content": [{"attachment": {"contentType": place.split()[0],
                                             "data": base64.b64encode(body.encode()).decode()}}]}
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": patient}, {"resource": other}]}
    try:
        out = FHIR.deidentify(bundle).resource
    except RecordRefused:
        return None
    seen = [json.dumps(out, ensure_ascii=False)]
    for c in out["entry"][1]["resource"].get("content", []):
        seen.append(base64.b64decode(c["attachment"]["data"]).decode())
    return "\n".join(seen)


def hl7_output(given_name: str, family: str, text: str, place: str) -> str | None:
    segment = f"OBX|1|TX|11506-3^Progress note^LN||Seen {text} today.||||||F" if place == "OBX-5 TX" \
        else f"NTE|1||Seen {text} today."
    message = "\r".join(["MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ORU^R01^ORU_R01|CTRL1|P|2.5.1",
                         f"PID|1||MRN12345^^^HOSP^MR||{family}^{given_name}||19700312|F", "OBR|1", segment]) + "\r"
    try:
        return HL7.deidentify(message)
    except RecordRefused:
        return None


URL = re.compile(r"https?://[^\s\"]*")


def survivors(given_name: str, family: str) -> list[tuple[str, str]]:
    """(spelling, place) of every combination in which a written part survived with success."""
    found = []
    for places, run, spellings in ((FHIR_PLACES, fhir_output, SPELLINGS | MARKUP),
                                   (HL7_PLACES, hl7_output, SPELLINGS | HL7_ONLY)):
        for spelling, (write, join) in spellings.items():
            parts = [write(given_name), write(family)]
            if spelling == "reversed":
                parts.reverse()
            for place in places:
                text = join.join(parts)
                if spelling == "reversed" and place == "text.div":
                    text = f'<bdo dir="rtl">{text}</bdo>'
                if "<td>" in text and place == "text.div":
                    text = f"<table><tr><td>{text}</td></tr></table>"
                out = run(given_name, family, text, place)
                if out is not None:
                    out = URL.sub("", out)  # the output's own code-system URLs ("CodeSystem" holds "Syste")
                written = (*parts, given_name, family)
                # in JSON output a line break inside what was written reads "\\n"
                if out is not None and any(w in out for p in written for w in (p, json.dumps(p, ensure_ascii=False)[1:-1])):
                    found.append((spelling, place))
    return found


COMBINATIONS = (len(SPELLINGS) + len(MARKUP)) * len(FHIR_PLACES) + (len(SPELLINGS) + len(HL7_ONLY)) * len(HL7_PLACES)
# parts of 5 letters or more, the distinctiveness rule (docs/text-stack.md: a shorter part is not looked for inside
# a longer token or reversed); the letters include those with accents, and those that do not decompose
LETTERS = "bcdfghjklmnpqrstvwxzaeiouyéñüøłçåžš"
PART = st.text(st.sampled_from(LETTERS), min_size=5, max_size=11).map(str.capitalize)


@settings(max_examples=30, deadline=None)
@given(PART, PART)
@example("Zyxwvut", "Qqqplanted")
@example("Josélito", "García")
@example("Joanna", "Kowalczyk")
@example("Łukasz", "Wałęsa")
@example("Zoëlle", "Øyelund")
@example("Aaaaa", "Syste")  # a part inside the output's own "CodeSystem" URLs is no survivor
def test_a_known_name_in_any_spelling_in_any_place_is_masked_or_refused(given_name, family):
    assert survivors(given_name, family) == []


def test_hl7_formatting_commands_read_as_a_word_break():
    d = Delimiters()
    for sequence, reads in [(r"\.sp2\ ", "\n"), (r"\.in2\ ", " "), (r"\.ti3\ ", " "), (r"\.sk1\ ", " "), (r"\.br\ ", "\n"),
                            (r"\.ce\ ", "\n")]:
        assert decode("Zyxwvut" + sequence[:-1] + "Qqqplanted", d)[0] == f"Zyxwvut{reads}Qqqplanted"


def _pieces(sep: str):
    return lambda p: p[:4] + sep + p[4:]


# a distinctive part written in pieces: split by a space, a hyphen, a line break, markup or an escape
SPLIT = {"split by a space": (_pieces(" "), " "), "split by a hyphen": (_pieces("-"), " "),
         "split by a tab": (_pieces("\t"), " ")}
SPLIT_MARKUP = {"split by a line break": (_pieces("\n"), " "), "hyphenated at a line break": (_pieces("-\n"), " "),
                "split by <br/>": (_pieces("<br/>"), " "), "split by JSON \\n": (_pieces("\\n"), " ")}
SPLIT_HL7 = {"split by \\.br\\": (_pieces("\\.br\\"), " "), "split by \\X0D\\": (_pieces("\\X0D\\"), " "),
             "split by a component separator": (_pieces("^"), " "), "split by a repetition": (_pieces("~"), " ")}


@pytest.mark.parametrize("given_name, family", [("Zyxwvut", "Qqqplanted"), ("Joanna", "Kowalczyk"),
                                                ("Łukasz", "Wałęsa")])
def test_a_name_part_written_in_pieces_is_masked(monkeypatch, given_name, family):
    monkeypatch.setattr(sys.modules[__name__], "SPELLINGS", SPLIT)
    monkeypatch.setattr(sys.modules[__name__], "MARKUP", SPLIT_MARKUP)
    monkeypatch.setattr(sys.modules[__name__], "HL7_ONLY", SPLIT_HL7)
    assert survivors(given_name, family) == []


# a part split over table cells on lines of their own, indented as narrative generators write them (the white
# space between the cells is longer than the gap allowed between pieces, but is no character of the text)
ROW, CELL = "\n          ", "\n            "
CELLS = {"split over indented cells": (_pieces(f"</td>{CELL}<td>"), " "),
         "split over indented rows": (_pieces(f"</td>{ROW}</tr>{ROW}<tr>{CELL}<td>"), " ")}
CELLS_HL7 = {"split over cells, \\.br\\ and spaces between": (_pieces("</td>\\.br\\            <td>"), " ")}


@pytest.mark.parametrize("given_name, family", [("Zyxwvut", "Qqqplanted"), ("Joanna", "Kowalczyk"),
                                                ("Łukasz", "Wałęsa")])
def test_a_name_part_split_over_table_cells_is_masked(monkeypatch, given_name, family):
    monkeypatch.setattr(sys.modules[__name__], "SPELLINGS", {})
    monkeypatch.setattr(sys.modules[__name__], "MARKUP", CELLS)
    monkeypatch.setattr(sys.modules[__name__], "HL7_ONLY", CELLS_HL7)
    assert survivors(given_name, family) == []


def test_a_name_part_split_over_rendered_cells_is_found():
    """The narrative's text as rendered: a break for each cell's tags, the indentation between them kept."""
    from text_deid.detectors.known_identifiers import find_known
    from text_deid.spans import KnownIdentifier

    text = f"\n\nSeen\n\n\nKowa\n{CELL}\nlczyk\n{ROW}\n"
    spans = find_known(text, (KnownIdentifier("Joanna Kowalczyk", "NAME"),))
    assert [text[s.start:s.end] for s in spans] == [f"Kowa\n{CELL}\nlczyk"]


@pytest.mark.parametrize("name, text", [
    ("Adam Newman", "Seen with a new man today."),            # pieces that are words of their own
    ("Sonia Smithers", "Seen his on iatrogenic rash today."),  # letters that spell the part across words' middles
    ("Adam Newman", f"<td>new</td>{CELL}<td>man</td>"),       # words of their own in cells
])
def test_words_that_only_spell_a_name_together_are_kept(name, text):
    from text_deid.detectors.known_identifiers import find_known
    from text_deid.spans import KnownIdentifier

    assert find_known(text, (KnownIdentifier(name, "NAME"),)) == []


def test_a_name_split_over_consecutive_nte_segments_is_masked():
    """A comment's NTE lines are one text: a part begun on one line and ended on the next is found."""
    message = "\r".join(["MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ORU^R01^ORU_R01|CTRL1|P|2.5.1",
                         "PID|1||MRN12345^^^HOSP^MR||Kowalczyk^Joanna||19700312|F", "OBR|1",
                         "NTE|1||Seen with Mrs Kowa", "NTE|2||lczyk today."]) + "\r"
    out = HL7.deidentify(message)
    assert "Kowa" not in out and "lczyk" not in out
    assert out.count("NTE|") == 2  # each line stays in its own segment
