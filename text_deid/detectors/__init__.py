"""Detectors: each module holds one detector implementing `Detector`."""
from __future__ import annotations

from typing import Protocol, Sequence

from text_deid.spans import KnownIdentifier, Span


class Detector(Protocol):
    """One layer of the text stack. Raises DetectorError (or anything) to fail the record."""

    name: str

    def detect(self, text: str, known: Sequence[KnownIdentifier]) -> list[Span]: ...
