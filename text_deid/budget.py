"""Time budgets: one deadline per record, passed down to every detector, that stops the work when it passes.

A caller with a limit of its own (the HTTP service's `--timeout-s`) opens `within(seconds)` or `until(deadline)`
around the record; the text stack narrows it to its own limit and hands it to its pooled detectors. Detectors
read it with `current()` and give each regular expression `timeout=remaining(...)`; past the deadline they raise
DetectorError, so the record is refused and the thread that ran it is free again.
"""
from __future__ import annotations

import time
from contextvars import ContextVar
from typing import ContextManager

from text_deid.spans import DetectorError

_deadline: ContextVar[float | None] = ContextVar("deid_deadline", default=None)


def current() -> float | None:
    """The deadline of the record now being worked on (time.monotonic() seconds), or None for no limit."""
    return _deadline.get()


class _Until:
    """The block's deadline; a class rather than @contextmanager: the text stack opens one per record, and a
    generator-based context manager costs a few microseconds more, as much as a short text's detection."""

    __slots__ = ("deadline", "token")

    def __init__(self, deadline: float | None):
        self.deadline = deadline

    def __enter__(self) -> float | None:
        outer = _deadline.get()
        deadline = self.deadline
        narrowed = deadline if outer is None else outer if deadline is None else min(outer, deadline)
        self.token = _deadline.set(narrowed)
        return narrowed

    def __exit__(self, *exc) -> None:
        _deadline.reset(self.token)


def until(deadline: float | None) -> ContextManager[float | None]:
    """Work in this block stops at `deadline` (monotonic seconds), or at the enclosing deadline if that is sooner."""
    return _Until(deadline)


def within(seconds: float) -> ContextManager[float | None]:
    """Work in this block stops `seconds` from now, or at the enclosing deadline if that is sooner."""
    return _Until(time.monotonic() + seconds)


def remaining(deadline: float | None, who: str) -> float | None:
    """Seconds left before `deadline` (None: no limit); DetectorError naming `who` once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise DetectorError(f"{who}: over its time budget")
    return left


def check(who: str) -> None:
    """DetectorError naming `who` when the current deadline has passed."""
    remaining(_deadline.get(), who)
