"""presidio-analyzer's patterns and checksums that the pattern detector reuses (SSN, credit card, IP, e-mail,
URL, DEA, NPI), held here so that the patterns stack starts without importing presidio: its package import
loads spaCy and every recognizer (about 2.3 s, most of a one-message run).

The regexes are presidio's, copied into `text_deid/data/presidio-patterns.json`; the checks below are its
`validate_result` / `invalidate_result`. tests/text/test_presidio_patterns.py compares both with the
installed presidio, so an upgrade that changes them fails there."""
from __future__ import annotations

import ipaddress
import json
from importlib import resources

PATTERNS: dict = json.loads(resources.files("text_deid").joinpath("data/presidio-patterns.json").read_text("utf-8"))


def _luhn(digits: str) -> bool:
    total = 0
    for i, d in enumerate(reversed(digits)):
        n = int(d) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def _sanitized(text: str) -> str:
    return text.replace("-", "").replace(" ", "")


def credit_card_valid(text: str) -> bool:
    """CreditCardRecognizer.validate_result: the Luhn check of the digits (dashes and spaces dropped)."""
    return _luhn(_sanitized(text))


def npi_valid(text: str) -> bool:
    """UsNpiRecognizer.validate_result: the Luhn check of 80840 followed by the NPI."""
    return _luhn("80840" + _sanitized(text))


def dea_valid(text: str) -> bool:
    """MedicalLicenseRecognizer.validate_result: the DEA check digit (two letters, seven digits)."""
    digits = [int(d) for d in _sanitized(text)[2:]]
    check = digits.pop()
    return (2 * sum(digits[-1::-2]) + sum(digits[-2::-2]) - check) % 10 == 0


def ssn_invalid(text: str) -> bool:
    """UsSsnRecognizer.invalidate_result: mixed delimiters, one repeated digit, a zero group, area 000 or
    666, or one of the published sample numbers."""
    if len({c for c in text if c in ".- "}) > 1:
        return True
    digits = "".join(c for c in text if c.isdigit())
    return (len(set(digits)) == 1 or digits[3:5] == "00" or digits[5:] == "0000" or digits[:3] in ("000", "666")
            or digits in ("123456789", "987654320", "078051120"))


def ip_invalid(text: str) -> bool:
    """IpRecognizer.invalidate_result: not an IPv4 or IPv6 address (with an optional prefix length)."""
    try:
        ipaddress.ip_interface(text)
    except ValueError:
        return True
    return False
