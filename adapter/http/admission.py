"""What the service takes on: a memory estimate per request against a budget for all requests in flight, and
a limit on each client's requests at once and waiting, so that one client's heavy requests cannot starve the rest.

The estimate is made before any work starts, from the body's size and the total length of its texts (the text
stack's tokens, windows and spans cost far more per character than the parsed structure does per byte). A
request whose estimate alone is over the budget can never fit (413); one that does not fit beside those in
flight is asked to come back (503 with Retry-After). A request's memory counts until its worker thread ends,
not when its answer is sent: a request past its deadline holds its share until its detectors have stopped.
"""
from __future__ import annotations

import asyncio
import os
import threading
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

MIB = 1 << 20
BODY_FACTOR = 15  # peak memory per byte of parsed body (benchmarks/bundle_memory.py: 13-30x with validation off)
BYTES_PER_TEXT_CHAR = 180  # the text stack's tokens, offsets, NER windows and probabilities per character of text
TEXT_MIN_CHARS = 256  # shorter strings are codes, names and dates: counted in the body's share
RETRY_AFTER_S = 5


class TooCostly(Exception):
    """The request's estimate alone is over the budget: it can never be taken (413)."""


class Busy(Exception):
    """Not now: the memory budget or the client's limit is taken (503 or 429, with Retry-After)."""

    def __init__(self, status: int, diagnostics: str):
        super().__init__(diagnostics)
        self.status, self.diagnostics = status, diagnostics


def default_budget_mb() -> int:
    """Half of the machine's memory, in MiB (4096 where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MIB / 2)
    except (ValueError, OSError, AttributeError):
        return 4096


def text_chars(doc) -> int:
    """Total length of a parsed JSON document's long strings (narrative, notes, attachments as decoded)."""
    total, stack = 0, [(None, doc)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, str):
            if len(value) >= TEXT_MIN_CHARS:
                total += len(value) * 3 // 4 if key == "data" else len(value)  # base64: 4 characters, 3 bytes
        elif isinstance(value, dict):
            stack.extend(value.items())
        elif isinstance(value, list):
            stack.extend((key, v) for v in value)
    return total


def estimate_mb(body_bytes: int, chars: int) -> float:
    """Peak memory (MiB) a request of this body size and text length is expected to take."""
    return (body_bytes * BODY_FACTOR + chars * BYTES_PER_TEXT_CHAR) / MIB


class Admission:
    """The memory budget of requests in flight, and each client's running and waiting requests."""

    def __init__(self, budget_mb: float, per_client: int, per_client_queue: int):
        self.budget_mb, self.per_client, self.per_client_queue = budget_mb, per_client, per_client_queue
        self.inflight_mb = 0.0
        self._lock = threading.Lock()  # released from worker threads
        self._held: dict[str, int] = {}
        self._running: dict[str, asyncio.Semaphore] = {}

    def reserve(self, mb: float) -> Callable[[], None]:
        """Take `mb` of the budget, or TooCostly / Busy; the answer releases it (call it once)."""
        if mb > self.budget_mb:
            raise TooCostly(f"the request is estimated at {mb:.0f} MiB, over the service's budget of "
                            f"{self.budget_mb:.0f} MiB: send smaller requests")
        with self._lock:
            if self.inflight_mb + mb > self.budget_mb:
                raise Busy(503, "the service's memory budget is taken by requests in flight: retry later")
            self.inflight_mb += mb

        def release() -> None:
            with self._lock:
                self.inflight_mb -= mb
        return release

    @asynccontextmanager
    async def client_slot(self, client: str) -> AsyncIterator[None]:
        """Run when one of the client's `per_client` places is free; Busy (429) when its queue is full too."""
        held = self._held.get(client, 0)
        if held >= self.per_client + self.per_client_queue:
            raise Busy(429, f"over {self.per_client} requests at once and {self.per_client_queue} waiting "
                            "for this client: retry later")
        self._held[client] = held + 1
        running = self._running.setdefault(client, asyncio.Semaphore(self.per_client))
        try:
            async with running:
                yield
        finally:
            self._held[client] -= 1
            if not self._held[client]:
                del self._held[client]
