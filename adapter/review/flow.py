"""The review flow around the one de-identification engine: route a record (release it, or hold it for review),
and release a held record with a reviewer's decisions applied, through the same engine and leak guard.

The engine is not changed: routing runs it with a stack that remembers what it was asked and answered, and a
release runs it with a stack that answers the reviewer's spans for exactly the texts that were held.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Sequence

from adapter.review.queue import HeldRecord, ReviewQueue, TextUnderReview, Thresholds
from fhir_transforms.r4.record import Deidentifier, RecordResult
from fhir_transforms.r4.walker import RecordContext, walk_record
from text_deid import merge
from text_deid.spans import CATEGORIES, DetectorError, KnownIdentifier, Span

ACTIONS = ("confirm", "reject", "change", "add")
MAX_DECISIONS = 10_000  # per release: more than any page holds, far less than a flood
REVIEW_DETECTOR = "review"


class DecisionError(ValueError):
    """The submitted decisions do not fit the held record (bad offsets, category or action)."""


class _WrappedStack:
    """Looks like the wrapped text stack to the engine and the audit trail (same name, same detectors)."""

    inner: object

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def detectors(self):
        return self.inner.detectors


@dataclass
class RecordingStack(_WrappedStack):
    """A text stack that runs `inner` and keeps the texts and spans of the last record (one record per instance)."""

    inner: object
    texts: list[str] = field(default_factory=list)
    spans: list[list[Span]] = field(default_factory=list)

    def detect_many(self, texts, known, timings=None):
        found = self.inner.detect_many(texts, known, timings)
        self.texts, self.spans = list(texts), [list(s) for s in found]
        return found


@dataclass
class DecidedStack(_WrappedStack):
    """A text stack that answers the reviewer's spans, matching each text the engine asks about to the held text at
    the same path (the queue stores the record with sorted keys, so the order may differ), and refuses if the
    texts are not the ones that were held."""

    inner: object
    held: list[TextUnderReview]
    spans: list[list[Span]]
    paths: Optional[list[str]]  # of the texts the engine will ask about, in its order; None: compare in order

    def detect_many(self, texts, known, timings=None):
        if self.paths is None:  # a record held before every text had its path
            if list(texts) != [t.text for t in self.held]:
                raise DetectorError("review: the record's texts differ from the ones that were reviewed")
            return [list(s) for s in self.spans]
        by_path = dict(zip(_occurrences([t.path for t in self.held]), zip(self.held, self.spans)))
        asked = _occurrences(self.paths)
        if len(texts) != len(asked) or sorted(asked) != sorted(by_path):
            raise DetectorError("review: the record's texts differ from the ones that were reviewed")
        out = []
        for text, where in zip(texts, asked):
            under, spans = by_path[where]
            if text != under.text:
                raise DetectorError(f"review: the text at {where[0]} differs from the one that was reviewed")
            out.append(list(spans))
        return out


def _occurrences(paths: Sequence[str]) -> list[tuple[str, int]]:
    """Each path with its occurrence number: one element (a narrative) may hand the stack several texts."""
    seen: dict[str, int] = {}
    out = []
    for p in paths:
        seen[p] = seen.get(p, -1) + 1
        out.append((p, seen[p]))
    return out


def text_paths(engine: Deidentifier, resource: dict, root: str) -> list[str]:
    """The path (below `root`) of each text the engine hands its stack for `resource`, in its order: the engine's
    walk, without detection."""
    ctx = RecordContext(engine.profile, engine.pseudo, engine.clock)
    walk_record(copy.deepcopy(resource), root, ctx)
    return [_relative(p.path, root) for p in ctx.pending for _ in p.ref.texts]  # (terms are not texts: ctx.terms)


@dataclass
class Routed:
    """The outcome of routing one record: released (with its result) or held (with its queue id)."""

    result: RecordResult
    held_id: str = ""

    @property
    def held(self) -> bool:
        return bool(self.held_id)


def texts_under_review(paths: Sequence[str], texts: Sequence[str],
                       spans: Sequence[Sequence[Span]]) -> list[TextUnderReview]:
    """Pair each text with its path and the spans the stack found in it."""
    return [TextUnderReview(p, t, list(found)) for p, t, found in zip(paths, texts, spans, strict=True)]


def _relative(path: str, root: str) -> str:
    # the caller's label for a record may be a file name (which may hold PHI): keep only the structural path
    return path[len(root):].lstrip(".") if root and path.startswith(root) else path


def route(engine: Deidentifier, resource: dict, where: str, thresholds: Thresholds, queue: ReviewQueue, site: str,
          linked: Sequence[KnownIdentifier] = ()) -> Routed:
    """De-identify `resource`; hold it for review when any span is below its category's threshold."""
    recorder = RecordingStack(engine.stack)
    result = dataclasses.replace(engine, stack=recorder).deidentify(resource, where, linked)
    if not any(thresholds.is_suspect(s) for found in recorder.spans for s in found):
        return Routed(result)
    texts = texts_under_review(text_paths(engine, resource, where), recorder.texts, recorder.spans)
    held_id = queue.hold(site, resource, texts, result.resource, result.known, thresholds)
    return Routed(result, held_id)


