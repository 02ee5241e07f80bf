"""The leak guard: refuse any output in which a known identifier survived, in any of its written forms."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Sequence

from text_deid.detectors.known_identifiers import find_known
from text_deid.spans import KnownIdentifier

SEPARATOR = "\n\x00\n"  # between strings, so no form can match across two of them


@dataclass(frozen=True)
class Leak:
    """Where a known identifier survived: the path and category, never the value."""

    path: str
    category: str

    def __str__(self) -> str:
        return f"{self.category} at {self.path}"


def scan(strings: Iterable[tuple[str, str]], known: Sequence[KnownIdentifier]) -> list[Leak]:
    """Search every (path, text) of an output for every known identifier; one Leak per path and category."""
    # FHIR repeats the same strings ("Body Height", "final") across a record: search each distinct text once
    paths_of: dict[str, list[str]] = {}
    for path, text in strings:
        paths_of.setdefault(text, []).append(path)
    if not paths_of:
        return []
    texts = list(paths_of)
    starts, pos = [], 0
    for text in texts:
        starts.append(pos)
        pos += len(text) + len(SEPARATOR)
    leaks: dict[tuple[str, str], Leak] = {}
    for span in find_known(SEPARATOR.join(texts), tuple(known), "leak-guard"):
        for path in paths_of[texts[bisect.bisect_right(starts, span.start) - 1]]:
            leaks.setdefault((path, span.category), Leak(path, span.category))
    return sorted(leaks.values(), key=lambda leak: (leak.path, leak.category))
