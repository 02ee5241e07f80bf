"""Check digits of clinical code systems: a code whose check digit holds is a code, not an identifier."""
from __future__ import annotations

# Verhoeff's dihedral-group tables (SNOMED CT's check digit: SNOMED CT Technical Implementation Guide, 6.1.3).
_D = ((0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 0, 6, 7, 8, 9, 5), (2, 3, 4, 0, 1, 7, 8, 9, 5, 6),
      (3, 4, 0, 1, 2, 8, 9, 5, 6, 7), (4, 0, 1, 2, 3, 9, 5, 6, 7, 8), (5, 9, 8, 7, 6, 0, 4, 3, 2, 1),
      (6, 5, 9, 8, 7, 1, 0, 4, 3, 2), (7, 6, 5, 9, 8, 2, 1, 0, 4, 3), (8, 7, 6, 5, 9, 3, 2, 1, 0, 4),
      (9, 8, 7, 6, 5, 4, 3, 2, 1, 0))
_P = ((0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 5, 7, 6, 2, 8, 3, 0, 9, 4), (5, 8, 0, 3, 7, 9, 6, 1, 4, 2),
      (8, 9, 1, 6, 0, 4, 3, 5, 2, 7), (9, 4, 5, 3, 1, 2, 6, 8, 7, 0), (4, 2, 8, 6, 5, 7, 3, 9, 0, 1),
      (2, 7, 9, 3, 8, 0, 6, 4, 1, 5), (7, 0, 4, 6, 9, 1, 3, 2, 5, 8))
# SNOMED CT partition identifiers (the two digits before the check digit): concepts, descriptions,
# relationships, in the short (0x) and the extension (1x) formats
SNOMED_PARTITIONS = frozenset({"00", "01", "02", "10", "11", "12"})


def luhn_valid(digits: str) -> bool:
    """The mod-10 (Luhn) check over `digits`, its last digit the check digit."""
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = int(c) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def loinc_valid(code: str) -> bool:
    """A LOINC code "NNNNN-C": C is the mod-10 check digit of NNNNN (LOINC Users' Guide, 12.4)."""
    number, _, check = code.partition("-")
    return (number.isdigit() and check.isdigit() and len(check) == 1 and 1 <= len(number) <= 7
            and luhn_valid(number + check))


def verhoeff_valid(digits: str) -> bool:
    """Verhoeff's check over `digits`, its last digit the check digit."""
    c = 0
    for i, ch in enumerate(reversed(digits)):
        c = _D[c][_P[i % 8][int(ch)]]
    return c == 0


def snomed_valid(sctid: str) -> bool:
    """A SNOMED CT identifier: 6 to 18 digits, a partition identifier, and a valid Verhoeff check digit."""
    return (sctid.isdigit() and 6 <= len(sctid) <= 18 and sctid[0] != "0" and sctid[-3:-1] in SNOMED_PARTITIONS
            and verhoeff_valid(sctid))
