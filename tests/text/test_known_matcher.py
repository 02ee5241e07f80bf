"""The known-identifier matcher skips identifiers whose needles a text lacks: it must find exactly what
trying every form of every identifier finds, for any way the values are written."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from text_deid import leak_guard
from text_deid.detectors.known_identifiers import (_AFTER_LOWER, _ALNUM_WHEN_LOWERED, _BEFORE_LOWER, B, DATE_SHAPE_RE, E,
                                                   MONTHS, date_readings, date_shapes, find_known, find_known_many,
                                                   forms, occurs_in_any, project)
from text_deid.spans import KnownIdentifier


def every_form(text: str, known: tuple[KnownIdentifier, ...]) -> list[tuple[int, int, str]]:
    """The reference: one alternation of all forms per category, no prefilter."""
    by_category: dict[str, set[str]] = {}
    for k in known:
        if k.category != "DATE":
            by_category.setdefault(k.category, set()).update(forms(k))
    found = []
    for category, alts in sorted(by_category.items()):
        if alts:
            pattern = re.compile(f"{B}(?:{'|'.join(sorted(alts, key=lambda a: (-len(a), a)))}){E}", re.IGNORECASE)
            found += [(m.start(), m.end(), category) for m in pattern.finditer(text) if m.end() > m.start()]
    days = {tuple(int(g) for g in k.value.split("-")) for k in known if k.category == "DATE"}
    found += [(m.start(), m.end(), "DATE") for m in DATE_SHAPE_RE.finditer(text) if date_readings(m) & days]
    return sorted(found)


def matched(text: str, known: tuple[KnownIdentifier, ...]) -> list[tuple[int, int, str]]:
    return sorted((s.start, s.end, s.category) for s in find_known(text, known))


SEPARATORS = st.sampled_from([" ", "  ", "\u00a0", "\t", "-", ".", "/", ", ", "(", ")", "", "\u2009", "\n"])
LETTERS = st.sampled_from(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéÉſKİı"))
WORD = st.text(LETTERS, min_size=1, max_size=8)
DIGITS = st.text(st.sampled_from("0123456789"), min_size=1, max_size=5)


@st.composite
def record_and_text(draw):
    given_name, family = draw(WORD), draw(WORD)
    phone = draw(st.text(st.sampled_from("0123456789"), min_size=10, max_size=10))
    mrn = draw(DIGITS) + draw(st.sampled_from(["-", "", "/"])) + draw(DIGITS)
    street = f"{draw(DIGITS)} {draw(WORD)} {draw(st.sampled_from(['St', 'Road', 'Lane']))}"
    known = (KnownIdentifier(f"{given_name} {family}", "NAME"), KnownIdentifier(phone, "PHONE_NUMBER"),
             KnownIdentifier(mrn, "MEDICAL_RECORD_NUMBER"), KnownIdentifier(street, "GEOGRAPHIC_LOCATION"),
             KnownIdentifier("02139", "GEOGRAPHIC_LOCATION"), KnownIdentifier("2021-03-07", "DATE"))

    def case(s: str) -> str:
        return "".join(c.upper() if draw(st.booleans()) else c.lower() for c in s)

    def spaced(parts: list[str]) -> str:
        return "".join(p + draw(SEPARATORS) for p in parts[:-1]) + parts[-1]

    pieces = [
        case(given_name), case(family), spaced([case(family), case(given_name)]), spaced([given_name[0], family]),
        spaced(list(phone)), spaced([phone[:3], phone[3:6], phone[6:]]), spaced(re.split(r"\D+", mrn)),
        spaced(street.split()), "02139-1234", "3/7/21", "March 7, 2021", draw(WORD), draw(DIGITS),
    ]
    chosen = draw(st.lists(st.sampled_from(pieces), min_size=1, max_size=6))
    return known, "".join(p + draw(SEPARATORS) for p in chosen)


@settings(max_examples=400, deadline=None)
@given(record_and_text())
def test_prefilter_finds_what_every_form_finds(case):
    known, text = case
    assert matched(text, known) == every_form(text, known)


def test_projection_folds_case_as_re_does_and_drops_separators():
    assert project("Jöhn  SMITH (555) 123-4567") == "jöhnsmith5551234567"
    for a, b in [("ſ", "s"), ("K", "k"), ("İ", "i"), ("Σ", "σ"), ("ς", "σ")]:
        assert re.fullmatch(re.escape(b), a, re.IGNORECASE)  # re treats them as the same letter ...
        assert project(a) == project(b)  # ... and so must the projection


def test_ascii_text_projects_as_any_text_does():
    every_ascii = "".join(map(chr, range(128)))
    assert project(every_ascii) == every_ascii.translate(_BEFORE_LOWER).lower().translate(_AFTER_LOWER)


def test_needles_skip_identifiers_a_text_cannot_hold():
    known = (KnownIdentifier("Ada Lovelace", "NAME"), KnownIdentifier("617-555-0101", "PHONE_NUMBER"))
    assert matched("no identifiers here", known) == []
    assert matched("Lovelace, Ada called from 617.555.0101", known) == [(0, 13, "NAME"), (26, 38, "PHONE_NUMBER")]


@settings(max_examples=100, deadline=None)
@given(st.lists(record_and_text(), min_size=1, max_size=4))
def test_texts_searched_together_give_each_text_its_own_spans(cases):
    known = cases[0][0]
    texts = [text for _, text in cases] + ["", "   "]
    together = find_known_many(texts, known)
    assert together == [find_known(text, known) for text in texts]


@settings(max_examples=100, deadline=None)
@given(st.lists(record_and_text(), min_size=1, max_size=4), st.data())
def test_the_leak_guard_is_clean_exactly_where_scan_finds_nothing(cases, data):
    known = cases[0][0]
    texts = [text for _, text in cases] + [data.draw(WORD), data.draw(DIGITS)]
    assert occurs_in_any(texts, known) == any(find_known_many(texts, known))
    pairs = [(f"p{i}", t) for i, t in enumerate(data.draw(st.lists(st.sampled_from(texts), min_size=1, max_size=6)))]
    distinct = list(dict.fromkeys(t for _, t in pairs))
    assert leak_guard.clean(distinct, known) == (leak_guard.scan(pairs, known) == [])


def test_date_shapes_try_every_place_a_date_can_start():
    # date_shapes looks for starts in the text lowercased with "İ" and the Kelvin sign set aside: for every
    # code point, that must keep one character one character, keep ASCII letters and digits apart from
    # the rest, keep digits digits, and turn every letter re.IGNORECASE takes for a letter of a month, an
    # ordinal or "of" into that letter (or "ſ" for "s"). Context-dependent lowercasing only chooses between σ and ς.
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    ascii_alnum = re.compile(r"[0-9A-Za-z]")
    for c in every:
        folded = ("\x00" if c in _ALNUM_WHEN_LOWERED else c).lower()
        assert len(folded) == 1, hex(ord(c))
        assert bool(ascii_alnum.fullmatch(c)) == bool(re.fullmatch(r"[0-9a-z]", folded)), hex(ord(c))
    for m in re.finditer(r"\d", every):
        assert re.fullmatch(r"\d", m[0].lower()), hex(ord(m[0]))
    for letter in set("".join(m[:3].lower() for m in MONTHS) + "stndrdthof"):  # and ordinals, "of"
        for m in re.finditer(letter, every, re.IGNORECASE):
            assert m[0].lower() in ({letter, "ſ"} if letter == "s" else {letter}), (letter, hex(ord(m[0])))


DATE_TEXT = st.lists(st.sampled_from(["3/7/21", "2021-03-07", "20210307", "March 7, 2021", "7th of Sept '21", "MAR",
                                      "ſep 7 2021", "Jan.", "de", "1", "12", "٣/٧/٢١", "\u212a", "\u0130", "Σ", "x",
                                      "a", " ", "/", "-", ".", ",", "'", "\n", "\x00", "of", "th", "2", "ST", "ſt",
                                      "nd", "OF", "19", "20240101"]), max_size=14)


@settings(max_examples=600, deadline=None)
@given(DATE_TEXT)
def test_date_shapes_find_what_the_pattern_finds(parts):
    text = "".join(parts)
    assert [m.span() for m in date_shapes(text)] == [m.span() for m in DATE_SHAPE_RE.finditer(text)]


def test_records_asking_in_turn_from_threads_each_get_their_own_matcher():
    """compile_known recognises the last tuple by identity: records that alternate, from many threads, must
    still each be matched against their own identifiers (and an empty tuple against none)."""
    import threading

    records = [(KnownIdentifier(f"Zorbel{i}son", "NAME"), KnownIdentifier(f"55{i:05d}", "MEDICAL_RECORD_NUMBER"))
               for i in range(12)] + [()]
    wrong: list[int] = []

    def work(seed: int) -> None:
        for n in range(300):
            i = (seed + n) % len(records)
            known = records[i]
            for j, other in enumerate(records):
                text = " ".join(k.value for k in other) or "nothing here"
                found = bool(find_known(text, known))
                if found != (i == j and bool(known)):
                    wrong.append(i)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
