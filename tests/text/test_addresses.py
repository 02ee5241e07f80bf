"""Addresses as a grammar (#32): streets of many languages, units, PO boxes, corners, postcodes."""
from __future__ import annotations

import pytest

from text_deid.detectors.addresses import AddressDetector
from text_deid.stack import STACKS, build_stack


@pytest.fixture(scope="module")
def detector():
    return AddressDetector()


def found(detector, text):
    return [text[s.start:s.end] for s in detector.detect(text)]


@pytest.mark.parametrize("text, address", [
    ("Sent to 26 rue des Lilas, Lyon.", "26 rue des Lilas"),
    ("Lives on Via Garibaldi 71 now.", "Via Garibaldi 71"),
    ("Moved to Petőfi tér 19. last year.", "Petőfi tér 19"),
    ("Address ul. Miła 53 in the old town.", "ul. Miła 53"),
    ("Sister at 136 Filadelfeos Str. since May.", "136 Filadelfeos Str."),
    ("Stays at Pohlstrasse 9 with family.", "Pohlstrasse 9"),
    ("Visit at Nørrevej 18 on Monday.", "Nørrevej 18"),
    ("Home: Kiannonkatu 98, Oulu.", "Kiannonkatu 98, Oulu"),
    ("calle Mayor 12, Soto del Barco, Spain", "calle Mayor 12, Soto del Barco, Spain"),
    ("Send mail to P.O. Box 242 please.", "P.O. Box 242"),
    ("Postfach 1234 is the box.", "Postfach 1234"),
    ("Write to Suite 838 upstairs.", "Suite 838"),
    ("She lives at the corner of Grünberg Allee 7 and Okafor Road.", "Grünberg Allee 7 and Okafor Road"),
    ("Zip: Hungary 34796 on the form.", "Hungary 34796"),
    ("Wysłano: 53-320 Wrocław.", "53-320 Wrocław"),
])
def test_address_forms_of_many_countries(detector, text, address):
    assert address in found(detector, text)


def test_an_address_takes_in_its_house_number_unit_city_country_and_postcode(detector):
    text = "Gregory Kudryashov  233 Erzsébet tér 19.  Suite 282  Domoszló  Hungary 34796 (37)"
    assert found(detector, text)[0] == "233 Erzsébet tér 19.  Suite 282  Domoszló  Hungary 34796"


@pytest.mark.parametrize("text", [
    "Will place IV line 2 and continue monitoring 24 hours.",
    "Drained via Foley 2 days; moved via wheelchair.",
    "Lesion at the corner of the mouth and lips.",
    "In 2019 Spain had a measles outbreak.",
    "Insurance ID 8765012 on file; 2 units PRBC given.",
    "Rue the day; the Supreme Court ruled; Lovers Lane.",
    "BP 120/80, HR 72, Box 3 checked on the form.",
])
def test_clinical_text_is_not_an_address(detector, text):
    assert found(detector, text) == []


def test_the_stacks_run_the_address_grammar():
    assert "addresses" in STACKS["no-llm"] and "addresses" in STACKS["recall-first"]
    text = "New address: Kiannonkatu 98, OULU, Finland 90100."
    spans = build_stack("no-llm").detect(text)
    assert any(text[s.start:s.end].startswith("Kiannonkatu 98") and s.category == "GEOGRAPHIC_LOCATION"
               for s in spans)
    assert "Kiannonkatu" not in "".join(text[s.end:n.start] for s, n in zip(spans, spans[1:]))
