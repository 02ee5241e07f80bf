"""The rule methods, declared once: each method's name, the values it is meant for, and whether it works on
dates. Both engines implement every method under the same name (fhir_transforms/r4/methods.py,
fhir_transforms/hl7v2/engine.py), and rule validation (fhir_transforms/rules.py, fhir_transforms/hl7v2/rules.py)
accepts only the names declared here. A method's `options` (the settings a rule may give it, as JSON Schema) are
what the site rules schema (fhir_transforms/site_rules.py, mappings/site-rules.schema.json) accepts.

Methods are added here, and nowhere else: the schema, `rules check` and the engines' check follow."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

CATEGORY = {"type": "string", "pattern": "^[A-Z][A-Z_]*$"}  # a known identifier's category (text_deid/spans.py)


@dataclass(frozen=True)
class Method:
    """A rule method as rules name it; the engines hold its functions."""

    name: str
    meant_for: str  # what a rule may apply it to, in words (error messages and `rules` documentation)
    on_dates: bool = False  # HL7v2: a later value of the same field is ruled too when it is a date (TS-1, DR)
    options: Mapping[str, dict] = field(default_factory=lambda: MappingProxyType({}))  # setting → its JSON Schema


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("remove", "any element; with `category`, the removed value is also a known identifier",
           options={"category": CATEGORY}),
    Method("keep", "any element; HL7v2 `checked`: a kept value holding a date-time or a known identifier is not kept",
           options={"checked": {"type": "boolean"}}),
    Method("year", "dates and date-times: the year alone", on_dates=True),
    Method("shift", "dates and date-times: a keyed per-patient offset", on_dates=True),
    Method("age90", "birth dates and ages: removed at 90 or more, else as dates", on_dates=True),
    Method("pseudonym", "identifiers, ids and references: a keyed pseudonym", options={
        "category": CATEGORY,
        "namespace": {"type": "string", "minLength": 1},  # HL7v2: a keyed token of this namespace
        "per_sender": {"enum": [True, False, "receiver"]},
        "length": {"type": "integer", "minimum": 16, "maximum": 64}}),
    Method("fpe", "identifiers whose shape must hold: format-preserving encryption", options={
        "category": CATEGORY,
        "alphabet": {"type": "string", "minLength": 2},  # digits, alphanumeric, or the characters themselves
        "keep_prefix": {"type": "integer", "minimum": 0},
        "check_digit": {"enum": ["none", "luhn"]},
        "types": {"type": "array", "items": {"type": "string"}}}),
    Method("zip3", "postal codes: the first three digits, 000 for restricted prefixes"),
    Method("text", "free text: through the text stack"),
)}


def check_implemented(engine: str, functions: dict) -> None:
    """An engine implements every declared method, and nothing else (checked when the engine loads)."""
    if set(functions) != set(METHODS):
        raise RuntimeError(f"{engine}: methods {sorted(set(functions) ^ set(METHODS))} are not declared and "
                           f"implemented alike")
