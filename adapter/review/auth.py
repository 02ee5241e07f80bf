"""Reviewers of the review page: a users file with scrypt password hashes, roles and sites; CSRF tokens
(sessions live in adapter/review/sessions.py).

The users file (mode 0600) holds `{"users": [{"name", "role", "site", "password": "scrypt$n$r$p$salt$hash"}]}`.
Roles: `reviewer` (reviews its site's held records) and `admin` (also sees its site's queue state and may discard).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fhir_transforms.config import files

ROLES = ("reviewer", "admin")
USERS_ENV = "DEID_ADAPTER_REVIEW_USERS"
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 14, 8, 1


class UsersFileError(ValueError):
    """The users file is missing, malformed or readable by others."""


@dataclass(frozen=True)
class Reviewer:
    name: str
    role: str
    site: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


MIN_PASSWORD_LENGTH = 8  # NIST SP 800-63B's floor for a chosen secret


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """An scrypt hash with a random salt, as `scrypt$n$r$p$salt$hash` (base64)."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"scrypt${n}${r}${p}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def check_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=32)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, base64.b64decode(digest))


# Checked when the name is unknown, so a wrong name costs as long as a wrong password.
_DUMMY = hash_password(secrets.token_urlsafe(16))


class UserStore:
    def __init__(self, users: dict[str, tuple[Reviewer, str]]):
        self._users = users

    @classmethod
    def load(cls, path: str | os.PathLike) -> "UserStore":
        p = Path(path)
        try:
            mode = p.stat().st_mode
            doc = json.loads(files.read_config_text(p))
        except OSError as e:
            raise UsersFileError(f"users file {p}: {e.strerror}") from None
        except ValueError:
            raise UsersFileError(f"users file {p} is missing or not JSON") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsersFileError(f"users file {p} is readable by group or others; chmod 600 it")
        users = {}
        for u in doc.get("users", []) if isinstance(doc, dict) else []:
            if not (isinstance(u, dict) and u.get("name") and u.get("role") in ROLES and u.get("site")
                    and str(u.get("password", "")).startswith("scrypt$")):
                raise UsersFileError(f"users file {p}: bad entry for user {u.get('name') if isinstance(u, dict) else u!r}")
            users[u["name"]] = (Reviewer(u["name"], u["role"], u["site"]), u["password"])
        return cls(users)

    def authenticate(self, name: str, password: str) -> Optional[Reviewer]:
        found = self._users.get(name)
        ok = check_password(password, found[1] if found else _DUMMY)
        return found[0] if found and ok else None

    def get(self, name: str) -> Optional[Reviewer]:
        found = self._users.get(name)
        return found[0] if found else None


def add_user(path: Path, name: str, role: str, site: str, password: str) -> None:
    """Add or replace a user in the file (created 0600); only the scrypt hash of the password is stored."""
    if role not in ROLES:
        raise UsersFileError(f"unknown role {role!r} (known: {', '.join(ROLES)})")
    if not name or not site or not password:
        raise UsersFileError("a user needs a name, a site and a password")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise UsersFileError(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")
    doc = json.loads(files.read_config_text(path)) if path.exists() else {"users": []}
    doc["users"] = [u for u in doc.get("users", []) if u.get("name") != name]
    doc["users"].append({"name": name, "role": role, "site": site, "password": hash_password(password)})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
    os.chmod(path, 0o600)


def csrf_ok(expected: str, given: Optional[str]) -> bool:
    return bool(expected) and bool(given) and hmac.compare_digest(expected.encode(), given.encode())
