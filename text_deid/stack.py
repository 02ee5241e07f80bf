"""Stacks: which detectors run on a text. Stacks are data; detectors are looked up by name."""
from __future__ import annotations

import contextvars
import os
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

from text_deid import budget, merge, safe_harbor
from text_deid.clinical.values import drop_clinical_values
from text_deid.name_parts import join_name_parts
from text_deid.detectors import Detector
from text_deid.detectors.addresses import AddressDetector
from text_deid.detectors.gazetteer import GazetteerDetector
from text_deid.detectors.known_identifiers import KnownIdentifierDetector
from text_deid.detectors.llm import LlmDetector, LlmSettings, LlmUnavailable
from text_deid.detectors.ner import NerDetector, NerSettings, NerUnavailable
from text_deid.detectors.patterns import PatternDetector
from text_deid.detectors.unknown_words import UnknownWordDetector
from text_deid.detectors.world_names import WorldNameDetector
from text_deid.second_opinion import SecondOpinion
from text_deid.spans import DetectorError, KnownIdentifier, Span
from text_deid.validation import validate


# A span filter takes a text's spans and the text, and returns the spans to keep (e.g. validation).
SpanFilter = Callable[[list[Span], str], list[Span]]


def _known() -> Detector:
    return KnownIdentifierDetector()


def _patterns() -> Detector:
    return PatternDetector()


def _gazetteer() -> Detector:
    return GazetteerDetector()


def _addresses() -> Detector:
    return AddressDetector()


def _unknown_words(in_context_only: bool) -> Callable[[], Detector]:
    return lambda: UnknownWordDetector(in_context_only)


def _validation() -> SpanFilter:
    return validate


def _clinical_values() -> SpanFilter:
    return drop_clinical_values


def _name_parts() -> SpanFilter:
    return join_name_parts


def _ner(settings: NerSettings) -> Detector:
    try:
        return NerDetector(settings.model_path, settings.labels_path, threads=settings.threads,
                           threshold=settings.threshold)
    except NerUnavailable as e:
        raise StackUnavailable(str(e)) from None


def _llm(settings: LlmSettings) -> Detector:
    try:
        return LlmDetector(settings)
    except LlmUnavailable as e:
        raise StackUnavailable(str(e)) from None


def _second_opinion(settings: LlmSettings) -> SpanFilter:
    try:
        return SecondOpinion(settings)
    except LlmUnavailable as e:
        raise StackUnavailable(str(e)) from None


# Detector name → factory. Later layers register here.
DETECTORS: dict[str, Callable[..., Detector]] = {"known": _known, "patterns": _patterns, "gazetteer": _gazetteer,
                                                 "ner": _ner, "llm": _llm, "addresses": _addresses,
                                                 "unknown-words": _unknown_words(False),
                                                 "unknown-words-in-context": _unknown_words(True),
                                                 "world-names": WorldNameDetector}

# Filter name → factory of a span filter, applied in order before the union merge.
FILTERS: dict[str, Callable[..., SpanFilter]] = {"clinical-values": _clinical_values, "validation": _validation,
                                                 "second-opinion": _second_opinion, "name-parts": _name_parts}

# Detectors and filters whose factory takes the stack's LlmSettings (the others take nothing).
# Components whose factory takes settings → which settings (the others take none).
SETTINGS_OF = {"llm": "llm", "second-opinion": "llm", "ner": "ner"}

# Stack name → detector names (../shared/DESIGN.md).
STACKS: dict[str, tuple[str, ...]] = {
    "patterns": ("known", "patterns"),
    "ner-only": ("known", "patterns", "ner"),  # for measurement: what the NER adds to patterns
    "no-llm": ("known", "patterns", "addresses", "gazetteer", "ner", "unknown-words-in-context", "world-names"),
    "precision-first": ("known", "patterns", "addresses", "llm"),
    "recall-first": ("known", "patterns", "addresses", "ner", "llm", "unknown-words"),
    "balanced": ("known", "patterns", "addresses", "ner", "llm", "unknown-words"),  # + the second opinion
    "gazetteer": ("known", "patterns", "gazetteer"),  # the no-llm stack without NER, for ablations
    "no-world-names": ("known", "patterns", "addresses", "gazetteer", "ner", "unknown-words-in-context"),  # ablation
}
# Stack name → filters run on its spans before the merge, in order. Every stack drops clinical values first and
# joins name parts last.
STACK_FILTERS: dict[str, tuple[str, ...]] = {name: ("clinical-values", "name-parts") for name in STACKS}
STACK_FILTERS.update({name: ("clinical-values", "validation", "name-parts")
                      for name in ("no-llm", "recall-first", "gazetteer", "ner-only", "no-world-names")})