@dataclass(frozen=True)
class Decision:
    """One reviewer decision: which text, the span (as decided), the action, and the span's original category."""

    text: int
    start: int
    end: int
    category: str
    action: str
    confidence: float
    original_category: str = ""

    def to_json(self) -> dict:
        return {"text": self.text, "start": self.start, "end": self.end, "category": self.category,
                "action": self.action, "confidence": round(self.confidence, 4),
                "original_category": self.original_category}


def decide(held: HeldRecord, submitted: Sequence[dict], thresholds: Thresholds) -> list[Decision]:
    """Check the page's decisions against the held record. An original span without a decision is confirmed
    (fail closed: nothing the stack found is released unless a reviewer rejected it), and only a span routed for
    review (below its category's threshold) may be rejected: a confident one can only be confirmed or changed."""
    if len(submitted) > MAX_DECISIONS:  # one page's work: a flood would become one enormous audit row
        raise DecisionError(f"more than {MAX_DECISIONS} decisions in one release")
    by_origin: dict[tuple[int, int], dict] = {}
    added: set[Decision] = set()  # the same added span twice is one decision
    for d in submitted:
        if not isinstance(d, dict):
            raise DecisionError("each decision must be an object")
        action, t = d.get("action"), d.get("text")
        if action not in ACTIONS:  # what was sent is never echoed: only the names it must be one of
            raise DecisionError(f"unknown action (known: {', '.join(ACTIONS)})")
        if not isinstance(t, int) or not 0 <= t < len(held.texts):
            raise DecisionError("decision names a text the record does not have")
        if action == "add":
            start, end, category = d.get("start"), d.get("end"), d.get("category")
            if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(held.texts[t].text)):
                raise DecisionError("an added span must lie inside its text")
            if category not in CATEGORIES:
                raise DecisionError("unknown category")
            added.add(Decision(t, start, end, category, "add", 1.0))
            continue
        origin = d.get("origin")
        if not isinstance(origin, int) or not 0 <= origin < len(held.texts[t].spans):
            raise DecisionError("decision names a span the record does not have")
        span = held.texts[t].spans[origin]
        if action == "reject" and not thresholds.is_suspect(span):
            raise DecisionError(f"span {origin} of text {t} ({span.category}) was not routed for review: its "
                                "confidence is at or above its category's threshold, so it cannot be rejected")
        by_origin[(t, origin)] = d
    decisions = []
    for t, under in enumerate(held.texts):
        for i, s in enumerate(under.spans):
            d = by_origin.get((t, i), {"action": "confirm"})
            action, category = d["action"], d.get("category") or s.category
            if action == "change":
                if category not in CATEGORIES:
                    raise DecisionError("unknown category")
                if category == s.category:
                    action = "confirm"
            else:
                category = s.category
            decisions.append(Decision(t, s.start, s.end, category, action, s.confidence, s.category))
    return decisions + sorted(added, key=lambda d: (d.text, d.start, d.end))


def decided_spans(held: HeldRecord, decisions: Sequence[Decision]) -> list[list[Span]]:
    """The spans each text is released with: confirmed, changed and added ones, merged by union."""
    out: list[list[Span]] = []
    for t, under in enumerate(held.texts):
        kept = []
        originals = {(s.start, s.end): s for s in under.spans}
        for d in decisions:
            if d.text != t or d.action == "reject":
                continue
            base = originals.get((d.start, d.end)) if d.action != "add" else None
            if base is not None and d.action == "confirm":
                kept.append(base)
            else:
                kept.append(Span(d.start, d.end, d.category, REVIEW_DETECTOR, 1.0))
        out.append(merge.union(kept))
    return out


def release(engine: Deidentifier, held: HeldRecord, decisions: Sequence[Decision]) -> RecordResult:
    """De-identify the held record again with the decided spans; InputError/RecordRefused/DetectorFailed as usual."""
    paths = None if any(not t.path for t in held.texts) else text_paths(engine, held.resource, held.resource_type)
    stack = DecidedStack(engine.stack, held.texts, decided_spans(held, decisions), paths)
    return dataclasses.replace(engine, stack=stack).deidentify(held.resource, held.resource_type, held.known)
