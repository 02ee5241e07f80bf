"""Connections that cannot be held open for free: a time limit on a request's headers, which uvicorn lacks.

uvicorn bounds the idle time between requests of a kept-alive connection (`timeout_keep_alive`) and, with
`limit_concurrency`, answers 503 once that many connections or requests are open; but a connection that sends
nothing, or its headers a byte at a time, is held for as long as the client likes (any byte cancels the
keep-alive timer). This protocol closes a connection whose request headers are not complete within
`HEADER_TIMEOUT_S` of its opening or of its last answer. The body's time is bounded in the service.
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are late."""

    header_timeout_s = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _headers_late(self) -> None:
        waiting = self.cycle is None or self.cycle.response_complete  # no request under way: headers not complete
        if waiting and not self.transport.is_closing():
            self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class with its header time limit set (uvicorn takes a class, not an instance)."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": seconds})
