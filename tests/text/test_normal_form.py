"""One normal form for matching: a known name in another spelling is still found by the known-identifier detector
and the leak guard, and the span covers the characters written in the original text."""
from __future__ import annotations

import unicodedata

import pytest

from text_deid import leak_guard
from text_deid.detectors.known_identifiers import find_known
from text_deid.normal_form import fold
from text_deid.spans import KnownIdentifier

ZQ = (KnownIdentifier("Zyxwvut Qqqplanted", "NAME"),)
JG = (KnownIdentifier("José García", "NAME"),)
AK = (KnownIdentifier("Anna Kowalczyk", "NAME"),)

# (case, known, text, what must be covered): each is a red-team spelling of a known name
SPELLINGS = [
    ("NFD decomposed", JG, "seen " + unicodedata.normalize("NFD", "José García") + " today",
     [unicodedata.normalize("NFD", "José García")]),
    ("accents stripped", JG, "seen Jose Garcia today", ["Jose Garcia"]),
    ("zero-width space", ZQ, "seen Zyx\u200bwvut Qqq\u200bplanted", ["Zyx\u200bwvut Qqq\u200bplanted"]),
    ("zero-width joiner", AK, "seen Kowal\u200dczyk", ["Kowal\u200dczyk"]),
    ("soft hyphen", AK, "seen Kowal\u00adczyk", ["Kowal\u00adczyk"]),
    ("direction marks", ZQ, "seen Qqq\u200fplan\u200eted", ["Qqq\u200fplan\u200eted"]),
    ("Cyrillic look-alikes", ZQ, "seen Qqq\u0440l\u0430nt\u0435d", ["Qqq\u0440l\u0430nt\u0435d"]),
    ("fullwidth Latin", AK, "seen \uff2b\uff4f\uff57\uff41\uff4c\uff43\uff5a\uff59\uff4b",
     ["\uff2b\uff4f\uff57\uff41\uff4c\uff43\uff5a\uff59\uff4b"]),
    ("plural in capitals", AK, "the KOWALCZYKS came", ["KOWALCZYKS"]),
    ("plural", ZQ, "the Qqqplanteds came", ["Qqqplanteds"]),
    ("glued title", ZQ, "seen MrQqqplanted", ["Qqqplanted"]),
    ("with digits", ZQ, "user Zyxwvut604 logged", ["Zyxwvut604"]),
    ("glued inside a token", ZQ, "seenQqqplantedtoday", ["Qqqplanted"]),
    ("HL7 .sp between parts", ZQ, r"Zyxwvut\.sp2\Qqqplanted", ["Zyxwvut", "Qqqplanted"]),
    ("HL7 .in between parts", AK, r"Anna\.in2\Kowalczyk", ["Anna", "Kowalczyk"]),
    ("HL7 .ti between parts", AK, r"Anna\.ti3\Kowalczyk", ["Anna", "Kowalczyk"]),
    ("HL7 .sk between parts", AK, r"Anna\.sk1\Kowalczyk", ["Anna", "Kowalczyk"]),
    ("HL7 component separator escaped", AK, r"Anna\S\Kowalczyk", ["Anna", "Kowalczyk"]),
    ("HL7 highlight inside a part", AK, r"Kowa\H\lczyk\N\ seen", [r"Kowa\H\lczyk"]),
    ("HL7 hex escape", AK, r"Kowalczy\X6B\ seen", [r"Kowalczy\X6B\ "[:-1]]),
    ("JSON \\u escapes", AK, '{"n": "\\u004bowalczyk"}', ["\\u004bowalczyk"]),
    ("HTML character references", AK, "seen &#75;owalczyk &amp; Anna", ["&#75;owalczyk"]),
    ("RTF hex escapes", JG, r"{\rtf1 Garc\'eda}", [r"Garc\'eda"]),
    ("reversed (bdo rtl)", ZQ, '<bdo dir="rtl">detnalpqqQ</bdo>', ["detnalpqqQ"]),
    ("reversed with an override mark", AK, "\u202ekyzclawoK", ["kyzclawoK"]),
]


