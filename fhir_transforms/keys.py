"""Key files: where the secrets come from. Never logged, never in an error message, never in an audit record.

A key file holds one 256-bit secret for one *purpose*: `pseudonym` (the HMAC key of the pseudonym function),
`audit` (signs the audit trail), `vault` (AES-GCM key of the re-identification vault) or `review` (AES-GCM key
of the review queue's held text). Using a key for the
wrong purpose is refused. Rotation keeps the retired key beside the current one as `PATH.<key id>`; the
current file plus those siblings form the key ring that verification and the vault read.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from fhir_transforms.config import files

KEY_FILE_ENV = "DEID_ADAPTER_KEY_FILE"
PURPOSES = ("pseudonym", "audit", "vault", "review")
ID_PREFIX = {"pseudonym": "k-", "audit": "a-", "vault": "v-", "review": "r-"}
# 32 random bytes hold ~30 distinct values; fewer than 16 happens by chance with odds below 1e-15,
# but is what an all-zero, one-byte or short repeated secret (a placeholder, a test key) looks like.
MIN_DISTINCT_BYTES = 16


class KeyError_(ValueError):
    """The key file is missing, unreadable, malformed or too open. Messages name the path, never the key."""


@dataclass(frozen=True)
class Key:
    """A pseudonymization secret and its public id (the id may be written to outputs; the secret never)."""

    key_id: str
    secret: bytes = field(default=b"", repr=False)

    def __repr__(self) -> str:  # keep the secret out of tracebacks and logs
        return f"Key(key_id={self.key_id!r})"


def key_id_for(secret: bytes, purpose: str = "pseudonym") -> str:
    """A short public id derived one-way from the secret; its prefix names the purpose (k-, a-, v-, r-)."""
    label = b"deid-adapter key id\x00" if purpose == "pseudonym" else f"deid-adapter {purpose} key id\x00".encode()
    return ID_PREFIX[purpose] + hashlib.sha256(label + secret).hexdigest()[:12]


def _key_body(purpose: str) -> tuple[Key, bytes]:
    if purpose not in PURPOSES:
        raise KeyError_(f"unknown key purpose {purpose!r} (known: {', '.join(PURPOSES)})")
    secret = secrets.token_bytes(32)
    key = Key(key_id_for(secret, purpose), secret)
    body = {"version": 1, "purpose": purpose, "key_id": key.key_id, "secret": base64.b64encode(secret).decode(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return key, (json.dumps(body) + "\n").encode()


def init_key_file(path: Path, purpose: str = "pseudonym") -> Key:
    """Write a new random 256-bit key to `path` with mode 0600; refuse to overwrite."""
    key, body = _key_body(purpose)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    return key


def rotate_key_file(path: Path) -> tuple[Key, Key, Path]:
    """Retire the key at `path` to `PATH.<old key id>` (kept, never deleted) and put a new key of the same purpose at `path`.

    Returns (old key, new key, where the old one now lives). Data made with the old key keeps its old key id.
    """
    path = Path(path)
    purpose = key_purpose(path)
    old = load_key(path, purpose)
    archive = path.with_name(f"{path.name}.{old.key_id}")
    try:
        os.link(path, archive)  # a hard link: the retired key exists under both names until the swap below
    except FileExistsError:
        if load_key(archive, purpose).key_id != old.key_id:
            raise KeyError_(f"{archive} exists and holds another key; not rotating") from None
    new, body = _key_body(purpose)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return old, new, archive


def key_ring(path: Path, purpose: str | None = None) -> list[tuple[Path, Key, bool]]:
    """The key at `path` and the keys it retired (`PATH.<key id>`): (file, key, is current), current first."""
    path = Path(path)
    purpose = purpose or key_purpose(path)
    ring = [(path, load_key(path, purpose), True)]
    prefix = ID_PREFIX[purpose]
    for retired in sorted(path.parent.glob(f"{path.name}.{prefix}*")):
        ring.append((retired, load_key(retired, purpose), False))
    return ring


def key_purpose(path: Path) -> str:
    """The purpose a key file declares (files written before purposes existed are pseudonym keys)."""
    try:
        body = json.loads(files.read_config_text(path, files.MAX_KEY_BYTES))
    except OSError as e:
        raise KeyError_(f"key file {path}: {e.strerror}") from None
    except ValueError:
        raise KeyError_(f"key file {path} is not a deid-adapter key file") from None
    purpose = body.get("purpose", "pseudonym") if isinstance(body, dict) else None
    if purpose not in PURPOSES:
        raise KeyError_(f"key file {path} is not a deid-adapter key file")
    return purpose


def load_key(path: str | os.PathLike | None = None, purpose: str = "pseudonym") -> Key:
    """Load the key from `path`, or from the file named by DEID_ADAPTER_KEY_FILE; refuse a key made for another purpose."""
    if not path:
        if purpose != "pseudonym":
            raise KeyError_(f"no {purpose} key given (create one with `deid-adapter keys init --purpose {purpose} PATH`)")
        raise KeyError_(f"no key: pass --key-file or set {KEY_FILE_ENV} (create one with `deid-adapter keys init PATH`)")
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError as e:
        raise KeyError_(f"key file {p}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyError_(f"key file {p} is readable by group or others (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    try:
        body = json.loads(files.read_config_text(p, files.MAX_KEY_BYTES))
        secret = base64.b64decode(body["secret"], validate=True)
    except OSError as e:
        raise KeyError_(f"key file {p}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError):
        raise KeyError_(f"key file {p} is not a deid-adapter key file") from None
    if len(secret) < 32:
        raise KeyError_(f"key file {p}: secret shorter than 256 bits")
    if len(set(secret)) < MIN_DISTINCT_BYTES:
        raise KeyError_(f"key file {p}: secret is degenerate (all zero, one repeated byte or a short pattern); "
                        f"create a new key with `deid-adapter keys init`")
    declared = body.get("purpose", "pseudonym")
    if declared != purpose:
        raise KeyError_(f"key file {p} is a {declared} key, not a {purpose} key")
    key_id = key_id_for(secret, purpose)
    if body.get("key_id") not in (None, key_id):
        raise KeyError_(f"key file {p}: key id does not match its secret")
    return Key(key_id, secret)
