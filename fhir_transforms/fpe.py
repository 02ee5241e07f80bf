"""Format-preserving pseudonyms: FF3-1 (NIST SP 800-38G Rev. 1, first draft) over the characters of a value.

The Feistel structure is written here; the block cipher is AES from `cryptography` (never hand-written).
A value keeps its length, its separators and fixed prefix in place, and every character stays in its alphabet;
an optional Luhn check digit keeps its validity. The tweak (56 bits) is derived from the value's namespace
(the identifier's system), so one MRN maps differently in two systems and always the same in one.

The AES key is derived from the pseudonym key with HKDF-SHA256 under its own `info` label, so it is never the
HMAC key itself and needs no key file of its own; whoever holds the pseudonym key file can reverse an FPE value,
which is why reversal goes only through the audited `vault` command.
"""
from __future__ import annotations

import hashlib
import math
import string
import threading
from dataclasses import dataclass
from functools import lru_cache

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

DIGITS = string.digits
ALPHANUMERIC = string.digits + string.ascii_uppercase
ALPHABETS = {"digits": DIGITS, "alphanumeric": ALPHANUMERIC}
CHECK_DIGITS = ("none", "luhn")
DOMAIN_MIN = 1_000_000  # SP 800-38G Rev. 1: radix ** minlen >= one million
ROUNDS = 8
HKDF_INFO = b"deid-adapter fpe ff3-1 aes-256 v1"
TWEAK_LABEL = b"deid-adapter fpe tweak\x00"


class FpeFallback(ValueError):
    """The value cannot be format-preserved (too short, too long, or it would map to itself); `reason` says which."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class FF31:
    """FF3-1 encryption over one alphabet (radix 2..65536) with a 128-, 192- or 256-bit AES key."""

    def __init__(self, key: bytes, alphabet: str):
        if len(key) not in (16, 24, 32):
            raise ValueError("FF3-1 needs a 128-, 192- or 256-bit AES key")
        if len(set(alphabet)) != len(alphabet) or not 2 <= len(alphabet) <= 2 ** 16:
            raise ValueError("an FF3-1 alphabet is 2 to 65536 distinct characters")
        self.alphabet = alphabet
        self.radix = radix = len(alphabet)
        self._index = {ch: i for i, ch in enumerate(alphabet)}
        self.min_len = max(2, math.ceil(math.log(DOMAIN_MIN, radix) - 1e-9))
        while radix ** self.min_len < DOMAIN_MIN:  # guard the float log at exact powers
            self.min_len += 1
        self.max_len = 2 * _max_half(radix)
        # FF3-1 runs AES under the byte-reversed key (REVB(K)) on byte-reversed blocks
        self._aes = Cipher(algorithms.AES(key[::-1]), modes.ECB())
        self._local = threading.local()  # one encryptor context per thread: contexts are not shared across threads

    def encrypt(self, text: str, tweak: bytes) -> str:
        """Encrypt `text` (characters of the alphabet only) under a 56-bit tweak."""
        return self._run(text, tweak, decrypt=False)

    def decrypt(self, text: str, tweak: bytes) -> str:
        """Invert `encrypt` for the same tweak."""
        return self._run(text, tweak, decrypt=True)

    def _run(self, text: str, tweak: bytes, decrypt: bool) -> str:
        n = len(text)
        if not self.min_len <= n <= self.max_len:
            raise ValueError(f"FF3-1 length must be in [{self.min_len}, {self.max_len}] for radix {self.radix}")
        if len(tweak) != 7:
            raise ValueError("an FF3-1 tweak is 56 bits")
        u, v = (n + 1) // 2, n // 2
        # NUM_radix(REV(X)) is X read least-significant character first; the rounds work on those numbers
        a, b = self._num_rev(text[:u]), self._num_rev(text[u:])
        t_left = tweak[:3] + bytes([tweak[3] & 0xF0])
        t_right = tweak[4:] + bytes([(tweak[3] & 0x0F) << 4])
        mod_u, mod_v = self.radix ** u, self.radix ** v
        enc = self._encryptor()
        if not decrypt:
            for i in range(ROUNDS):
                even = i % 2 == 0
                y = _round(enc, t_right if even else t_left, i, b)
                a, b = b, (a + y) % (mod_u if even else mod_v)
        else:
            for i in reversed(range(ROUNDS)):
                even = i % 2 == 0
                y = _round(enc, t_right if even else t_left, i, a)
                a, b = (b - y) % (mod_u if even else mod_v), a
        return self._str_rev(a, u) + self._str_rev(b, v)

    def _encryptor(self):
        enc = getattr(self._local, "enc", None)
        if enc is None:
            enc = self._local.enc = self._aes.encryptor()
        return enc

    def _num_rev(self, text: str) -> int:
        index, radix, n = self._index, self.radix, 0
        try:
            for ch in reversed(text):
                n = n * radix + index[ch]
        except KeyError:
            raise ValueError("a character outside the FF3-1 alphabet") from None
        return n

    def _str_rev(self, n: int, length: int) -> str:
        out = []
        for _ in range(length):
            n, d = divmod(n, self.radix)
            out.append(self.alphabet[d])
        return "".join(out)


def _round(enc, w: bytes, i: int, half: int) -> int:
    """y of round i: P = (W xor [i]^4) || [half]^12; S = REVB(CIPH_REVB(K)(REVB(P))); y = NUM(S)."""
    p = bytes([w[0], w[1], w[2], w[3] ^ i]) + half.to_bytes(12, "big")
    return int.from_bytes(enc.update(p[::-1]), "little")


def _max_half(radix: int) -> int:
    """floor(log_radix(2^96)): the longest half that fits the 96 bits of the round input."""
    k = 0
    while radix ** (k + 1) <= 2 ** 96:
        k += 1
    return k


@dataclass(frozen=True)
class FpeFormat:
    """How a value is read: its alphabet, how many leading characters stay as they are, and its check digit."""

    alphabet: str = DIGITS
    keep_prefix: int = 0
    check_digit: str = "none"

    @classmethod
    def from_options(cls, options: dict) -> FpeFormat:
        """A format from a rule's settings (`alphabet`, `keep_prefix`, `check_digit`); ValueError names what is wrong."""
        unknown = set(options) - {"alphabet", "keep_prefix", "check_digit", "types", "category"}
        if unknown:
            raise ValueError(f"fpe: unknown setting(s) {', '.join(sorted(unknown))}")
        types = options.get("types", [])
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ValueError("fpe: types is a list of identifier type codes (MR, AN, VN, ...)")
        alphabet = options.get("alphabet", "digits")
        alphabet = ALPHABETS.get(alphabet, alphabet) if isinstance(alphabet, str) else None
        if not alphabet or len(alphabet) < 2 or len(set(alphabet)) != len(alphabet):
            raise ValueError("fpe: alphabet is digits, alphanumeric, or a string of 2 or more distinct characters")
        keep_prefix = options.get("keep_prefix", 0)
        if not isinstance(keep_prefix, int) or isinstance(keep_prefix, bool) or keep_prefix < 0:
            raise ValueError("fpe: keep_prefix is a number of leading characters (0 or more)")
        check_digit = str(options.get("check_digit", "none"))
        if check_digit not in CHECK_DIGITS:
            raise ValueError(f"fpe: check_digit is one of {', '.join(CHECK_DIGITS)}")
        if check_digit == "luhn" and alphabet != DIGITS:
            raise ValueError("fpe: a Luhn check digit needs the digits alphabet")
        return cls(alphabet, keep_prefix, check_digit)


