"""The leak guard: refuse any output in which a known identifier survived, in any of its written forms."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from text_deid.detectors.known_identifiers import find_known_many, occurs_in_any
from text_deid.spans import CATEGORIES, KnownIdentifier

# The tags the stack writes (`replace.tag`): a patient whose name is a category's word ("Name", "Date") is not
# found inside them, so a masked record is not refused for its own tags
TAG_RE = re.compile("|".join(re.escape(f"[{c}]") for c in CATEGORIES))


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
        paths_of.setdefault(_untagged(text), []).append(path)
    leaks: dict[tuple[str, str], Leak] = {}
    for text, found in zip(paths_of, find_known_many(list(paths_of), tuple(known), "leak-guard")):
        for span in found:
            for path in paths_of[text]:
                leaks.setdefault((path, span.category), Leak(path, span.category))
    return sorted(leaks.values(), key=lambda leak: (leak.path, leak.category))


def clean(texts: Sequence[str], known: Sequence[KnownIdentifier]) -> bool:
    """True when no known identifier occurs in `texts`: `scan` of the (path, text) pairs that hold exactly
    these distinct texts, in this order, finds nothing. Paths are worth working out only when this is False."""
    return not occurs_in_any([_untagged(t) for t in texts], tuple(known))


def _untagged(text: str) -> str:
    """`text` with each tag the stack wrote blanked (the same length: brackets kept, the word as spaces)."""
    if "[" not in text:
        return text
    return TAG_RE.sub(lambda m: "[" + " " * (len(m.group()) - 2) + "]", text)
