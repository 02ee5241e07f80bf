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
