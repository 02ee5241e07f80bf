"""The known-identifier matcher skips identifiers whose needles a text lacks: it must find exactly what
trying every form of every identifier finds, for any way the values are written."""
from __future__ import annotations

import bisect
import re
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from text_deid import leak_guard
from text_deid.detectors.known_identifiers import (_AFTER_LOWER, _ALNUM_WHEN_LOWERED, _BEFORE_LOWER, DATE_SHAPE_RE,
                                                   GLUED_DATE_RE, MONTHS, SEPARATOR, _alternation, _candidate,
                                                   _longest_first, compile_known, date_readings, date_shapes, find_known,
                                                   _split_automaton, find_known_many, forms, glued_date_shapes, inner_forms,
                                                   occurs_in_any, split_parts,
                                                   project, search)
from text_deid.normal_form import fold, fold_value
from text_deid.spans import KnownIdentifier, Span


def in_threads(work, count: int) -> None:
    """`work(seed)` on `count` threads at once, seeds 0 to count - 1; returns when all are done."""
    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def every_form(text: str, known: tuple[KnownIdentifier, ...]) -> list[tuple[int, int, str]]:
    """The reference: one alternation of all forms per category, no prefilter, in normal form."""
    by_category: dict[str, tuple[set[str], set[str]]] = {}
    for k in known:
        if k.category != "DATE":
            folded = KnownIdentifier(fold_value(k.value), k.category)
            edged, inner = by_category.setdefault(k.category, (set(), set()))
            edged.update(forms(folded))
            inner.update(inner_forms(folded))
    found = []
    for category, (edged, inner) in sorted(by_category.items()):
        if edged or inner:
            pattern = _alternation(_longest_first(edged), _longest_first(inner))
            found += [(start, end, category) for start, end in search(pattern, fold(text))]
    days = {tuple(int(g) for g in k.value.split("-")) for k in known if k.category == "DATE"}
    found += [(m.start(), m.end(), "DATE") for m in DATE_SHAPE_RE.finditer(text) if date_readings(m) & days]
    found += [(m.start(), m.end(), "DATE") for m in glued_reference(text) if date_readings(m) & days]
    return sorted(found)


def glued_reference(text: str) -> list[re.Match]:
    """GLUED_DATE_RE tried at every place, from left to right: each match a letter touches (a letter as
    re.IGNORECASE reads [A-Za-z]: what DATE_SHAPE_RE's edges refuse) that does not overlap the one before."""
    letter, found, pos = re.compile("[A-Za-z]", re.IGNORECASE), [], 0
    for p in range(len(text)):
        m = GLUED_DATE_RE.match(text, p)
        if p >= pos and m and (letter.fullmatch(text[p - 1:p]) or letter.fullmatch(text[m.end():m.end() + 1])):
            found.append(m)
            pos = m.end()
    return found


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


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(["Aprİl 7 2021", "Aprıl", "ſept. 7 2021", "dob", "DOB:", "born", "x"]), max_size=3),
       DATE_TEXT)
def test_glued_date_shapes_find_what_the_glued_pattern_finds(words, parts):
    text = "".join(words + parts)
    assert [m.span() for m in glued_date_shapes(text)] == [m.span() for m in glued_reference(text)]


def test_records_asking_in_turn_from_threads_each_get_their_own_matcher():
    """compile_known recognises the last tuple by identity: records that alternate, from many threads, must
    still each be matched against their own identifiers (and an empty tuple against none)."""

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

    in_threads(work, 6)
    assert not wrong


# The reference for the automaton: the candidate loop the matcher ran before it (every candidate's needles
# looked for in the projected text, one alternation per category over the forms that pass, on the texts joined).
def reference_find(text: str, known: tuple[KnownIdentifier, ...]) -> list[Span]:
    regex, dates = _reference_groups(text, known)
    return regex + _split_spans(text, known) + dates


