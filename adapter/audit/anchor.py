"""The audit chain's head, anchored outside the store: an append-only, fsynced file of signed (seq, record hash) lines.

A store can go back to an earlier consistent head (a SQLite WAL truncated or lost, a database restored from a
backup) and its chain and head checkpoint still verify. Each committed append also writes one line here, after
its commit, so `audit verify` finds a store behind its anchor, or one that disagrees with it. Lines from
concurrent appenders may land out of order; the anchor's head is the highest seq among the file's last lines,
and every one of those lines must name a record the store holds.
A line is `seq record_hash audit_key_id hmac`, the HMAC (audit key) binding the seq to the hash.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import threading
from pathlib import Path
from typing import Mapping, NamedTuple, Optional

from fhir_transforms import keys

LABEL = b"deid-adapter audit anchor"
TAIL_BYTES = 64 << 10  # far more lines than appenders can write out of order


class AnchorError(RuntimeError):
    """The anchor file cannot be written or read, or a line in its tail does not verify."""


class AnchoredHead(NamedTuple):
    seq: int
    record_hash: str


def default_path(url: str, state_dir: Path) -> Optional[Path]:
    """Where a store's anchor lives: beside a SQLite file (`audit.sqlite.anchor`); for a server's store, in the state
    folder, named by a hash of its URL without the password (None for an in-memory SQLite store)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if not database or database == ":memory:":
            return None
        path = Path(database.removeprefix("file:").split("?", 1)[0])
        return path.with_name(path.name + ".anchor")
    name = parsed._replace(password=None).render_as_string(hide_password=False)
    return state_dir / f"audit-anchor-{hashlib.sha256(name.encode()).hexdigest()[:16]}.log"


def _mac(secret: bytes, seq: int, record_hash: str) -> str:
    return hmac.digest(secret, LABEL + b"\x00" + f"{seq}:{record_hash}".encode(), "sha256").hex()


class Anchor:
    """One store's anchor file: `write` after each committed append, `head` when verifying."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: Optional[int] = None
        self._lock = threading.Lock()

    def write(self, key: keys.Key, seq: int, record_hash: str) -> None:
        """Append one signed line and fsync it (one small write: O_APPEND keeps concurrent lines whole)."""
        line = f"{seq} {record_hash} {key.key_id} {_mac(key.secret, seq, record_hash)}\n".encode()
        try:
            os.write(self._open(), line)
            os.fdatasync(self._fd)
        except OSError as e:
            raise AnchorError(f"audit anchor {self.path}: {e.strerror}") from None

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                created = not self.path.exists()
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                                   0o600)
                if created:  # the new name is durable too
                    folder = os.open(self.path.parent, os.O_RDONLY)
                    try:
                        os.fsync(folder)
                    finally:
                        os.close(folder)
            return self._fd

    def head(self, ring: Mapping[str, keys.Key]) -> Optional[AnchoredHead]:
        """The highest anchored (seq, record hash) among the file's last lines; None when there is no file."""
        lines = self.lines(ring)
        return max(lines) if lines else None

    def lines(self, ring: Mapping[str, keys.Key]) -> Optional[list[AnchoredHead]]:
        """Every (seq, record hash) among the file's last lines; None when there is no file. A line that does not
        verify with a key of the ring is an AnchorError (the anchor was edited)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise AnchorError(f"audit anchor {self.path}: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - TAIL_BYTES)
            tail = os.pread(fd, size - start, start)
        finally:
            os.close(fd)
        raw_lines = tail.split(b"\n")
        if start > 0:
            raw_lines = raw_lines[1:]  # the first one may be cut
        found = []
        for number, raw in enumerate(raw_lines):
            if not raw:
                continue
            parts = raw.decode("ascii", "replace").split(" ")
            if len(parts) == 4 and parts[2] not in ring and parts[2].startswith("a-"):
                continue  # signed by an audit key the ring lacks (a retired key not passed): it cannot be checked
            key = ring.get(parts[2]) if len(parts) == 4 else None
            if key is None or not parts[0].isdigit() or not hmac.compare_digest(
                    parts[3], _mac(key.secret, int(parts[0]), parts[1])):
                if number == len(raw_lines) - 1:
                    continue  # a line cut by a crash during its write
                raise AnchorError(f"audit anchor {self.path}: a line does not verify with the audit key (edited, or "
                                  "written with a key not in the ring)")
            found.append(AnchoredHead(int(parts[0]), parts[1]))
        return found

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
