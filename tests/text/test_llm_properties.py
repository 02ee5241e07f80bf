"""Chunking and location hold for every input: windows cover the note, located spans are what the model said."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from text_deid import prompts
from text_deid.detectors.llm import LlmDetector, chunk_bounds, clean, halves, locate, normalize, parse_items

WORD = st.text(st.sampled_from("abcXYZ09éİﬁ'’-.,"), min_size=1, max_size=12)
SPACE = st.sampled_from([" ", "  ", "\n", "\t", " \u00a0"])
NOTES = st.lists(st.tuples(WORD, SPACE), max_size=80).map(lambda parts: "".join(w + s for w, s in parts))


@settings(max_examples=300, deadline=None)
@given(NOTES, st.integers(20, 200), st.integers(0, 60))
def test_chunks_cover_the_note_in_bounded_overlapping_windows(note, size, overlap):
    overlap = min(overlap, size // 3)
    bounds = chunk_bounds(note, size, overlap)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(note)
    for (s1, e1), (s2, e2) in zip(bounds, bounds[1:]):
        assert s1 < s2 <= e1 and e1 < e2  # moving forward, nothing skipped
    assert all(0 <= s < e <= len(note) and e - s <= size for s, e in bounds) or note == ""
    # a word shorter than a tenth of a window lies whole in some window (cuts are at whitespace)
    for m in re.finditer(r"\S+", note):
        if m.end() - m.start() <= size // 10 and overlap >= size // 10:
            assert any(s <= m.start() and m.end() <= e for s, e in bounds), (m.group(), bounds)


@settings(max_examples=200, deadline=None)
@given(NOTES, st.data())
def test_halves_cover_their_chunk(note, data):
    if len(note) < 2:
        return
    start = data.draw(st.integers(0, len(note) - 2))
    end = data.draw(st.integers(start + 2, len(note)))
    (s1, e1), (s2, e2) = halves(note, start, end)
    assert s1 == start and e2 == end and s2 <= e1 and start <= s2 and e1 <= end


@settings(max_examples=400, deadline=None)
@given(NOTES, st.data())
def test_every_located_span_holds_the_returned_text_inside_the_note(note, data):
    if note and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(note) - 1))
        needle = note[i:data.draw(st.integers(i + 1, min(len(note), i + 30)))]
        needle = data.draw(st.sampled_from([needle, needle.upper(), needle.lower(), " ".join(needle.split())]))
    else:
        needle = data.draw(WORD)
    hits, exact = locate(note, needle)
    target = clean(needle)
    for s, e in hits:
        assert 0 <= s < e <= len(note)
        if exact:
            assert note[s:e] == target
        else:
            assert normalize(note[s:e])[0] == normalize(target)[0].strip()
        assert s == 0 or not (note[s - 1].isalnum() and note[s].isalnum())
        assert e == len(note) or not (note[e].isalnum() and note[e - 1].isalnum())
    if target and target in note and exact is False:
        assert all(not _whole(note, m.start(), m.end()) for m in re.finditer(re.escape(target), note))


def _whole(note: str, s: int, e: int) -> bool:
    return (s == 0 or not (note[s - 1].isalnum() and note[s].isalnum())) and \
           (e == len(note) or not (note[e].isalnum() and note[e - 1].isalnum()))


class Scripted:
    """An endpoint answering, for each chunk, texts drawn from that chunk (sometimes altered) or invented."""

    def __init__(self, draw):
        self.draw = draw

    def ask(self, messages, schema, num_predict):
        chunk = messages[-1]["content"]
        items = []
        for _ in range(self.draw(st.integers(0, 4))):
            if chunk and self.draw(st.booleans()):
                i = self.draw(st.integers(0, len(chunk) - 1))
                text = chunk[i:self.draw(st.integers(i + 1, min(len(chunk), i + 20)))]
                text = self.draw(st.sampled_from([text, text.lower()]))
            else:
                text = self.draw(WORD)
            if clean(text):
                items.append({"text": text, "type": self.draw(st.sampled_from(["NAME", "DATE", "URL"]))})
        return {"items": items}

    def map(self, fn, items):
        return [fn(x) for x in items]

    def check_fits(self, messages, num_predict):
        pass

    model = "scripted"


@settings(max_examples=150, deadline=None)
@given(NOTES, st.data())
def test_detector_spans_stay_inside_the_note_and_hold_what_the_model_returned(note, data):
    endpoint = Scripted(data.draw)
    answers: list[set[str]] = []
    real_ask = endpoint.ask

    def ask(messages, schema, num_predict):
        answer = real_ask(messages, schema, num_predict)
        answers.append({normalize(clean(t))[0] for t, _ in parse_items(answer)})
        return answer

    endpoint.ask = ask
    detector = LlmDetector(chunk_chars=60, overlap_chars=15, prompt_set=prompts.load(), endpoint=endpoint)
    spans = detector.detect(note)
    returned = set().union(*answers) if answers else set()
    for span in spans:
        assert 0 <= span.start < span.end <= len(note)
        assert normalize(note[span.start:span.end])[0] in returned
