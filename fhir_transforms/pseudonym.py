"""The one pseudonym function of the project: keyed HMAC-SHA256, used by FHIR, HL7v2, text surrogates and bulk."""
from __future__ import annotations

import logging
import re
import uuid
from collections import Counter
from functools import lru_cache
from typing import Callable, Optional

from cryptography.hazmat.primitives import hashes, hmac

from fhir_transforms.encryption import ValueCipher
from fhir_transforms.fpe import FormatPreservingCipher, FpeFallback, FpeFormat, derive_key
from fhir_transforms.keys import Key

UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
MAX_SHIFT_DAYS = 365
fpe_log = logging.getLogger("deid_adapter.fpe")


class Pseudonymizer:
    """Same key + same namespace + same value → same pseudonym, on every machine and every night."""

    def __init__(self, key: Key, on_issue: Optional[Callable[[str, str, str], None]] = None):
        self.key_id = key.key_id
        self._secret = key.secret
        self.digest = lru_cache(maxsize=65536)(self._digest)
        self._uuid = lru_cache(maxsize=65536)(self._uuid_uncached)  # references repeat: format each UUID once
        self.on_issue = on_issue  # (namespace, original, pseudonym) for each pseudonym issued: the re-identification vault
        self.fpe_fallbacks: Counter[str] = Counter()  # reason -> values given the keyed token instead of an FPE pseudonym
        self._fpe_logged: set[tuple[str, str]] = set()
        self._fpe: FormatPreservingCipher | None = None
        self._fpe_encrypt = lru_cache(maxsize=65536)(self._fpe_encrypt_uncached)
        self.cipher: ValueCipher | None = None  # the `encrypt` method's, under the vault key (use_vault_key)

    def use_vault_key(self, vault_key: Key) -> None:
        """Let the `encrypt` method encrypt under this vault key (fhir_transforms/encryption.py)."""
        self.cipher = ValueCipher(vault_key)

    def _digest(self, namespace: str, value: str) -> bytes:
        mac = hmac.HMAC(self._secret, hashes.SHA256())
        mac.update(namespace.encode() + b"\x00" + value.encode())
        return mac.finalize()

    def token(self, namespace: str, value: str, length: int = 32) -> str:
        """A hex pseudonym of `length` characters (≤ 64)."""
        pseudonym = self.digest(namespace, value).hex()[:length]
        if self.on_issue:
            self.on_issue(namespace, value, pseudonym)
        return pseudonym

    def _uuid_uncached(self, namespace: str, value: str) -> str:
        return str(uuid.UUID(bytes=self.digest(namespace, value)[:16], version=4))

    def uuid(self, namespace: str, value: str) -> str:
        """A pseudonym that is itself a valid (version 4 layout) UUID."""
        pseudonym = self._uuid(namespace, value)
        if self.on_issue:
            self.on_issue(namespace, value, pseudonym)
        return pseudonym

    def resource_id(self, value: str) -> str:
        """Pseudonym for a resource id: a UUID stays a UUID (so `urn:uuid:` references stay UUIDs)."""
        if UUID_RE.match(value):
            return self.uuid("id", value.lower())
        return self.token("id", value)

    def identifier(self, system: str | None, value: str) -> str:
        """Pseudonym for an identifier value, namespaced by its system."""
        return self.token("identifier|" + (system or ""), value)

    def fpe_cipher(self) -> FormatPreservingCipher:
        """FF3-1 under the FPE key, derived from this key with HKDF (see fhir_transforms/fpe.py)."""
        if self._fpe is None:
            self._fpe = FormatPreservingCipher(derive_key(self._secret))
        return self._fpe

    def _fpe_encrypt_uncached(self, namespace: str, value: str, fmt: FpeFormat) -> str:
        return self.fpe_cipher().encrypt(namespace, value, fmt)

    def format_preserving(self, namespace: str, value: str, fmt: FpeFormat) -> str:
        """A pseudonym of the value's own shape (FF3-1); the keyed token, counted and logged, when it cannot have one."""
        try:
            pseudonym = self._fpe_encrypt(namespace, value, fmt)
        except FpeFallback as e:
            self.fpe_fallbacks[e.reason] += 1
            if (e.reason, namespace) not in self._fpe_logged:  # one line per reason and namespace; never the value
                self._fpe_logged.add((e.reason, namespace))
                fpe_log.warning("fpe: %s value in namespace %r: keyed pseudonym used instead", e.reason, namespace)
            return self.token(namespace, value)
        if self.on_issue:
            self.on_issue(namespace, value, pseudonym)
        return pseudonym

    def identifier_fpe(self, system: str | None, value: str, fmt: FpeFormat) -> str:
        """Format-preserving pseudonym for an identifier value, its tweak derived from its system."""
        return self.format_preserving("identifier|" + (system or ""), value, fmt)

    def day_offset(self, subject: str, scope: str = "patient") -> int:
        """The date shift in days of a patient (or, by `scope`, of a record or a release), in [-365, 365] and never 0."""
        n = int.from_bytes(self.digest("date-shift" if scope == "patient" else f"date-shift|{scope}", subject)[:8], "big")
        offset = n % (2 * MAX_SHIFT_DAYS) - MAX_SHIFT_DAYS
        return offset if offset < 0 else offset + 1
