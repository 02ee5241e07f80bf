"""The text stack fails closed: a detector that raises, hangs or answers out-of-range offsets stops the record."""
from __future__ import annotations

import threading
import time

import pytest

from text_deid.spans import DetectorError, Span
from text_deid.stack import TextStack

release = threading.Event()


class Hanging:
    name = "hanging"

    def detect(self, text, known):
        release.wait(30)
        return []


class Garbage:
    name = "garbage"

    def detect(self, text, known):
        return [Span(0, len(text) + 5, "NAME", self.name)]


class Fine:
    name = "fine"

    def detect(self, text, known):
        return [Span(0, 4, "NAME", self.name)]


def test_a_hanging_detector_times_out_and_fails_the_record_promptly():
    stack = TextStack("t", [Fine(), Hanging()], timeout_s=0.5)
    start = time.perf_counter()
    with pytest.raises(DetectorError, match="hanging: timed out"):
        stack.detect("Anna was here", ())
    assert time.perf_counter() - start < 5
    release.set()


def test_out_of_range_offsets_are_garbage_and_fail_the_record():
    with pytest.raises(DetectorError, match="garbage: span offsets outside the text"):
        TextStack("t", [Fine(), Garbage()]).detect("Anna was here", ())


def test_results_are_deterministic_and_reuse_one_pool():
    stack = TextStack("t", [Fine()])
    first = stack.detect_many(["Anna a", "Bert b"], ())
    pool = stack._executor()
    assert stack.detect_many(["Anna a", "Bert b"], ()) == first
    assert stack._executor() is pool


class SlowInThread:
    """Bounds its own time (as the pattern detector's regex timeouts do) but answers after the stack's limit."""
    name = "slow"
    bounds_own_time = True

    def __init__(self):
        self.threads = []

    def detect(self, text, known):
        self.threads.append(threading.get_ident())
        time.sleep(0.3)
        return []


class BrokenInThread:
    name = "broken"
    bounds_own_time = True

    def detect(self, text, known):
        raise RuntimeError(text)  # the message quotes the text: the stack must not pass it on


def test_detectors_that_bound_their_own_time_run_in_the_calling_thread_and_a_late_answer_is_refused():
    slow = SlowInThread()
    with pytest.raises(DetectorError, match="slow: timed out"):
        TextStack("t", [Fine(), slow], timeout_s=0.1).detect("Anna was here", ())
    assert slow.threads == [threading.get_ident()]
    assert TextStack("t", [Fine(), slow], timeout_s=5).detect("Anna was here", ())[0].category == "NAME"


def test_an_in_thread_detector_error_fails_the_record_without_quoting_the_text():
    with pytest.raises(DetectorError) as info:
        TextStack("t", [Fine(), BrokenInThread()]).detect("Anna was here", ())
    assert str(info.value) == "broken: RuntimeError"
