"""The rule methods, declared once: each method's name, the values it is meant for, and whether it works on
dates. Both engines implement every method under the same name (fhir_transforms/r4/methods.py,
fhir_transforms/hl7v2/engine.py), and rule validation (fhir_transforms/rules.py, fhir_transforms/hl7v2/rules.py)
accepts only the names declared here."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """A rule method as rules name it; the engines hold its functions."""

    name: str
    meant_for: str  # what a rule may apply it to, in words (error messages and `rules` documentation)
    on_dates: bool = False  # HL7v2: a later value of the same field is ruled too when it is a date (TS-1, DR)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("remove", "any element; with `category`, the removed value is also a known identifier"),
    Method("keep", "any element"),
    Method("year", "dates and date-times: the year alone", on_dates=True),
    Method("shift", "dates and date-times: a keyed per-patient offset", on_dates=True),
    Method("age90", "birth dates and ages: removed at 90 or more, else as dates", on_dates=True),
    Method("pseudonym", "identifiers, ids and references: a keyed pseudonym"),
    Method("fpe", "identifiers whose shape must hold: format-preserving encryption"),
    Method("zip3", "postal codes: the first three digits, 000 for restricted prefixes"),
    Method("text", "free text: through the text stack"),
    Method("term", "coded text and facility names: kept, with the record's known identifiers masked; "
                   "a text with no code beside it (a CodeableConcept.text unlike its codings' displays, an HL7v2 "
                   "text component without its code) goes through the text stack"),
)}


def check_implemented(engine: str, functions: dict) -> None:
    """An engine implements every declared method, and nothing else (checked when the engine loads)."""
    if set(functions) != set(METHODS):
        raise RuntimeError(f"{engine}: methods {sorted(set(functions) ^ set(METHODS))} are not declared and "
                           f"implemented alike")
