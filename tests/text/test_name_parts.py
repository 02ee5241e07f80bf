"""Name parts travel together: a NAME span grows over the parts joined to it (#32)."""
from __future__ import annotations

import pytest

from text_deid import replace
from text_deid.name_parts import join_name_parts
from text_deid.spans import KnownIdentifier, Span
from text_deid.stack import build_stack


def grown(text: str, part: str, category: str = "NAME") -> str:
    start = text.index(part)
    (span,) = join_name_parts([Span(start, start + len(part), category, "ner", 0.9)], text)
    return text[span.start:span.end]


@pytest.mark.parametrize("text, part, whole", [
    ("Seen with Garcia-Reyes today.", "Garcia", "Garcia-Reyes"),
    ("Seen with Garcia-Reyes today.", "Reyes", "Garcia-Reyes"),
    ("Tamsin Reyes-Okonkwo-Ng said so.", "Okonkwo", "Reyes-Okonkwo-Ng"),
    ("Jean‐Luc came in.", "Luc", "Jean‐Luc"),  # U+2010 hyphen
    ("Patient Willemine ten Pas will call.", "Willemine", "Willemine ten Pas"),
    ("Met Ludwig van der Berg yesterday.", "Berg", "van der Berg"),
    ("Mohammed bin Salman came.", "Mohammed", "Mohammed bin Salman"),
    ("Call Ó Briain now.", "Briain", "Ó Briain"),
    ("Call O'Brien now.", "Brien", "O'Brien"),
    ("Asked D’Angelo twice.", "Angelo", "D’Angelo"),
])
def test_the_joined_parts_go_with_the_part_found(text, part, whole):
    assert grown(text, part) == whole


@pytest.mark.parametrize("text, part", [
    ("Garcia's cat is well.", "Garcia"),          # a possessive is not a name part
    ("Garcia-like symptoms.", "Garcia"),          # a lowercase word after a hyphen
    ("Reyes-MRN 12345.", "Reyes"),                # an abbreviation after a hyphen
    ("Smith de novo mutation.", "Smith"),         # a particle not followed by a capitalized word
    ("The De Quervain tendon and Smith", "Smith"),
])
def test_what_is_not_a_name_part_stays_out(text, part):
    assert grown(text, part) == part


def test_only_names_grow():
    text = "Moved to Garcia-Reyes Street."
    assert grown(text, "Garcia", "GEOGRAPHIC_LOCATION") == "Garcia"


@pytest.mark.parametrize("stack_name", ["no-llm", "patterns"])
def test_a_known_surname_takes_its_double_barrel_with_it(stack_name):
    text = "Daughter Quillan Zyxwortel-Reyes visited; Zyxwortel-Reyes called back."
    spans = build_stack(stack_name).detect(text, [KnownIdentifier("Zyxwortel", "NAME")])
    redacted = replace.apply(text, spans, replace.tag)
    assert "Reyes" not in redacted and "Zyxwortel" not in redacted
