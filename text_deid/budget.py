"""Time budgets: one deadline per record, passed down to every detector, that stops the work when it passes.

A caller with a limit of its own (the HTTP service's `--timeout-s`) opens `within(seconds)` or `until(deadline)`
around the record; the text stack narrows it to its own limit and hands it to its pooled detectors. Detectors
read it with `current()` and give each regular expression `timeout=remaining(...)`; past the deadline they raise
DetectorError, so the record is refused and the thread that ran it is free again.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

from text_deid.spans import DetectorError

_deadline: ContextVar[float | None] = ContextVar("deid_deadline", default=None)


def current() -> float | None:
    """The deadline of the record now being worked on (time.monotonic() seconds), or None for no limit."""
    return _deadline.get()


@contextmanager
def until(deadline: float | None) -> Iterator[float | None]:
    """Work in this block stops at `deadline` (monotonic seconds), or at the enclosing deadline if that is sooner."""
    outer = _deadline.get()
    narrowed = deadline if outer is None else outer if deadline is None else min(outer, deadline)
    token = _deadline.set(narrowed)
    try:
        yield narrowed
    finally:
        _deadline.reset(token)


@contextmanager
def within(seconds: float) -> Iterator[float | None]:
    """Work in this block stops `seconds` from now, or at the enclosing deadline if that is sooner."""
    with until(time.monotonic() + seconds) as deadline:
        yield deadline


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
