"""Key files: where the HMAC secret comes from. Never logged, never in an error message."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

KEY_FILE_ENV = "DEID_ADAPTER_KEY_FILE"


class KeyError_(ValueError):
    """The key file is missing, unreadable, malformed or too open. Messages name the path, never the key."""


@dataclass(frozen=True)
class Key:
    """A pseudonymization secret and its public id (the id may be written to outputs; the secret never)."""

    key_id: str
    secret: bytes = field(default=b"", repr=False)

    def __repr__(self) -> str:  # keep the secret out of tracebacks and logs
        return f"Key(key_id={self.key_id!r})"


def key_id_for(secret: bytes) -> str:
    """A short public id derived one-way from the secret."""
    return "k-" + hashlib.sha256(b"deid-adapter key id\x00" + secret).hexdigest()[:12]


def init_key_file(path: Path) -> Key:
    """Write a new random 256-bit key to `path` with mode 0600; refuse to overwrite."""
    secret = secrets.token_bytes(32)
    key = Key(key_id_for(secret), secret)
    body = {"version": 1, "key_id": key.key_id, "secret": base64.b64encode(secret).decode()}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(body, f)
        f.write("\n")
    return key


def load_key(path: str | os.PathLike | None = None) -> Key:
    """Load the key from `path`, or from the file named by DEID_ADAPTER_KEY_FILE."""
    path = path or os.environ.get(KEY_FILE_ENV)
    if not path:
        raise KeyError_(f"no key: pass --key-file or set {KEY_FILE_ENV} (create one with `deid-adapter keys init PATH`)")
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError as e:
        raise KeyError_(f"key file {p}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyError_(f"key file {p} is readable by group or others (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    try:
        body = json.loads(p.read_text())
        secret = base64.b64decode(body["secret"], validate=True)
    except (ValueError, KeyError, TypeError):
        raise KeyError_(f"key file {p} is not a deid-adapter key file") from None
    if len(secret) < 32:
        raise KeyError_(f"key file {p}: secret shorter than 256 bits")
    key_id = key_id_for(secret)
    if body.get("key_id") not in (None, key_id):
        raise KeyError_(f"key file {p}: key id does not match its secret")
    return Key(key_id, secret)
