"""The second opinion: a span filter in which the LLM may veto clinical-NER (and unknown-word) spans that nothing else
reported.

Only an `ner` or `unknown-words` span may be vetoed, and only when no known-identifier, pattern or LLM span overlaps it and it
is not a location or organization (GEOGRAPHIC_LOCATION, or a facility name whatever its type). The model
sees the span marked in its own window of context and vetoes it only by answering NOT_PHI; PHI and UNSURE
keep it. An unusable answer is asked once more; a second one, or any request failure, raises DetectorError.
"""
from __future__ import annotations

import threading
from collections import Counter

from text_deid import budget, prompts
from text_deid.detectors.llm import LlmSettings, LlmUnavailable, OllamaEndpoint, UnusableAnswer
from text_deid.spans import DetectorError, Span
from text_deid.validation import FACILITY_RE

NAME = "second-opinion"
VETOABLE_DETECTORS = frozenset({"ner", "unknown-words"})  # the recall layer's candidates are reviewed too
CONFIRMING_DETECTORS = frozenset({"known", "patterns", "llm"})  # a span any of these reported is never vetoed
NEVER_VETOED = frozenset({"GEOGRAPHIC_LOCATION"})  # locations, and organizations (hospitals, employers)
CONTEXT_CHARS = 1000  # each side of the candidate
NUM_PREDICT = 32
VERDICTS = ("PHI", "NOT_PHI", "UNSURE")


def vetoable(span: Span, spans: list[Span], text: str) -> bool:
    """May the second opinion veto `span`, given every detector's spans on `text`?"""
    return (span.detector in VETOABLE_DETECTORS and span.category not in NEVER_VETOED
            and not FACILITY_RE.search(text[span.start:span.end])
            and not any(o.detector in CONFIRMING_DETECTORS and o.start < span.end and span.start < o.end for o in spans))


def excerpt(text: str, span: Span, context: int = CONTEXT_CHARS) -> str:
    """The span marked ⟦…⟧ in up to `context` characters each side, cut at whitespace."""
    lo, hi = max(0, span.start - context), min(len(text), span.end + context)
    if lo > 0:
        space = next((i for i in range(lo, span.start) if text[i].isspace()), None)
        lo = span.start if space is None else space + 1
    if hi < len(text):
        space = next((i for i in range(hi - 1, span.end - 1, -1) if text[i].isspace()), None)
        hi = span.end if space is None else space
    return f"{text[lo:span.start]}⟦{text[span.start:span.end]}⟧{text[span.end:hi]}"


class SecondOpinion:
    """Span filter (spans, text) -> spans: drops the vetoable spans the model is sure are not PHI."""

    name = NAME

    def __init__(self, settings: LlmSettings | None = None, *, prompt_set: prompts.PromptSet | None = None):
        try:
            self.prompts = prompt_set or prompts.load()
        except ValueError as e:
            raise LlmUnavailable(f"{NAME}: {e}") from None
        self.endpoint = OllamaEndpoint(settings or LlmSettings(), NAME)
        longest = "x" * (2 * CONTEXT_CHARS + 200)
        self.endpoint.check_fits(self.prompts.second_opinion_messages("NAME", "x" * 200, longest), NUM_PREDICT)
        self.counts: Counter[str] = Counter()  # asked, vetoed
        self._lock = threading.Lock()

    def __call__(self, spans: list[Span], text: str) -> list[Span]:
        candidates = sorted({s for s in spans if vetoable(s, spans, text)})
        if not candidates:
            return spans
        verdicts = self.endpoint.map(lambda s: self._verdict(text, s), candidates)
        vetoed = {s for s, verdict in zip(candidates, verdicts) if verdict == "NOT_PHI"}
        with self._lock:
            self.counts["asked"] += len(candidates)
            self.counts["vetoed"] += len(vetoed)
        return [s for s in spans if s not in vetoed]

    def _verdict(self, text: str, span: Span) -> str:
        budget.check(NAME)  # past the record's deadline, no more requests
        messages = self.prompts.second_opinion_messages(span.category, text[span.start:span.end], excerpt(text, span))
        for _ in range(2):
            try:
                answer = self.endpoint.ask(messages, self.prompts.second_opinion_schema, NUM_PREDICT)
            except UnusableAnswer:
                continue
            if isinstance(answer, dict) and set(answer) == {"verdict"} and answer["verdict"] in VERDICTS:
                return answer["verdict"]
        raise DetectorError(f"{NAME}: unusable answer twice")
