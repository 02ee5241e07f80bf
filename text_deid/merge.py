"""Merge the detectors' spans by union: overlapping spans become one, so nothing any detector found survives."""
from __future__ import annotations

from text_deid.spans import Span

# When spans of different categories overlap, the merged span takes the category of the most trusted detector.
DETECTOR_PRIORITY = {"known": 0, "patterns": 1}


def union(spans: list[Span]) -> list[Span]:
    """Overlapping spans are joined; the result is sorted and disjoint."""
    merged: list[Span] = []
    for s in sorted(spans, key=lambda s: (s.start, -s.end)):
        if merged and s.start < merged[-1].end:
            last = merged[-1]
            best = min((last, s), key=lambda x: (DETECTOR_PRIORITY.get(x.detector, 9), -(x.end - x.start)))
            merged[-1] = Span(
                last.start, max(last.end, s.end), best.category, best.detector, min(last.confidence, s.confidence)
            )
        else:
            merged.append(s)
    return merged
