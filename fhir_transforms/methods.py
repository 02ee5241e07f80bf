"""The rule methods, declared once: each method's name, the values it is meant for, its parameters with their
types, the security label it adds, and the engines that implement it. Both engines implement every method
under the same name (fhir_transforms/r4/methods.py, fhir_transforms/hl7v2/engine.py); rule validation
(fhir_transforms/rules.py, fhir_transforms/hl7v2/rules.py) accepts only the names and parameters declared
here, and a rules file's schema is derived from this table."""
from __future__ import annotations

from dataclasses import dataclass

FHIR, HL7V2 = "fhir", "hl7v2"
BOTH = frozenset({FHIR, HL7V2})
SCOPES = ("patient", "record", "release")  # whose date offset a `shift` uses
SUBSTITUTE_KINDS = ("name", "given", "family", "place", "phone", "email", "url", "id", "text")
PERTURB_RANGES = ("fixed", "proportional")
ENCRYPT_FORMATS = ("aes-siv", "fpe")
OTHERWISE = ("keep", "remove")


@dataclass(frozen=True)
class Param:
    """One setting of a rule beyond its method. `type` is a JSON Schema type name, or "any" (a value of the
    element's own type, e.g. the fixed value of `substitute`)."""

    name: str
    type: str
    meaning: str
    choices: tuple = ()
    engines: frozenset[str] = BOTH


@dataclass(frozen=True)
class Method:
    """A rule method as rules name it; the engines hold its functions."""

    name: str
    meant_for: str  # what a rule may apply it to, in words (error messages and `rules` documentation)
    on_dates: bool = False  # HL7v2: a later value of the same field is ruled too when it is a date (TS-1, DR)
    params: tuple[Param, ...] = ()
    label: str | None = None  # the v3-ObservationValue code it adds to meta.security (None: it depends, or none)
    engines: frozenset[str] = BOTH

    def param(self, name: str) -> Param | None:
        """The declared parameter of that name, the ones every method takes included."""
        return next((p for p in self.params + COMMON if p.name == name), None)


CATEGORY = Param("category", "string", "the removed or replaced value is also a known identifier of this category "
                 "(NAME, PHONE_NUMBER, ...): the text stack masks it and the leak guard looks for it")
FPE_PARAMS = (
    Param("alphabet", "string", "digits, alphanumeric, or a string of 2 or more distinct characters"),
    Param("keep_prefix", "integer", "leading characters left as they are"),
    Param("check_digit", "string", "a check digit to keep valid", ("none", "luhn")),
)
# every method takes these
COMMON = (
    Param("marking", "boolean", "record on the element what was done (an extension); default: the profile's `marking`",
          engines=frozenset({FHIR})),
)

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("remove", "any element; with `category`, the removed value is also a known identifier", params=(CATEGORY,),
           label="REDACTED"),
    Method("keep", "any element", params=(
        Param("checked", "boolean", "a kept code or number that holds a date with a time is ruled as a date, and one "
              "that holds a known identifier is removed", engines=frozenset({HL7V2})),)),
    Method("year", "dates and date-times: the year alone", on_dates=True, label="ABSTRED"),
    Method("shift", "dates and date-times: a keyed offset per patient, record or release, or a fixed one",
           on_dates=True, label="PSEUDED", params=(
               Param("offset_days", "integer", "a fixed offset in days (agreed with a partner) instead of a keyed one"),
               Param("scope", "string", "whose offset: one per patient (the default), per record, or one for the "
                     "whole release", SCOPES),
               Param("release", "string", "with scope release: the release's name (another name, another offset)"),
           )),
    Method("age90", "birth dates and ages: removed at 90 or more, else as dates", on_dates=True, label="AGGRED"),
    Method("pseudonym", "identifiers, ids and references: a keyed pseudonym", label="PSEUDED", params=(
        CATEGORY,
        Param("namespace", "string", "a keyed token in this namespace instead of an identifier pseudonym",
              engines=frozenset({HL7V2})),
        Param("per_sender", "any", "with namespace: one token per sender (true) or receiver (receiver)",
              (True, False, "receiver"), engines=frozenset({HL7V2})),
        Param("length", "integer", "with namespace: hex characters of the token (16 to 64)", engines=frozenset({HL7V2})),
    )),
    Method("fpe", "identifiers whose shape must hold: format-preserving encryption", label="PSEUDED", params=(
        CATEGORY, *FPE_PARAMS,
        Param("types", "array", "only identifiers of these type codes (MR, AN, ...); the others get `pseudonym`"),
    )),
    Method("zip3", "postal codes: the first three digits, 000 for restricted prefixes", label="ABSTRED"),
    Method("text", "free text: through the text stack", params=(
        Param("by_target", "object", "Reference.display: the rule of what the reference points to, by resource type "
              "(\"*\" for any other): {Patient: HumanName, Organization: Organization.name, ...}",
              engines=frozenset({FHIR})),
    )),
    Method("term", "coded text and facility names: kept, with the record's known identifiers masked; "
                   "a text with no code beside it (a CodeableConcept.text unlike its codings' displays, an HL7v2 "
                   "text component without its code) goes through the text stack"),
    Method("substitute", "any value: a fixed value, or a keyed surrogate of the same kind (a name for a name)",
           params=(
               Param("value", "any", "the fixed value that replaces every value (label REDACTED)"),
               Param("kind", "string", "a keyed surrogate of this kind (label PSEUDED)", SUBSTITUTE_KINDS),
               CATEGORY,
           )),
    Method("perturb", "numbers, quantities and ages: keyed deterministic noise; ages of 90 or more still become 90+",
           label="ABSTRED", params=(
               Param("span", "number", "the noise's half width: a number (fixed) or a fraction of the value "
                     "(proportional)"),
               Param("range", "string", "fixed (default) or proportional", PERTURB_RANGES),
               Param("round_to", "integer", "decimal places of the result (0: a whole number); default: those of "
                     "the value"),
           )),
    Method("generalize", "numbers, codes, dates and strings: the first matching case's value, else keep or remove",
           label="ABSTRED", params=(
               Param("cases", "array", "a list of {range: [low, high], to: V} (low ≤ value < high; either may be "
                     "null) or {value: X or [X, ...], to: V}"),
               Param("otherwise", "string", "a value no case matches: keep or remove (default)", OTHERWISE),
           )),
    Method("encrypt", "strings and identifiers: reversible encryption under the vault key", label="MASKED", params=(
        Param("format", "string", "aes-siv (default: deterministic AES-SIV, base64url) or fpe (FF3-1: the value "
              "keeps its shape)", ENCRYPT_FORMATS),
        *FPE_PARAMS,
    )),
)}


def check_implemented(engine: str, functions: dict) -> None:
    """An engine implements every declared method, and nothing else (checked when the engine loads)."""
    if set(functions) != set(METHODS):
        raise RuntimeError(f"{engine}: methods {sorted(set(functions) ^ set(METHODS))} are not declared and "
                           f"implemented alike")
