"""Consistent, realistic surrogates keyed by the project's one pseudonym function.

The same covered text (case-insensitively) and key always give the same surrogate, in every note and
run, so "Mr. Smith" and "Smith" in two notes stay the same person. Surrogates are fictional.
"""
from __future__ import annotations

import re
from typing import Protocol


class Keyed(Protocol):
    """What surrogates need of the project's one pseudonym function (fhir_transforms.pseudonym.Pseudonymizer):
    the text stack takes it from the caller and never imports the engines."""

    def digest(self, namespace: str, value: str) -> bytes: ...

    def token(self, namespace: str, value: str, length: int) -> str: ...

FIRST = ["Alex", "Jordan", "Taylor", "Morgan", "Casey", "Riley", "Avery", "Quinn", "Rowan", "Emerson", "Harper",
         "Reese", "Skyler", "Dakota", "Finley", "Sawyer"]
LAST = ["Ashdown", "Brightwater", "Calloway", "Dunmore", "Ellery", "Fairbank", "Greyson", "Hollins", "Ivers",
        "Jessup", "Kettering", "Lowell", "Merriman", "Northcott", "Oakley", "Pembrook"]
PLACES = ["Cedar Hollow", "Maple Ridge", "Stonebrook", "Willow Bend", "Ashford Springs", "Pine Harbor",
          "Riverside Glen", "Fox Meadow"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


class Surrogates:
    """A replacement function for text_deid.replace.apply: (category, covered text) → surrogate."""

    def __init__(self, pseudo: Keyed):
        self.pseudo = pseudo

    def _pick(self, category: str, covered: str, choices: list[str], salt: str = "") -> str:
        digest = self.pseudo.digest("surrogate|" + category + salt, covered.strip().lower())
        return choices[int.from_bytes(digest[:4], "big") % len(choices)]

    def _shape(self, category: str, covered: str) -> str:
        """Keep the shape: each digit becomes a keyed digit, each letter a keyed letter, separators stay."""
        digest = self.pseudo.digest("surrogate|" + category, covered.strip().lower())
        out = []
        for i, ch in enumerate(covered):
            b = digest[i % len(digest)] ^ (i * 37 & 0xFF)
            if ch.isdigit():
                out.append(str(b % 10))
            elif ch.isalpha():
                letter = chr(ord("A") + b % 26)
                out.append(letter if ch.isupper() else letter.lower())
            else:
                out.append(ch)
        return "".join(out)

    def __call__(self, category: str, covered: str) -> str:
        if category == "NAME":
            words = covered.split()
            if len(words) >= 2:
                return f"{self._pick(category, covered, FIRST)} {self._pick(category, covered, LAST, '|last')}"
            return self._pick(category, covered, LAST, "|last")
        if category == "GEOGRAPHIC_LOCATION":
            return self._pick(category, covered, PLACES)
        if category == "DATE":
            digest = self.pseudo.digest("surrogate|DATE", covered.strip().lower())
            year = re.search(r"\b(19|20)\d{2}\b", covered)
            month = MONTHS[digest[0] % 12]
            return f"{month} {1 + digest[1] % 28}" + (f", {year.group(0)}" if year else "")
        if category == "EMAIL_ADDRESS":
            return f"user{self.pseudo.token('surrogate|EMAIL', covered.lower(), 8)}@example.org"
        if category == "URL":
            return f"https://example.org/{self.pseudo.token('surrogate|URL', covered.lower(), 12)}"
        if category == "AGE_OVER_89":
            return "90+"
        return self._shape(category, covered)
