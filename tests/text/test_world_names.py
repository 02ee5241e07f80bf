"""The world-names layer (#32): given names and surnames of many countries, in any case, never clinical words."""
from __future__ import annotations

import pytest

from text_deid.detectors.world_names import WorldNameDetector, world_names
from text_deid.stack import STACKS, build_stack


@pytest.fixture(scope="module")
def detector():
    return WorldNameDetector()


@pytest.fixture(scope="module")
def no_llm():
    return build_stack("no-llm")


@pytest.fixture(scope="module")
def without_layer():
    return build_stack("no-world-names")


def found(spans, text):
    return [(text[s.start:s.end], s.category) for s in spans]


def test_the_list_holds_names_of_many_countries_and_no_common_english_word():
    names = world_names()
    assert len(names) > 40_000
    assert {"okonkwo", "søndergaard", "nguyễn", "kowalczyk", "virtanen", "takahashi", "wójcik"} <= names
    assert {"yefremova", "ivanova"} <= names  # Cyrillic names also in Latin letters
    assert not {"the", "will", "rose", "water", "patient"} & names


@pytest.mark.parametrize("text, expected", [
    ("Why is Kowalczyk so impulsive?", ("Kowalczyk", "NAME")),            # a single capitalized name, no cue
    ("Her neighbour virtanen came by.", ("virtanen", "NAME")),             # lower case after a name cue
    ("maría gonzález brought the forms.", ("maría", "NAME")),              # two listed words side by side
    ("chukwuemeka o okonkwo\nlabor relations", ("okonkwo", "NAME")),      # with an initial between
    ("Unlike the early Yefremova poems, this one rhymes.", ("Yefremova", "NAME")),
])
def test_world_names_are_found_where_the_other_layers_miss_them(detector, no_llm, without_layer, text, expected):
    assert expected in found(detector.detect(text), text)
    assert any(text[s.start:s.end] == expected[0] for s in no_llm.detect(text))
    assert not any(s.start <= text.index(expected[0]) < s.end for s in without_layer.detect(text))


def test_a_listed_word_after_a_place_cue_is_a_place(detector):
    text = "She lives in Haugland now."  # many towns bear a family's name
    assert found(detector.detect(text), text) == [("Haugland", "GEOGRAPHIC_LOCATION")]


@pytest.mark.parametrize("text", [
    "Patient with GERD and TIA, K 3.6 - 5.1 mmol/L, metformin 500 mg bid, Foley catheter placed.",
    "Crohn disease, Hodgkin lymphoma, Apgar 9, Parkinson disease, Bell palsy.",
    "spoke with the team about it",                    # lower case and no cue: nothing
    "Travelled to Norway and Texas last year.",         # countries and states are not names
])
def test_clinical_words_abbreviations_and_countries_are_no_names(detector, text):
    assert detector.detect(text) == []


def test_an_eponym_before_its_head_word_stays_in_the_stack(no_llm):
    text = "History of Addison disease, on hydrocortisone."
    assert not any(text[s.start:s.end].startswith("Addison") for s in no_llm.detect(text))


def test_the_layer_is_in_the_default_stack_only_where_no_llm_reviews_it():
    assert "world-names" in STACKS["no-llm"]
    assert "world-names" not in STACKS["no-world-names"]