def _reference_groups(text: str, known: tuple[KnownIdentifier, ...]) -> tuple[list[Span], list[Span]]:
    """(the forms' spans, category by category; the known days' spans), as the matcher orders them."""
    candidates = [c for k in known if (c := _candidate(k)) is not None]
    spans = []
    if candidates:
        folded = fold(text)
        projected = project(folded.text)
        by_category: dict[str, tuple[set[str], set[str]]] = {}
        for c in candidates:
            if not c.needles or any(n in projected for n in c.needles):
                edged, inner = by_category.setdefault(c.category, (set(), set()))
                edged.update(c.forms)
                inner.update(c.inner)
        for category, (edged, inner) in sorted(by_category.items()):
            pattern = _alternation(_longest_first(edged), _longest_first(inner))
            spans += [Span(start, end, category, "known", 1.0) for start, end in search(pattern, folded)]
    days = {tuple(int(g) for g in k.value.split("-")) for k in known if k.category == "DATE"}
    dates = [Span(m.start(), m.end(), "DATE", "known", 1.0) for m in DATE_SHAPE_RE.finditer(text) if date_readings(m) & days]
    dates += [Span(m.start(), m.end(), "DATE", "known", 1.0) for m in glued_reference(text) if date_readings(m) & days]
    return spans, dates


def _split_spans(text: str, known: tuple[KnownIdentifier, ...]) -> list[Span]:
    """A name part written in pieces ("DESS E" for Desse): the matcher's own layer, text by text
    (`test_normal_form.py` and `test_name_spellings_in_records.py` test what it finds)."""
    automaton = _split_automaton(known)
    return [Span(start, end, "NAME", "known", 1.0) for start, end in split_parts(automaton, fold(text))] \
        if automaton is not None and any(_candidate(k) is not None for k in known) else []


def reference_find_many(texts: list[str], known: tuple[KnownIdentifier, ...]) -> list[list[Span]]:
    starts, pos = [], 0
    for text in texts:
        starts.append(pos)
        pos += len(text) + len(SEPARATOR)
    found: list[list[Span]] = [[] for _ in texts]
    regex, dates = _reference_groups(SEPARATOR.join(texts), known)

    def place(spans: list[Span]) -> None:
        for s in spans:
            i = bisect.bisect_right(starts, s.start) - 1
            found[i].append(Span(s.start - starts[i], s.end - starts[i], s.category, s.detector, s.confidence))

    place(regex)
    for i, text in enumerate(texts):
        found[i] += _split_spans(text, known)
    place(dates)
    return found


FOLDING = st.sampled_from(list("abcdeksσABCDEKSΣςſKİıßẞéÉ"))  # letters re.IGNORECASE takes for others, and look-alikes
ID_CHARS = st.sampled_from(list("0123456789ABCDEF"))


@st.composite
def many_records_and_texts(draw):
    """Known identifiers of up to 40 people (names with case-folding letters, phones, MRNs, 20-character ids that
    share their first 8, an address, values without needles or with a NUL) and texts made of their pieces."""
    known: list[KnownIdentifier] = []
    pieces: list[str] = []
    shared_prefix = draw(st.text(ID_CHARS, min_size=8, max_size=8))
    for _ in range(draw(st.integers(1, 40))):
        given_name, family = draw(st.text(FOLDING, min_size=1, max_size=6)), draw(st.text(FOLDING, min_size=2, max_size=7))
        phone = draw(st.text(st.sampled_from("0123456789"), min_size=10, max_size=10))
        long_id = (shared_prefix if draw(st.booleans()) else draw(st.text(ID_CHARS, min_size=8, max_size=8))) + \
            draw(st.text(ID_CHARS, min_size=1, max_size=12))
        mrn = draw(DIGITS) + draw(st.sampled_from(["-", "", "/"])) + draw(DIGITS)
        known += [KnownIdentifier(f"{given_name} {family}", "NAME"), KnownIdentifier(phone, "PHONE_NUMBER"),
                  KnownIdentifier(long_id, "UNIQUE_IDENTIFIER"), KnownIdentifier(mrn, "MEDICAL_RECORD_NUMBER")]
        pieces += [given_name.upper(), family.swapcase(), f"{family}, {given_name}", f"{given_name[0]}. {family}",
                   f"({phone[:3]}) {phone[3:6]}-{phone[6:]}", long_id.lower(), long_id[:-1], long_id[:8], mrn]
    known += draw(st.lists(st.sampled_from([
        KnownIdentifier("12 Quarry Lane", "GEOGRAPHIC_LOCATION"), KnownIdentifier("02139", "GEOGRAPHIC_LOCATION"),
        KnownIdentifier("(.)", "GEOGRAPHIC_LOCATION"),  # its needle projects to "": tried in every text
        KnownIdentifier("ab\x00cd", "GEOGRAPHIC_LOCATION"), KnownIdentifier("2021-03-07", "DATE")]), max_size=3))
    pieces += ["12 quarry", "02139-1234", "(.)", "ab\x00cd", "ab", "cd", "\x00", "3/7/21", "Σ", "ſ", " "]
    words = st.lists(st.sampled_from(pieces) | st.text(FOLDING, max_size=4), max_size=7)
    texts = [draw(SEPARATORS).join(draw(words)) for _ in range(draw(st.integers(1, 8)))]
    return tuple(sorted(set(known), key=lambda k: (k.value, k.category))), texts