@pytest.mark.parametrize("case,known,text,covered", SPELLINGS, ids=[c[0] for c in SPELLINGS])
def test_a_known_name_in_another_spelling_is_found_where_it_is_written(case, known, text, covered):
    spans = find_known(text, known)
    for piece in covered:
        at = text.index(piece)
        assert any(s.start <= at and at + len(piece) <= s.end for s in spans), (case, piece, spans)
    assert not leak_guard.clean([text], known)


# Precision: a name part inside a longer token counts only when the part is distinctive (5 letters or more)
# and the token is not an English word; a shorter part is a name as a whole token, or with a plural, digits
# or a glued title from 4 letters.
@pytest.mark.parametrize("name,text", [
    ("Adam Stone", "passed two gallstones"),
    ("Ann Porter", "the reporter called"),
    ("Ann Baker", "bread from the bakery"),
    ("Li Wu", "slight swelling, awful"),
    ("Eva Lee", "evaluation of fleet"),
    ("Noel Mann", "manner and mannitol"),
    ("Alan Marsh", "alanine aminotransferase"),
    ("Raj Patel", "patellofemoral pain"),
    ("Ann Parkinson", "drug-induced parkinsonism"),
])
def test_a_name_part_inside_an_unrelated_word_is_not_a_name(name, text):
    assert find_known(text, (KnownIdentifier(name, "NAME"),)) == []


def test_a_four_letter_part_takes_endings_but_is_not_looked_for_inside_words():
    known = (KnownIdentifier("Anna Rusk", "NAME"),)
    assert [(s.start, s.end) for s in find_known("MrRusk, Rusks, Rusk12", known)] == [(0, 6), (8, 13), (15, 21)]
    assert find_known("brusker", known) == []


def test_offsets_map_back_through_escapes_and_folded_characters():
    text = "a \\u004Bo &#x77;al Stra\u00dfe Jos\u0065\u0301 \uff21 \u200bx"
    folded = fold(text)
    assert folded.text == "a ko wal strasse jose a x"
    for word, original in [("ko", "\\u004Bo"), ("wal", "&#x77;al"), ("strasse", "Stra\u00dfe"),
                           ("jose", "Jos\u0065\u0301"), ("a x", "\uff21 \u200bx")]:
        start = folded.text.index(word, 2 if word == "a x" else 0)
        a, b = folded.original(start, start + len(word))
        assert text[a:b] == original


def test_plain_ascii_text_is_its_own_normal_form():
    text = "Seen John Smith on 3/7/2021"
    folded = fold(text)
    assert folded.text is text and folded.original(5, 15) == (5, 15)


def test_threads_folding_new_characters_at_once_get_what_one_thread_gets():
    """The fold table is filled in as characters are first met, from whichever thread meets them: 8 threads
    folding texts of characters not seen before answer as folding them one after the other does."""
    import threading

    blocks = [range(0x0400, 0x0530), range(0x1E00, 0x1F00), range(0xFF00, 0xFF60), range(0x0300, 0x0370),
              range(0x2000, 0x2070), range(0x0100, 0x0250), range(0x0370, 0x0400), range(0xAC00, 0xAC80)]
    texts = ["".join(chr(c) for c in block) + " Qqq\u200bplanted" for block in blocks]
    results: dict[int, list[tuple[str, tuple[int, int]]]] = {}
    start = threading.Barrier(len(texts))

    def work(i: int) -> None:
        start.wait()
        folded = fold(texts[i])
        results[i] = [(folded.text, folded.original(len(folded.text) - 10, len(folded.text)))]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, text in enumerate(texts):
        folded = fold(text)
        assert results[i] == [(folded.text, folded.original(len(folded.text) - 10, len(folded.text)))]
        assert folded.text.endswith(" qqqplanted") and text[slice(*results[i][0][1])] == "Qqq\u200bplanted"
