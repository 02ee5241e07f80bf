"""The value functions of `substitute`, `perturb` and `generalize`, shared by the FHIR and HL7v2 engines: each
takes a plain value (a string or a number) and the rule's settings, and knows no message or resource."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

from fhir_transforms.pseudonym import Pseudonymizer
from text_deid.surrogates import Surrogates

# substitute's kinds → the surrogate category of the text stack (text_deid/surrogates.py)
KIND_CATEGORY = {"name": "NAME", "given": "NAME", "family": "NAME", "place": "GEOGRAPHIC_LOCATION",
                 "phone": "PHONE_NUMBER", "email": "EMAIL_ADDRESS", "url": "URL", "id": "UNIQUE_IDENTIFIER",
                 "text": "NAME"}
NO_MATCH = object()


def surrogate(pseudo: Pseudonymizer, kind: str, value: str) -> str:
    """A keyed surrogate of the same kind: the same value and key always give the same surrogate (a given
    name a first name, a family name a last name, a phone number a phone number of the same shape)."""
    surrogates = Surrogates(pseudo)
    if kind == "given":
        return surrogates("NAME", f"{value} x").split()[0]  # two words: the first-name list
    if kind == "family":
        return surrogates("NAME", value.split()[-1] if value.split() else value)
    if kind == "text":
        return f"[{pseudo.token('substitute|text', value, 8)}]"
    return surrogates(KIND_CATEGORY[kind], value)


def perturb(pseudo: Pseudonymizer, namespace: str, value: int | float, options: dict) -> int | float:
    """`value` plus keyed noise in [-span, +span] (proportional: span × |value|), rounded to `round_to` decimal
    places (default: the value's own). The noise is a keyed function of the namespace and the value: the same
    value at the same place gives the same result under one key, and cannot be undone without it."""
    span = float(options.get("span", 0))
    if options.get("range", "fixed") == "proportional":
        span *= abs(float(value))
    unit = int.from_bytes(pseudo.digest("perturb|" + namespace, repr(value))[:8], "big") / 2 ** 64  # [0, 1)
    noisy = float(value) + (2 * unit - 1) * span
    places = options.get("round_to")
    if places is None:
        places = 0 if isinstance(value, int) else max(0, -Decimal(repr(value)).as_tuple().exponent)
    rounded = round(noisy, int(places))
    return int(rounded) if isinstance(value, int) or int(places) == 0 else rounded


def generalize(value: Any, cases: list) -> Any:
    """The `to` of the first case that matches `value` (a `range` [low, high): low ≤ value < high, either
    end null for open; or `value`: one value or a list), else NO_MATCH. Numbers compare as numbers, other
    values as text (ISO dates of one precision order as text)."""
    for case in cases:
        if "range" in case:
            low, high = case["range"]
            try:
                if (low is None or _cmp(value, low) >= 0) and (high is None or _cmp(value, high) < 0):
                    return case["to"]
            except (TypeError, ValueError):
                continue  # a value of another kind than the range: no match
        else:
            wanted = case["value"] if isinstance(case["value"], list) else [case["value"]]
            if any(_same(value, w) for w in wanted):
                return case["to"]
    return NO_MATCH


def _number(value) -> float:
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number")
    return float(value)


def _cmp(a, b) -> int:
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        x, y = _number(a), _number(b)
    else:
        x, y = str(a), str(b)
    return (x > y) - (x < y)


def _same(a, b) -> bool:
    try:
        return _cmp(a, b) == 0
    except (TypeError, ValueError):
        return False