def derive_key(secret: bytes) -> bytes:
    """The FPE AES-256 key: HKDF-SHA256 of the pseudonym secret under its own label (never the HMAC key itself)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO).derive(secret)


def tweak_for(namespace: str) -> bytes:
    """The 56-bit tweak of a namespace (`identifier|<system>`): public, like the system it comes from."""
    return hashlib.sha256(TWEAK_LABEL + namespace.encode()).digest()[:7]


def luhn_digit(payload: str) -> int:
    """The check digit that makes `payload + digit` pass the Luhn test."""
    total = 0
    for k, ch in enumerate(reversed(payload)):
        d = int(ch)
        if k % 2 == 0:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return -total % 10


class FormatPreservingCipher:
    """FF3-1 over the shape of identifier values: what the `fpe` method and the vault's reversal both use."""

    def __init__(self, key: bytes):
        self._key = key
        self._ciphers: dict[str, FF31] = {}

    def _cipher(self, alphabet: str) -> FF31:
        cipher = self._ciphers.get(alphabet)
        if cipher is None:
            cipher = self._ciphers[alphabet] = FF31(self._key, alphabet)
        return cipher

    def encrypt(self, namespace: str, value: str, fmt: FpeFormat) -> str:
        """The value with its alphabet characters encrypted in place; FpeFallback when it cannot be."""
        result = self._apply(namespace, value, fmt, decrypt=False)
        if result == value:
            raise FpeFallback("fixed-point")  # an FF3-1 fixed point: the output must never be the input
        return result

    def decrypt(self, namespace: str, value: str, fmt: FpeFormat) -> str:
        """The original behind an `encrypt` output of the same namespace and format."""
        return self._apply(namespace, value, fmt, decrypt=True)

    def _apply(self, namespace: str, value: str, fmt: FpeFormat, decrypt: bool) -> str:
        cipher = self._cipher(fmt.alphabet)
        alphabet = set(fmt.alphabet)
        positions = [i for i in range(fmt.keep_prefix, len(value)) if value[i] in alphabet]
        check = positions.pop() if fmt.check_digit == "luhn" and positions else None
        payload = "".join(value[i] for i in positions)
        if len(payload) < cipher.min_len:
            raise FpeFallback("too-short")
        if len(payload) > cipher.max_len:
            raise FpeFallback("too-long")
        tweak = tweak_for(namespace)
        out = list(value)
        new = cipher.decrypt(payload, tweak) if decrypt else cipher.encrypt(payload, tweak)
        for i, ch in zip(positions, new):
            out[i] = ch
        if check is not None:
            # keep the check digit's offset from the Luhn digit: a valid value stays valid, and reversal is exact
            offset = (int(value[check]) - luhn_digit(payload)) % 10
            out[check] = str((luhn_digit(new) + offset) % 10)
        return "".join(out)


@lru_cache(maxsize=256)
def _format(items: tuple) -> FpeFormat:
    return FpeFormat.from_options(dict(items))


def fpe_format(options: dict) -> FpeFormat:
    """The (cached) format of a rule's settings."""
    return _format(tuple(sorted((k, v) for k, v in options.items() if k not in ("category", "types"))))


def selects(options: dict, type_codes: set[str]) -> bool:
    """Whether an `fpe` rule applies to an identifier of these type codes (FHIR Identifier.type, HL7 CX-5):
    every identifier without `types`; else those of a listed type (the others keep the keyed pseudonym)."""
    types = options.get("types")
    return not types or bool(set(types) & {c.strip().upper() for c in type_codes if c})
