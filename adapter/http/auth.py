"""Bearer tokens for the HTTP service: a file of hashed tokens, each with a client name and allowed operations.

Only SHA-256 hashes of tokens are stored; a token is shown once, when it is created.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from fhir_transforms.config import files

OPERATIONS = ("fhir", "hl7v2", "metadata", "metrics", "ready")
TOKENS_ENV = "DEID_ADAPTER_TOKENS"


class TokenFileError(ValueError):
    """The token file is missing, malformed or readable by others."""


@dataclass(frozen=True)
class Client:
    name: str
    operations: frozenset[str]


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    def __init__(self, entries: dict[str, Client]):
        self._by_hash = entries

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TokenStore":
        p = Path(path)
        try:
            mode = p.stat().st_mode
            doc = json.loads(files.read_config_text(p))
        except OSError as e:
            raise TokenFileError(f"token file {p}: {e.strerror}") from None
        except ValueError:
            raise TokenFileError(f"token file {p} is missing or not JSON") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenFileError(f"token file {p} is readable by group or others; chmod 600 it")
        entries = {}
        for c in doc.get("clients", []):
            unknown = set(c.get("operations", [])) - set(OPERATIONS)
            if unknown or not c.get("token_sha256") or not c.get("client"):
                raise TokenFileError(f"token file {p}: bad entry for client {c.get('client')!r}")
            entries[c["token_sha256"]] = Client(c["client"], frozenset(c["operations"]))
        return cls(entries)

    def authenticate(self, token: str) -> Client | None:
        digest = _hash(token)
        for known, client in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return client
        return None


def add_client(path: Path, client: str, operations: list[str]) -> str:
    """Add a client with a new random token to the file (created 0600); return the token, to be shown once."""
    unknown = set(operations) - set(OPERATIONS)
    if unknown:
        raise TokenFileError(f"unknown operations {sorted(unknown)} (known: {', '.join(OPERATIONS)})")
    doc = json.loads(files.read_config_text(path)) if path.exists() else {"clients": []}
    token = secrets.token_urlsafe(32)
    doc["clients"] = [c for c in doc["clients"] if c.get("client") != client]
    doc["clients"].append({"client": client, "token_sha256": _hash(token), "operations": sorted(set(operations))})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
    os.chmod(path, 0o600)
    return token