@settings(max_examples=300, deadline=None)
@given(many_records_and_texts())
def test_the_automaton_finds_what_the_candidate_loop_finds(case):
    known, texts = case
    assert [find_known(text, known) for text in texts] == [reference_find(text, known) for text in texts]
    many = find_known_many(texts, known)
    assert many == [find_known(text, known) for text in texts]
    if not any("\x00" in k.value for k in known):  # a NUL in a value lets the texts joined match across them
        assert many == reference_find_many(texts, known)
    assert occurs_in_any(texts, known) == any(many)


def test_a_needle_is_compared_whole_where_its_prefix_is_found():
    known = (KnownIdentifier("ABCDEFGH1234", "UNIQUE_IDENTIFIER"), KnownIdentifier("ABCDEFGH5678", "UNIQUE_IDENTIFIER"))
    assert [(s.start, s.end) for s in find_known("ids abcdefgh123 ABCDEFGH5678 abcdefgh", known)] == [(16, 28)]
    assert find_known_many(["abcdefgh", "1234"], known) == [[], []]  # the prefix in one text, the rest in the next


def test_a_needle_across_two_texts_is_in_neither():
    known = (KnownIdentifier("ab\x00cd", "GEOGRAPHIC_LOCATION"), KnownIdentifier("Quillon", "NAME"))
    texts = ["xx ab", "cd yy", "Quil", "lon"]
    assert list(compile_known(known)._searched(texts, SEPARATOR.join(texts))) == []  # no regex search at all
    assert find_known_many(["xx ab", "cd yy", "Quil", "lon"], known) == [[], [], [], []]
    assert not occurs_in_any(["xx ab", "cd yy"], known)
    assert [len(found) for found in find_known_many(["ab\x00cd", "quillon"], known)] == [1, 1]


def test_each_text_is_searched_with_its_own_identifiers_forms():
    """A batch of many people's texts builds no alternation of all their forms: each text's holds only the forms
    of the identifiers whose needles it holds, so a search costs the same however many people the record has."""
    people = [(KnownIdentifier(f"Quillon{i:04d} Varnabee{i:04d}", "NAME"), KnownIdentifier(f"77{i:07d}", "PHONE_NUMBER"))
              for i in range(2000)]
    known = tuple(k for person in people for k in person)
    texts = [f"Seen with Quillon{i:04d} Varnabee{i:04d}, call 77{i:07d}" for i in range(0, 2000, 7)]
    matcher = compile_known(known)
    searched = list(matcher._searched(texts, SEPARATOR.join(texts)))
    assert [i for i, _ in searched] == list(range(len(texts)))
    name = _candidate(people[0][0])
    one_person = [("NAME", _alternation(_longest_first(set(name.forms)), _longest_first(set(name.inner))).pattern.count("|") + 1),
                  ("PHONE_NUMBER", 1)]
    for _, patterns in searched:
        assert [(category, pattern.pattern.count("|") + 1) for category, pattern in patterns] == one_person
    assert [[s.category for s in found] for found in find_known_many(texts, known)] == \
        [["NAME", "PHONE_NUMBER"]] * len(texts)


def test_threads_sharing_one_matcher_each_get_their_own_answers():
    """The automaton is built once per record and only read by searches: 8 threads searching different texts
    with one record's matcher answer as the same searches made alone."""
    import random

    people = [(KnownIdentifier(f"Zorbel{i} Quade{i}", "NAME"), KnownIdentifier(f"55{i:06d}A", "MEDICAL_RECORD_NUMBER"))
              for i in range(400)]
    known = tuple(k for person in people for k in person)
    batches = [[f"{people[j][0].value} mrn {people[j][1].value} " * (j % 3) + "no one" for j in range(i, i + 25)]
               for i in range(0, 375, 25)]
    alone = [find_known_many(b, known) for b in batches]
    wrong: list[int] = []

    def work(seed: int) -> None:
        order = list(range(len(batches))) * 10
        random.Random(seed).shuffle(order)
        for i in order:
            if find_known_many(batches[i], known) != alone[i] or occurs_in_any(batches[i], known) != any(alone[i]):
                wrong.append(i)

    in_threads(work, 8)
    assert not wrong
