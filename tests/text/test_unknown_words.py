"""The recall layer for words no dictionary knows (#32): names and places from everywhere, never clinical words."""
from __future__ import annotations

import pytest

from text_deid import replace
from text_deid.detectors.unknown_words import UnknownWordDetector, is_known_word
from text_deid.second_opinion import vetoable
from text_deid.spans import Span
from text_deid.stack import STACKS, build_stack


@pytest.fixture(scope="module")
def in_context():
    return UnknownWordDetector(in_context_only=True)


@pytest.fixture(scope="module")
def everywhere():
    return UnknownWordDetector(in_context_only=False)


def found(detector, text):
    return [(text[s.start:s.end], s.category) for s in detector.detect(text)]


@pytest.mark.parametrize("text, expected", [
    ("My name is Rubija.", ("Rubija", "NAME")),
    ("Dear Okonkwo, your results are back.", ("Okonkwo", "NAME")),
    ("Seen with her neighbour Søndergaard today.", ("Søndergaard", "NAME")),
    ("Sometimes people call me višeslav.", ("višeslav", "NAME")),       # lower case after a strong cue
    ("Telkämper, can you call the ward?", ("Telkämper", "NAME")),
    ("Nguyễn Thảo brought the forms.", ("Nguyễn Thảo", "NAME")),          # two rare capitalized words
    ("He grew up in Tromsø before moving.", ("Tromsø", "GEOGRAPHIC_LOCATION")),
    ("She is based in NAANTALI now.", ("NAANTALI", "GEOGRAPHIC_LOCATION")),
    ("Kwabena and Murphy signed the consent.", ("Murphy", "NAME")),      # a list with an unknown name
    ("She named him Frank after his grandfather.", ("Frank", "NAME")),   # a common word named as a name
])
def test_words_no_dictionary_knows_are_found_where_a_name_or_place_stands(in_context, text, expected):
    assert expected in found(in_context, text)


def test_a_capitalized_unknown_word_alone_needs_the_recall_first_stack(in_context, everywhere):
    text = "Why is Katrine so quiet today?"
    assert found(in_context, text) == []
    [span] = everywhere.detect(text)
    assert text[span.start:span.end] == "Katrine" and span.confidence < 0.6  # below review thresholds


@pytest.mark.parametrize("text", [
    "Started Keppra and Eliquis; Lasix held. Zosyn given.",         # drugs
    "Troponin and Creatinine pending; Echocardiogram normal.",      # clinical vocabulary
    "B Natriuretic Peptide",                                        # a test's name in title case
    "Hx of Crohn disease; Salmonella, Shigella and Campylobacter.",
    "other STECs, and Aeromonas",                                   # an abbreviation's plural
    "PCM said AFib is a concern.",                                  # a mixed-case abbreviation
    "Mother has HTN, COPD and CABG x2 at age 70.",                  # abbreviations
    "Step-Grandmother\nPheasant shot",                              # a cue on another line
    "step-mother visor opening",                                    # a weak cue before a lower-case word
    "Lives with her daughter in the city.",
    "Travelling to Estonia next week.",                             # a country is no Safe Harbor place
    "The drug is named Lasix; the test is called Troponin.",        # named, but a drug and a lab
])
def test_clinical_and_common_words_are_not_candidates(in_context, text):
    assert found(in_context, text) == []


def test_known_words():
    assert is_known_word("metformin") and is_known_word("Keppra") and is_known_word("COPD")
    assert is_known_word("patient") and not is_known_word("Okonkwo") and not is_known_word("Søndergaard")


def test_the_stacks_use_the_layer_as_the_issue_says():
    assert "unknown-words-in-context" in STACKS["no-llm"]
    assert "unknown-words" in STACKS["recall-first"] and "unknown-words" in STACKS["balanced"]
    # balanced: the LLM's second opinion reviews the layer's candidates
    assert vetoable(Span(0, 7, "NAME", "unknown-words", 0.5), [], "Katrine is here")


def test_the_no_llm_stack_masks_the_adversarial_context_only_names():
    text = ("Her neighbour Søndergaard drove her in. Daughter Ó Briain-Okonkwo called; "
            "my name is bertram, wrote the nephew from Tromsø.")
    redacted = replace.apply(text, build_stack("no-llm").detect(text), replace.tag)
    for word in ("Søndergaard", "Briain", "Okonkwo", "bertram", "Tromsø"):
        assert word not in redacted


def test_a_huge_text_stops_at_the_records_deadline_and_costs_in_proportion_to_its_length():
    # issue 36: a 2 MB attachment without line breaks kept this detector busy long after its request was answered
    import time

    from text_deid import budget
    from text_deid.spans import DetectorError

    detector = UnknownWordDetector(in_context_only=False)
    text = "Seen today with Qorvath and the patient was well. " * 40_000  # 2 MB, one line
    start = time.monotonic()
    with budget.within(0.2), pytest.raises(DetectorError, match="over its time budget"):
        detector.detect(text)
    assert time.monotonic() - start < 5
