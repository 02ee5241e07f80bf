"""Sessions of the review page and the sign-in throttle.

A signed-in session lives in the review store (SQLite or PostgreSQL, beside the queue), keyed by the SHA-256 of a
random id that only the cookie carries: signing out deletes the row, so the old cookie opens nothing. The sign-in
form is guarded by a signed, stateless CSRF cookie, so an anonymous visit writes nothing.

The throttle counts failed sign-ins per user name and per client address in one process: too many in a window
lock that address, or that name for the addresses that failed as it (not for its owner elsewhere), for a while;
a successful sign-in clears the name's count.
"""
from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import (
    Column,
    Float,
    MetaData,
    String,
    Table,
    Text,
    delete,
    insert,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from adapter.audit import trail as audit
from adapter.review.queue import QueueError

SESSION_MAX_AGE_S = 8 * 3600
LOGIN_FORM_MAX_AGE_S = 3600

metadata = MetaData()
sessions = Table(
    "deid_review_session", metadata,
    Column("id", String(64), primary_key=True),  # SHA-256 of the cookie's id: the store alone opens no session
    Column("user", Text, nullable=False),
    Column("csrf", String(64), nullable=False),
    Column("expires", Float, nullable=False),
)


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    """Signed-in sessions in the review store, and the signed CSRF cookie of the sign-in form."""

    COOKIE = "deid_review_session"
    LOGIN_COOKIE = "deid_review_login"

    def __init__(self, engine: Engine, max_age_s: int = SESSION_MAX_AGE_S, clock: Callable[[], float] = time.time):
        self.engine, self.max_age_s, self.clock = engine, max_age_s, clock
        self._forms = URLSafeTimedSerializer(secrets.token_bytes(32), salt="deid-adapter review sign-in form")
        self._write(lambda conn: audit.create_tables(conn, metadata))

    def start(self, user: str) -> tuple[str, str]:
        """A new session for `user` (a sign-in always starts a new one: no fixation): the cookie value and its
        CSRF token. Expired sessions are dropped on the way."""
        session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        now = self.clock()

        def work(conn):
            conn.execute(delete(sessions).where(sessions.c.expires <= now))
            conn.execute(insert(sessions).values(id=_digest(session_id), user=user, csrf=csrf,
                                                 expires=now + self.max_age_s))
        self._write(work)
        return session_id, csrf

    def read(self, cookie: Optional[str]) -> Optional[tuple[str, str]]:
        """(user, CSRF token) of a live session, or None for a missing, unknown, ended or expired one."""
        if not cookie:
            return None
        query = select(sessions.c.user, sessions.c.csrf).where(sessions.c.id == _digest(cookie),
                                                               sessions.c.expires > self.clock())
        try:
            with self.engine.connect().execution_options(audit_read=True) as conn, conn.begin():
                found = conn.execute(query).first()
        except SQLAlchemyError as e:
            raise QueueError(f"review sessions: {type(e).__name__}") from None
        return (found.user, found.csrf) if found else None

    def end(self, cookie: Optional[str]) -> None:
        """Sign out: the session's row is deleted, so its cookie opens nothing any more."""
        if cookie:
            self._write(lambda conn: conn.execute(delete(sessions).where(sessions.c.id == _digest(cookie))))

    def login_form(self) -> tuple[str, str]:
        """A signed cookie value for the sign-in form and its CSRF token (nothing stored)."""
        csrf = secrets.token_urlsafe(32)
        return self._forms.dumps(csrf), csrf

    def login_form_csrf(self, cookie: Optional[str]) -> str:
        """The CSRF token of a sign-in form cookie, or "" for a missing, forged or expired one."""
        try:
            csrf = self._forms.loads(cookie or "", max_age=LOGIN_FORM_MAX_AGE_S)
        except BadSignature:
            return ""
        return csrf if isinstance(csrf, str) else ""

    def _write(self, work) -> None:
        try:
            with self.engine.begin() as conn:
                work(conn)
        except SQLAlchemyError as e:
            raise QueueError(f"review sessions: {type(e).__name__}") from None


@dataclass
class LoginThrottle:
    """Failed sign-ins per user name and per client address: `max_per_user` (or `max_per_address`) failures within
    `window_s` lock that name (or address) for `lockout_s`. In memory, per process."""

    max_per_user: int = 5
    max_per_address: int = 20
    window_s: float = 900.0
    lockout_s: float = 900.0
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, list[float]] = field(default_factory=dict)
    _locked: dict[str, float] = field(default_factory=dict)
    _blamed: dict[str, set[str]] = field(default_factory=dict)  # name → addresses that failed signing in as it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def locked_for(self, name: str, address: str) -> float:
        """Seconds until a sign-in as `name` from `address` is tried again; 0 when it may be tried now. A locked
        name stays open to addresses that have not failed as it: anyone can fail a name's sign-in on purpose,
        and that must not lock its owner out."""
        now = self.clock()
        with self._lock:
            name_lock = self._locked.get(f"u:{name}", 0.0) if address in self._blamed.get(name, ()) else 0.0
            return max(0.0, name_lock - now, self._locked.get(f"a:{address}", 0.0) - now)

    def failed(self, name: str, address: str) -> None:
        now = self.clock()
        with self._lock:
            self._blamed.setdefault(name, set()).add(address)
            for key, limit in ((f"u:{name}", self.max_per_user), (f"a:{address}", self.max_per_address)):
                recent = [t for t in self._failures.get(key, []) if t > now - self.window_s] + [now]
                if len(recent) >= limit or (key in self._locked and key.startswith("u:")):
                    self._locked[key] = max(self._locked.get(key, 0.0), now + self.lockout_s)
                    self._failures.pop(key, None)
                else:
                    self._failures[key] = recent
            self._forget(now)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(f"u:{name}", None)

    def _forget(self, now: float) -> None:
        # guessed names must not grow the tables without bound
        for key in [k for k, until in self._locked.items() if until <= now]:
            del self._locked[key]
        for key in [k for k, times in self._failures.items() if times[-1] <= now - self.window_s]:
            del self._failures[key]
        for name in [n for n in self._blamed if f"u:{n}" not in self._locked and f"u:{n}" not in self._failures]:
            del self._blamed[name]