STACK_FILTERS["balanced"] = ("clinical-values", "second-opinion", "validation", "name-parts")  # the veto sees spans untrimmed
DEFAULT_STACK = "no-llm"  # ../shared/DESIGN.md: the default when no LLM is configured
DETECTOR_TIMEOUT_S = 300.0
IN_THREAD_CHARS = 2_000  # a record this short runs its text-bound detectors in the calling thread


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

        Any detector error, or the record's deadline passing (`timeout_s`, or the caller's `budget.within`),
        raises DetectorError: the caller must fail the record closed.
        `timings`, when given, receives each detector's wall time in seconds.
        """
        known = tuple(known)
        if not texts:
            return []
        # records repeat the same strings ("Well child visit (procedure)"): detect each distinct text once
        unique = list(dict.fromkeys(texts))
        # One deadline for the record: the stack's limit, or the caller's (budget.within) where that is sooner.
        with budget.within(self.timeout_s) as deadline:
            per_detector = self._run_detectors(unique, known, deadline, timings)
            by_text = {}
            for i, text in enumerate(unique):
                budget.check("filters")  # past the record's deadline, no more filtering either
                spans = [s for found in per_detector for s in found[i]]
                # no spans: nothing to check, and filters only drop spans (most short texts end here)
                by_text[text] = self._finish(spans, text) if spans else []
        return [by_text[text] for text in texts]

    def _run_detectors(self, unique: list[str], known: tuple[KnownIdentifier, ...], deadline: float | None,
                       timings: dict[str, float] | None) -> list[list[list[Span]]]:
        """Each detector's spans per text, in detector order, under the record's deadline."""
        # Detectors that bound their own time run in this thread while the pool runs the others: handing a
        # short text to a thread and back costs more than the regular expressions themselves. So do
        # text-bound ones (CPU work in proportion to the text, no waiting on a server) on a short record:
        # they finish within moments of the deadline, which `_result` then enforces. Pooled ones get the
        # deadline in their context, and stop at it.
        short = sum(map(len, unique)) <= IN_THREAD_CHARS
        pooled = [d for d in self.detectors if not (getattr(d, "bounds_own_time", False)
                                                    or (short and getattr(d, "text_bound", False)))]
        futures = {d.name: self._executor().submit(contextvars.copy_context().run, _run, d, unique, known)
                   for d in pooled}
        results = {}
        try:
            for d in self.detectors:
                if d.name not in futures:
                    results[d.name] = _result(d.name, partial(_run, d, unique, known), deadline)
            for name, future in futures.items():
                results[name] = _result(name, lambda: future.result(timeout=_left(deadline)), deadline)
        finally:
            for future in futures.values():  # a failed record: what has not started never does
                future.cancel()
        per_detector = []
        for d in self.detectors:
            found, seconds = results[d.name]
            per_detector.append(found)
            if timings is not None:
                timings[d.name] = timings.get(d.name, 0.0) + seconds
        return per_detector

    def _finish(self, spans: list[Span], text: str) -> list[Span]:
        """One text's spans from every detector: checked, filtered, Safe Harbor's keeps dropped, merged."""
        _check_offsets(spans, len(text))
        for span_filter in self.filters:
            spans = span_filter(spans, text)  # the second opinion asks under the deadline too
        return merge.union(safe_harbor.filter_spans(spans, text))

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        return self.detect_many([text], known)[0]


def _run(detector: Detector, texts: Sequence[str], known: tuple[KnownIdentifier, ...]) -> tuple[list[list[Span]], float]:
    start = time.perf_counter()
    batch = getattr(detector, "detect_many", None)
    if batch:
        found = batch(texts, known)
    else:
        found = []
        for t in texts:
            budget.check(detector.name)  # past the record's deadline, the thread stops at the next text
            found.append(detector.detect(t, known) if t.strip() else [])
    return found, time.perf_counter() - start


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _result(name: str, get: Callable[[], tuple[list[list[Span]], float]], deadline: float | None):
    """One detector's (spans per text, seconds), or DetectorError: the record fails closed."""
    try:
        found, seconds = get()
    except FutureTimeout:  # the record fails now; the detector's thread stops at its next look at the deadline
        raise DetectorError(f"{name}: timed out (over the record's time budget)") from None
    except DetectorError:
        raise
    except Exception as e:  # the message of a foreign exception may quote the text: keep only its type
        raise DetectorError(f"{name}: {type(e).__name__}") from None
    if deadline is not None and time.monotonic() > deadline:  # an in-thread detector answered late: refused
        raise DetectorError(f"{name}: timed out (over the record's time budget)")
    return found, seconds


def _check_offsets(spans: list[Span], length: int) -> None:
    for s in spans:
        if not (0 <= s.start < s.end <= length):
            raise DetectorError(f"{s.detector}: span offsets outside the text")


def build_stack(name: str | None = None, llm: LlmSettings | None = None, ner: NerSettings | None = None) -> TextStack:
    """The named stack, or StackUnavailable naming what is missing. `llm` and `ner`: the settings of those
    components (None: their defaults); stacks without them ignore them."""
    name = name or DEFAULT_STACK
    if name not in STACKS:
        raise StackUnavailable(f"unknown stack {name!r} (known: {', '.join(STACKS)})")
    missing = [d for d in STACKS[name] if d not in DETECTORS]
    if missing:
        raise StackUnavailable(f"stack {name!r} needs detectors that are not available here: {', '.join(missing)}")
    settings = {"llm": llm or LlmSettings(), "ner": ner or NerSettings()}

    def make(registry: dict, part: str):
        kind = SETTINGS_OF.get(part)
        return registry[part](settings[kind]) if kind else registry[part]()

    try:
        return TextStack(name, [make(DETECTORS, d) for d in STACKS[name]],
                         filters=[make(FILTERS, f) for f in STACK_FILTERS.get(name, ())])
    except StackUnavailable as e:
        raise StackUnavailable(f"stack {name!r} is not available here: {e}") from None


def detector_versions(stack: TextStack) -> dict[str, dict[str, str]]:
    """Each detector's version, model and prompt version where it has them: what eval records carry."""
    return {d.name: {k: str(v) for k in ("version", "model", "prompt_version")
                     if isinstance(v := getattr(d, k, None), (str, int, float)) and v != ""}
            for d in stack.detectors}


def known_identifiers_only() -> TextStack:
    """The stack kept text goes through (coded text, facility names): the record's known identifiers alone."""
    return TextStack("known-identifiers", [KnownIdentifierDetector()])
