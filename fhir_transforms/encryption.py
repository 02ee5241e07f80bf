"""The `encrypt` method's cipher: reversible encryption of values in place under the vault key.

AES-SIV (RFC 5297, from `cryptography`) is deterministic: one value encrypts to the same text everywhere under
one key, so encrypted values still join, and it authenticates (a wrong key or an altered value fails to
decrypt). Where a value's shape must hold, FF3-1 (fhir_transforms/fpe.py) keeps its length and alphabet, without
authentication. Both keys are derived from the vault key with HKDF under their own labels, never the vault key
itself; the pseudonym key cannot decrypt, so whoever may re-identify holds a key the de-identification does not
need otherwise.
"""
from __future__ import annotations

import base64
import binascii

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fhir_transforms.fpe import FormatPreservingCipher, FpeFallback, FpeFormat
from fhir_transforms.keys import Key

SIV_INFO = b"deid-adapter encrypt aes-siv-512 v1"
FPE_INFO = b"deid-adapter encrypt ff3-1 aes-256 v1"
ASSOCIATED = [b"deid-adapter encrypt v1"]
FPE_NAMESPACE = "encrypt"  # one tweak for every encrypted value: decryption needs only the value and the format
PREFIX = "enc1."  # tells an AES-SIV value from data that happens to be base64


class DecryptionFailed(ValueError):
    """A value does not decrypt under this key and format (the message never quotes the value)."""


def _derive(secret: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


class ValueCipher:
    """Encrypt and decrypt values under one vault key: what `encrypt` and `vault decrypt` both use."""

    def __init__(self, vault_key: Key):
        self.key_id = vault_key.key_id
        self._siv = AESSIV(_derive(vault_key.secret, SIV_INFO, 64))
        self._fpe = FormatPreservingCipher(_derive(vault_key.secret, FPE_INFO, 32))

    def encrypt(self, value: str, fmt: FpeFormat | None = None) -> str:
        """AES-SIV as `enc1.<base64url>`; with a format, FF3-1 in place (FpeFallback when the value cannot keep its shape)."""
        if fmt is not None:
            return self._fpe.encrypt(FPE_NAMESPACE, value, fmt)
        sealed = self._siv.encrypt(value.encode(), ASSOCIATED)
        return PREFIX + base64.urlsafe_b64encode(sealed).decode().rstrip("=")

    def decrypt(self, value: str, fmt: FpeFormat | None = None) -> str:
        """The original behind an `encrypt` output of the same format; DecryptionFailed when it is none under this key."""
        if fmt is not None:
            try:
                return self._fpe.decrypt(FPE_NAMESPACE, value, fmt)
            except (FpeFallback, ValueError) as e:
                raise DecryptionFailed(f"not an fpe-encrypted value in this format ({e})") from None
        if not value.startswith(PREFIX):
            raise DecryptionFailed("not an encrypted value (no enc1. prefix)")
        body = value[len(PREFIX):]
        try:
            sealed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            return self._siv.decrypt(sealed, ASSOCIATED).decode()
        except (InvalidTag, binascii.Error, ValueError, UnicodeDecodeError):
            raise DecryptionFailed("the value does not decrypt with this vault key") from None
