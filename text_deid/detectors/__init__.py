"""Detectors: each module holds one detector implementing `Detector`."""
from __future__ import annotations

from typing import Protocol, Sequence

from text_deid.spans import KnownIdentifier, Span


class Detector(Protocol):
    """One layer of the text stack. Raises DetectorError (or anything) to fail the record."""

    name: str

    def detect(self, text: str, known: Sequence[KnownIdentifier]) -> list[Span]: ...

    # A detector may also define `detect_many(texts, known) -> list[list[Span]]` when searching a record's
    # texts together is cheaper than one by one; the stack uses it where present.
    # A detector whose every search carries its own time limit (and fails with DetectorError past it) sets
    # `bounds_own_time = True`: the stack then runs it in the calling thread instead of its pool.
    # A detector whose work is CPU in proportion to the text (no server to wait on) sets `text_bound = True`:
    # the stack runs it in the calling thread on a short record.
