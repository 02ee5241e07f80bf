"""Stacks: which detectors run on a text. Stacks are data; detectors are looked up by name."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Callable, Sequence

from text_deid import merge, safe_harbor
from text_deid.detectors import Detector
from text_deid.spans import DetectorError, KnownIdentifier, Span


# A span filter takes a text's spans and the text, and returns the spans to keep (e.g. validation).
SpanFilter = Callable[[list[Span], str], list[Span]]


def _known() -> Detector:
    from text_deid.detectors.known_identifiers import KnownIdentifierDetector

    return KnownIdentifierDetector()


def _patterns() -> Detector:
    from text_deid.detectors.patterns import PatternDetector

    return PatternDetector()


def _gazetteer() -> Detector:
    from text_deid.detectors.gazetteer import GazetteerDetector

    return GazetteerDetector()


def _validation() -> SpanFilter:
    from text_deid.validation import validate

    return validate


def _ner() -> Detector:
    try:
        from text_deid.detectors.ner import NerDetector, NerUnavailable
    except ImportError as e:  # pragma: no cover - the module itself only needs the standard library
        raise StackUnavailable(f"ner: cannot import the NER detector ({type(e).__name__})") from None
    try:
        return NerDetector()
    except NerUnavailable as e:
        raise StackUnavailable(str(e)) from None


# Detector name → factory. Later layers (ner, llm) register here.
DETECTORS: dict[str, Callable[[], Detector]] = {"known": _known, "patterns": _patterns, "gazetteer": _gazetteer, "ner": _ner}

# Filter name → factory of a span filter, applied before the union merge.
FILTERS: dict[str, Callable[[], SpanFilter]] = {"validation": _validation}

# Stack name → detector names (../shared/DESIGN.md).
STACKS: dict[str, tuple[str, ...]] = {
    "patterns": ("known", "patterns"),
    "ner-only": ("known", "patterns", "ner"),  # for measurement: what the NER adds to patterns
    "no-llm": ("known", "patterns", "gazetteer", "ner"),
    "precision-first": ("known", "patterns", "llm"),
    "recall-first": ("known", "patterns", "ner", "llm"),
    "balanced": ("known", "patterns", "ner", "llm", "llm-second-opinion"),
    "gazetteer": ("known", "patterns", "gazetteer"),  # the no-llm stack without NER, for ablations
}
# Stack name → filters run on its spans before the merge; stacks not named here have none.
STACK_FILTERS: dict[str, tuple[str, ...]] = {name: ("validation",) for name in ("no-llm", "recall-first", "balanced", "gazetteer")}
DEFAULT_STACK = "patterns"
DETECTOR_TIMEOUT_S = 300.0


class StackUnavailable(ValueError):
    """A stack needs a detector that is not installed or configured: never silently run a smaller one."""


@dataclass
class TextStack:
    name: str
    detectors: list[Detector]
    timeout_s: float = DETECTOR_TIMEOUT_S
    filters: list[SpanFilter] = field(default_factory=list)
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _pool_pid: int = field(default=0, init=False, repr=False)

    def _executor(self) -> ThreadPoolExecutor:
        """One pool per stack and process, reused by every record (threads do not survive a fork)."""
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(max_workers=4 * len(self.detectors), thread_name_prefix="detector")
            self._pool_pid = os.getpid()
        return self._pool

    def detect_many(self, texts: Sequence[str], known: Sequence[KnownIdentifier],
                    timings: dict[str, float] | None = None) -> list[list[Span]]:
        """Spans for each text: detectors run in parallel, results filtered and merged by union.

        Any detector error or timeout raises DetectorError: the caller must fail the record closed.
        `timings`, when given, receives each detector's wall time in seconds.
        """
        known = tuple(known)
        if not texts:
            return []
        pool = self._executor()
        futures = [(d.name, pool.submit(_run, d, texts, known)) for d in self.detectors]
        per_detector = []
        for name, future in futures:
            try:
                found, seconds = future.result(timeout=self.timeout_s)
                per_detector.append(found)
                if timings is not None:
                    timings[name] = timings.get(name, 0.0) + seconds
            except FutureTimeout:  # the record fails now; the stuck detector thread is abandoned
                raise DetectorError(f"{name}: timed out after {self.timeout_s:.0f} s") from None
            except DetectorError:
                raise
            except Exception as e:  # the message of a foreign exception may quote the text: keep only its type
                raise DetectorError(f"{name}: {type(e).__name__}") from None
        results = []
        for i, text in enumerate(texts):
            spans = [s for found in per_detector for s in found[i]]
            _check_offsets(spans, len(text))
            for span_filter in self.filters:
                spans = span_filter(spans, text)
            results.append(merge.union(safe_harbor.filter_spans(spans, text)))
        return results

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        return self.detect_many([text], known)[0]


def _run(detector: Detector, texts: Sequence[str], known: tuple[KnownIdentifier, ...]) -> tuple[list[list[Span]], float]:
    start = time.perf_counter()
    found = [detector.detect(t, known) if t.strip() else [] for t in texts]
    return found, time.perf_counter() - start


def _check_offsets(spans: list[Span], length: int) -> None:
    for s in spans:
        if not (0 <= s.start < s.end <= length):
            raise DetectorError(f"{s.detector}: span offsets outside the text")


def build_stack(name: str | None = None) -> TextStack:
    """The named stack, or StackUnavailable naming what is missing."""
    name = name or DEFAULT_STACK
    if name not in STACKS:
        raise StackUnavailable(f"unknown stack {name!r} (known: {', '.join(STACKS)})")
    missing = [d for d in STACKS[name] if d not in DETECTORS]
    if missing:
        raise StackUnavailable(f"stack {name!r} needs detectors that are not available here: {', '.join(missing)}")
    return TextStack(name, [DETECTORS[d]() for d in STACKS[name]],
                     filters=[FILTERS[f]() for f in STACK_FILTERS.get(name, ())])
