"""Bounded work: the pattern searches are linear on hostile text, and one deadline per record stops every detector
(the record is refused and its thread freed), also in the HTTP service."""
from __future__ import annotations

import json
import threading
import time

import pytest

from tests.support import post, serve
from text_deid import budget
from text_deid.detectors.patterns import PatternDetector
from text_deid.spans import DetectorError, Span
from text_deid.stack import TextStack



class CountingPattern:
    """Wraps a compiled regex and counts the characters its searches are given."""

    def __init__(self, pattern):
        self.pattern, self.chars = pattern, 0

    def finditer(self, text, pos=0, endpos=None, **kw):
        self.chars += (len(text) if endpos is None else min(endpos, len(text))) - pos
        return self.pattern.finditer(text, pos, endpos, **kw)


@pytest.mark.parametrize("unit", ["a@", "a@b.c", "x.y@a.b ", "@@"])
def test_the_email_search_reads_each_character_at_most_twice(monkeypatch, unit):
    det = PatternDetector()
    counting = CountingPattern(det._email)
    monkeypatch.setattr(det, "_email", counting)
    text = unit * (20_000 // len(unit))
    det.detect(text)
    assert counting.chars <= 2 * len(text)


def test_emails_are_still_found():
    text = "Write to jane.doe@example.org or j-d@mail.example.co.uk, not to a@b or @home."
    found = [text[s.start:s.end] for s in PatternDetector().detect(text) if s.category == "EMAIL_ADDRESS"]
    assert found == ["jane.doe@example.org", "j-d@mail.example.co.uk"]


def test_a_text_past_its_own_budget_is_refused():
    det = PatternDetector(timeout=0.05, timeout_per_mb=0.0)
    start = time.monotonic()
    with pytest.raises(DetectorError, match="patterns: over its time budget"):
        det.detect("1." * 500_000)  # ~15 s of phone-number checks without a budget
    assert time.monotonic() - start < 5


def test_the_record_deadline_narrows_the_detector_budget():
    with budget.within(0.05), pytest.raises(DetectorError, match="over its time budget"):
        PatternDetector().detect("1." * 500_000)
    with budget.until(time.monotonic() - 1), pytest.raises(DetectorError):
        PatternDetector().detect("MRN 1234567")


class SlowPerText:
    """A pooled detector that takes 0.1 s a text and counts the texts it worked on."""

    name = "slow"

    def __init__(self):
        self.done = 0

    def detect(self, text, known):
        time.sleep(0.1)
        self.done += 1
        return [Span(0, 1, "NAME", self.name)]


def test_a_pooled_detector_stops_working_once_the_record_is_refused():
    slow = SlowPerText()
    texts = [f"text {i}" for i in range(40)]
    with pytest.raises(DetectorError, match="slow: timed out"):
        TextStack("t", [slow], timeout_s=0.3).detect_many(texts, ())
    time.sleep(0.5)
    stopped_at = slow.done
    time.sleep(0.5)
    assert stopped_at < 10 and slow.done == stopped_at


def test_the_caller_deadline_reaches_pooled_detectors():
    slow = SlowPerText()
    with budget.within(0.3), pytest.raises(DetectorError, match="slow: timed out"):
        TextStack("t", [slow], timeout_s=60).detect_many([f"text {i}" for i in range(40)], ())
    time.sleep(0.5)
    assert slow.done < 10


def _patient(note: str) -> bytes:
    return json.dumps({"resourceType": "Patient", "id": "p1", "text": {
        "status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{note}</div>'}}).encode()


def test_a_request_past_its_time_frees_its_worker_for_the_next_client(tmp_path, test_key_file):
    """The issue's case: two slow requests held both workers (and the event loop) long past their 503."""
    with serve(tmp_path, test_key_file, "--stack", "patterns", "--workers", "2", "--timeout-s", "2",
               "--max-body-mb", "3") as server:
        slow = _patient("1." * 500_000)  # ~25 s of pattern work without a deadline
        answers = []
        start = time.monotonic()
        threads = [threading.Thread(target=lambda: answers.append(post(server, slow).status_code)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        refused_after = time.monotonic() - start
        small = post(server, _patient("Seen on March 3, 2021."), timeout=10)
    assert answers == [503, 503]
    assert refused_after < 15  # the 2 s deadline, with room for a loaded machine; without it: ~40 s
    assert small.status_code == 200, small.text[:300]
