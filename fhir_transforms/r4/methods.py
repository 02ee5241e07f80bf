"""One function per rule method. Each takes the element's value and its Site and returns the new value,
REMOVE, or a TextRef (the value goes through the text stack). The walker knows no method's meaning."""
from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from datetime import date
from typing import Any, Callable, Mapping, Protocol

from fhir_transforms import dates, values, zipcodes
from fhir_transforms.r4 import references
from fhir_transforms.errors import InputError
from fhir_transforms.fpe import FpeFallback, fpe_format, selects
from fhir_transforms.known import PERSON_TYPES, STAFF_TYPES, identifier_category, type_codes
from fhir_transforms.methods import check_implemented
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.schema import Element, elements
from fhir_transforms.r4 import rendered
from fhir_transforms.r4.xhtml import Narrative
from text_deid.spans import Span



class Site(Protocol):
    """What a method sees of the element it is applied to (the walker's Site, fhir_transforms/r4/walker.py):
    declared here so that the methods need not import the walker that calls them."""

    element: Element
    parent: dict
    owner: str
    path: str
    fpath: str
    options: Mapping
    pseudo: Pseudonymizer
    fhir_version: str

    def clock(self) -> date: ...
    def label(self, code: str) -> None: ...
    def record_known(self, value, category: str, staff: bool = False) -> None: ...
    def record_identifier(self, value) -> None: ...
    def generated(self) -> None: ...
    def rewrite_reference(self, value: str) -> str | None: ...
    def record_original_ids(self, value: str, rtype: str | None = None) -> None: ...
    @property
    def resource_type(self) -> str: ...
    def day_offset(self) -> int: ...
    def scope_key(self) -> str: ...
    def age_limit_year(self) -> int | None: ...
    def method_of(self, key: str) -> str: ...
    def reference_targets(self) -> tuple[str, ...]: ...
    def apply_rule_of(self, key: str, value): ...
    def removes_identifier(self) -> bool: ...
    def add_primitive_extensions(self, extensions: list[dict]) -> None: ...
    def apply_type_rule(self, value): ...
    def walk_into(self, node: dict): ...

REMOVE = object()
REFERENCE_ELEMENTS = {"reference", "fullUrl", "url", "location"}  # values that point at a resource
AGE_EXTENSION = "http://deid-adapter.org/fhir/StructureDefinition/age-over-89"
DATA_ABSENT = "http://hl7.org/fhir/StructureDefinition/data-absent-reason"
TEXT_CONTENT_TYPES = ("text/", "application/json", "application/xml", "application/fhir+json", "application/fhir+xml")
UCUM = "http://unitsofmeasure.org"
NINETY_YEARS = {"value": 90, "unit": "a", "system": UCUM, "code": "a"}
YEARS_PER_UNIT = {"a": 1, "yr": 1, "year": 1, "years": 1, "mo": 1 / 12, "month": 1 / 12, "wk": 1 / 52.1775,
                  "d": 1 / 365.25, "day": 1 / 365.25}


@dataclass(slots=True)
class TextRef:
    """Texts to send through the text stack, and how to rebuild the element from the spans found in each.

    Most hold one text and no `build`: the element is that text with what was found replaced, and stays as
    written where nothing is found (the record engine rebuilds it: no closure, nor Site, is held per text)."""

    texts: list[str]
    build: Callable[[list[list[Span]]], Any] | None = None
    known_only: bool = False  # kept text (a term: one text, no build): searched for the record's known identifiers alone


def keeps_what_was_found(term: str, spans: list[Span]) -> bool:
    """Whether a term stays as written although `spans` were found in it: one word that is a word of a
    person's name ("White" beside a patient named White), the code's own word, which the engine marks as
    written by itself so that the guard lets it be. Any other term found is masked (and labelled MASKED)."""
    return _one_name_word(term, spans)


def remove(value, site: Site):
    if site.element.name == "value" and site.owner == "Identifier":
        site.record_identifier(value)
    site.label("REDACTED")
    return REMOVE


def keep(value, site: Site):
    return value


def year(value, site: Site):
    site.record_known(value, "DATE")
    if _reveals_age_over_89(value, site):
        return _mask_date(site)
    site.label("ABSTRED")
    if site.element.type == "instant":
        if not site.element.required:
            return REMOVE  # an instant cannot hold a year alone
        site.generated()
        return dates.year_floor_instant(value)
    site.generated()
    return dates.year_only(value)


def shift(value, site: Site):
    site.record_known(value, "DATE")
    if _reveals_age_over_89(value, site):
        return _mask_date(site)
    site.label("PSEUDED")
    site.generated()
    return dates.shift(value, site.day_offset())


def _reveals_age_over_89(value: str, site: Site) -> bool:
    """A date of a person aged 90 or more, in or before the year they turned 90: its year tells the age."""
    limit = site.age_limit_year()
    return limit is not None and int(dates.parse(value).group("y")) <= limit


def _mask_date(site: Site):
    """Remove a date, marked data-absent; one of a required choice is replaced by its Period or string
    type, since the R4B models (unlike R4 itself) do not count a primitive that holds only an extension."""
    site.label("AGGRED")
    if site.element.is_list:
        return REMOVE
    absent = {"extension": [{"url": DATA_ABSENT, "valueCode": "masked"}]}
    choice = site.element.required_choice
    if not choice:
        site.add_primitive_extensions(absent["extension"])
    elif f"{choice}Period" in elements(site.owner, site.fhir_version):
        site.parent[f"{choice}Period"] = {"_start": absent, "_end": absent}
    elif f"{choice}String" in elements(site.owner, site.fhir_version):
        site.parent[f"{choice}String"] = "masked"
        site.parent[f"_{choice}String"] = absent
    else:
        raise InputError(f"{site.path}: a required date that would tell an age over 89 has no other type to take")
    return REMOVE


def pseudonym(value, site: Site):
    name = site.element.name
    if name in REFERENCE_ELEMENTS:  # the commonest: references, fullUrls, request urls
        result = site.rewrite_reference(value)
    elif name == "value" and site.owner == "Identifier":
        site.record_identifier(value)
        if site.removes_identifier():
            return remove(value, site)
        result = site.pseudo.identifier(site.parent.get("system"), value)
    elif name == "id":
        site.record_original_ids(value, site.resource_type)
        result = site.pseudo.resource_id(value)
    elif name == "ifNoneExist":
        for ident in references.query_identifiers(value):
            site.record_known(ident, "UNIQUE_IDENTIFIER")
        result = references.rewrite_query(value, site.pseudo)
    else:  # an identifier kept as a plain string (Coverage.subscriberId, ...), namespaced by its path
        site.record_known(value, site.options.get("category", "UNIQUE_IDENTIFIER"))
        result = site.pseudo.token("value|" + site.fpath, value)
    if result is None:
        return remove(value, site)
    site.label("PSEUDED")
    site.generated()
    return result


def fpe(value, site: Site):
    """Format-preserving pseudonym (FF3-1) for identifier values; ids and references keep the keyed pseudonym."""
    if site.element.name == "value" and site.owner == "Identifier":
        site.record_identifier(value)
        if site.removes_identifier():
            return remove(value, site)
        if not selects(site.options, set(type_codes(site.parent))):
            return pseudonym(value, site)
        result = site.pseudo.identifier_fpe(site.parent.get("system"), value, fpe_format(site.options))
    elif site.element.name == "id" or site.element.name == "ifNoneExist" or site.element.name in REFERENCE_ELEMENTS:
        return pseudonym(value, site)
    else:  # an identifier kept as a plain string, namespaced by its path
        site.record_known(value, site.options.get("category", "UNIQUE_IDENTIFIER"))
        result = site.pseudo.format_preserving("value|" + site.fpath, value, fpe_format(site.options))
    site.label("PSEUDED")
    return result  # not marked generated: the leak guard reads FPE output, which has the shape of real identifiers


def zip3(value, site: Site):
    site.label("ABSTRED")
    result = zipcodes.zip3(value)
    if result is None:
        return REMOVE
    site.generated()
    return result


def age90(value, site: Site):
    """Ages over 89 become 90+: an Age of 90 or more becomes `>= 90 a`, a Range of ages reaching 90 becomes
    "90 and over" (low 90, no high); a birth date that reveals it is removed."""
    if isinstance(value, dict) and site.element.type == "Range":
        if any(_years(value.get(end)) >= 90 for end in ("low", "high")):
            site.label("AGGRED")
            return {**{k: v for k, v in value.items() if k not in ("low", "high")}, "low": dict(NINETY_YEARS)}
        return site.walk_into(value)
    if isinstance(value, dict):  # Age (a Quantity)
        if _years(value) >= 90:
            site.label("AGGRED")
            return {**{k: v for k, v in value.items() if k not in ("value", "comparator", "unit", "code")},
                    "value": 90, "comparator": ">=", "unit": "a", "system": UCUM, "code": "a"}
        return site.walk_into(value)
    site.record_known(value, "DATE")
    if dates.age_in_years(value, site.clock()) >= 90:
        site.label("AGGRED")
        site.add_primitive_extensions([
            {"url": AGE_EXTENSION, "valueString": "90+"},
            {"url": DATA_ABSENT, "valueCode": "masked"},
        ])
        return REMOVE
    return site.apply_type_rule(value)


def _years(quantity) -> float:
    """An age quantity in years; 0 when it is absent or in a unit that is not a time."""
    if not isinstance(quantity, dict) or not isinstance(quantity.get("value"), (int, float)):
        return 0
    per_unit = YEARS_PER_UNIT.get(quantity.get("code") or quantity.get("unit") or "a")
    return quantity["value"] * per_unit if per_unit is not None else 0


def text(value, site: Site):
    """Free text, XHTML narrative and base64 text attachments go through the text stack."""
    if site.element.type == "xhtml":
        try:
            narrative = Narrative.parse(value)
        except InputError as e:
            raise InputError(f"{site.path}: {e}") from None
        if narrative.dropped:
            site.label("REDACTED")
        return TextRef(narrative.texts, narrative.render)
    if site.element.type == "base64Binary":
        return _attachment_text(value, site)
    by_target = site.options.get("by_target")
    if by_target:  # Reference.display: the rule of what the reference points to, where all it may point to agree
        targets = site.reference_targets()
        if targets and PERSON_TYPES.issuperset(targets):
            # "Dr. Ronny Block" on a reference to a Practitioner
            site.record_known(value, "NAME", staff=STAFF_TYPES.issuperset(targets))
        rule_key = _rule_of_all(by_target, targets)
        if rule_key is not None:
            return site.apply_rule_of(rule_key, value)
    return TextRef([value])


def _rule_of_all(by_target: Mapping, targets: tuple[str, ...]) -> str | None:
    """The rule `by_target` gives every one of `targets` (its own, else "*"), if they all have the same one."""
    found = None
    for target in targets:
        key = by_target.get(target) or by_target.get("*")
        if key is None or (found is not None and key != found):
            return None
        found = key
    return found


def term(value, site: Site):
    """Coded text and facility names: kept, except the record's known identifiers, which are masked (a
    display a clinician typed a patient's name into). A CodeableConcept.text that is none of its codings'
    displays (in case and spacing) is free text: through the text stack."""
    if site.owner == "CodeableConcept" and site.element.name == "text" and not _is_a_display(value, site):
        return TextRef([value])
    return TextRef([value], known_only=True)  # rebuilt as keeps_what_was_found says


def _is_a_display(value: str, site: Site) -> bool:
    """Whether a CodeableConcept.text is one of its codings' displays, which the rules keep as terms too."""
    if site.method_of("Coding.display") not in ("term", "keep"):
        return False
    codings = site.parent.get("coding")
    displays = [c.get("display") for c in (codings if type(codings) is list else ()) if type(c) is dict]
    if value in displays:  # the commonest case, written alike: nothing to fold
        return True
    folded = _folded(value)
    if any(type(d) is str and _folded(d) == folded for d in displays):
        return True
    # a shortening of a display ("Shoshone" for "Paiute-Shoshone Tribe of the Fallon Reservation"): every word of
    # the text is a word of one display, so it says nothing the code does not
    words = set(WORD.findall(folded))
    return bool(words) and any(type(d) is str and words <= set(WORD.findall(_folded(d))) for d in displays)


WORD = re.compile(r"[^\W_]+")


def _folded(text: str) -> str:
    return " ".join(text.split()).casefold()


def _one_name_word(value: str, spans: list[Span]) -> bool:
    """A term of one word that is a word of a person's name: "White", "King" (never a whole name of two words)."""
    return len(value.split()) == 1 and all(s.category == "NAME" for s in spans)


def _attachment_text(value, site: Site):
    content_type = (site.parent.get("contentType") or "").lower()
    if not content_type.startswith(TEXT_CONTENT_TYPES):
        return remove(value, site)  # images, PDFs, ...: cannot be checked, so never passed through
    charset = "utf-8"
    if "charset=" in content_type:
        charset = content_type.split("charset=", 1)[1].split(";")[0].strip() or "utf-8"
    try:
        decoded = base64.b64decode(value, validate=True).decode(charset)
    except (ValueError, LookupError):
        raise InputError(f"{site.path}: attachment is not valid base64 text in its charset") from None
    try:
        pieces = rendered.content_pieces(content_type, decoded)
    except InputError as e:
        raise InputError(f"{site.path}: attachment {e}") from None
    read = rendered.readings(pieces)
    parent = site.parent
    size_as_text = elements("Attachment", site.fhir_version)["size"].type == "integer64"  # R5: a JSON string

    def build(found: list[list[Span]]) -> str:
        raw = rendered.apply(decoded, rendered.edits(pieces, read, found).get(0, [])).encode(charset)
        parent["size"] = str(len(raw)) if size_as_text else len(raw)
        parent["hash"] = base64.b64encode(hashlib.sha1(raw).digest()).decode()
        return base64.b64encode(raw).decode()

    return TextRef([text for text, _ in read], build)


def substitute(value, site: Site):
    """A fixed value (REDACTED), or a keyed surrogate of the rule's kind (PSEUDED). In an object (a HumanName,
    a ContactPoint, ...) its texts are substituted, its codes (use, system, type, state, country) kept, and
    everything else (period, assigner, extensions, ...) removed."""
    options = site.options
    _record_original(value, site)
    if "value" in options:
        fixed = options["value"]
        if isinstance(fixed, dict) != isinstance(value, dict) or isinstance(fixed, list):
            raise InputError(f"{site.path}: substitute's value does not fit the element (type {site.element.type})")
        site.label("REDACTED")
        if not isinstance(fixed, dict):
            site.generated()
        return copied(fixed)
    site.label("PSEUDED")
    if isinstance(value, str):
        site.generated()
        return values.surrogate(site.pseudo, options["kind"], value)
    if not isinstance(value, dict):
        raise InputError(f"{site.path}: substitute with kind applies to texts and objects, not {site.element.type}")
    out = {}
    for key, item in value.items():
        if key in SUBSTITUTE_KEEPS:
            out[key] = item
        elif isinstance(item, str):
            out[key] = values.surrogate(site.pseudo, _kind_of(key, options["kind"], value), item)
        elif isinstance(item, list) and all(isinstance(v, str) for v in item):
            out[key] = [values.surrogate(site.pseudo, _kind_of(key, options["kind"], value), v) for v in item]
    return out


SUBSTITUTE_KEEPS = {"use", "system", "type", "rank", "state", "country", "resourceType"}
CONTACT_KINDS = {"phone": "phone", "fax": "phone", "sms": "phone", "pager": "phone", "email": "email", "url": "url"}


def _kind_of(key: str, kind: str, value: dict) -> str:
    """A name's given and family parts get first and last names; a ContactPoint's value the kind its system says."""
    if kind == "name" and key in ("given", "family"):
        return key
    if key == "value" and value.get("system") in CONTACT_KINDS:
        return CONTACT_KINDS[value["system"]]
    return kind


def _record_original(value, site: Site) -> None:
    """The texts a substitute or encrypt rule replaces are known identifiers of the record (`category`, else by kind)."""
    category = site.options.get("category") or values.KIND_CATEGORY.get(site.options.get("kind", ""))
    if site.element.name == "value" and site.owner == "Identifier":
        category = category or identifier_category(site.parent)
    if not category:
        return
    texts = [value] if isinstance(value, str) else [
        v for k, v in (value.items() if isinstance(value, dict) else ()) if isinstance(v, str) and k not in SUBSTITUTE_KEEPS]
    for text in texts:
        site.record_known(text, category)


def copied(value):
    """A fixed value of the rules, copied: each output holds its own."""
    return {k: copied(v) for k, v in value.items()} if isinstance(value, dict) else (
        [copied(v) for v in value] if isinstance(value, list) else value)


def perturb(value, site: Site):
    """Keyed noise on a number, or on the value of a Quantity; an age (Age, or a Quantity in years of an age
    element) of 90 or more, before or after the noise, becomes 90+ as with `age90`."""
    namespace = f"{site.fpath}|{site.scope_key()}"
    if isinstance(value, dict):
        number = value.get("value")
        if not isinstance(number, (int, float)) or isinstance(number, bool):
            return site.walk_into(value)
        is_age = site.element.type == "Age" or site.element.name.startswith("age")
        if is_age and _years(value) >= 90:
            return age90(value, site)
        noisy = values.perturb(site.pseudo, namespace, number, site.options)
        result = {**value, "value": noisy}
        if is_age and _years(result) >= 90:
            return age90(result, site)
        site.label("ABSTRED")
        return result
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        site.label("ABSTRED")
        noisy = values.perturb(site.pseudo, namespace, value, site.options)
        return max(noisy, 0) if site.element.type in ("unsignedInt", "positiveInt") else noisy
    raise InputError(f"{site.path}: perturb applies to numbers and quantities, not {site.element.type}")


def generalize(value, site: Site):
    """The first matching case's value (for a Quantity: matched on its value, which the case's number
    replaces); a value no case matches is kept or removed (`otherwise`, default remove)."""
    subject = value.get("value") if isinstance(value, dict) else value
    found = values.generalize(subject, site.options["cases"])
    if found is values.NO_MATCH:
        if site.options.get("otherwise", "remove") == "keep":
            return site.walk_into(value) if isinstance(value, dict) else value
        return remove(value, site)
    site.label("ABSTRED")
    if isinstance(value, dict) and not isinstance(found, dict):
        if not isinstance(found, (int, float)) or isinstance(found, bool):
            raise InputError(f"{site.path}: generalize gives a Quantity's value a number, not text")
        return {**value, "value": found}
    if isinstance(found, dict) != isinstance(value, dict) or isinstance(found, list) or (
            isinstance(found, str) != isinstance(value, str)):
        raise InputError(f"{site.path}: generalize's value does not fit the element (type {site.element.type})")
    if isinstance(found, str):
        site.generated()
    return copied(found)


def encrypt(value, site: Site):
    """Reversible encryption under the vault key (fhir_transforms/encryption.py): AES-SIV, or FF3-1 where the
    shape must hold (a value too short for FF3-1 is removed, never kept)."""
    if not isinstance(value, str):
        raise InputError(f"{site.path}: encrypt applies to texts and identifiers, not {site.element.type}")
    cipher = site.pseudo.cipher
    if cipher is None:
        raise InputError(f"{site.path}: the encrypt rule needs the vault key (--vault-key-file)")
    _record_original(value, site)
    if site.element.name == "value" and site.owner == "Identifier" and site.removes_identifier():
        return remove(value, site)
    if site.options.get("format", "aes-siv") == "fpe":
        try:
            result = cipher.encrypt(value, fpe_format({k: v for k, v in site.options.items()
                                                       if k in ("alphabet", "keep_prefix", "check_digit")}))
        except FpeFallback:
            return remove(value, site)
        site.label("MASKED")
        return result  # not marked generated: it has the shape of a real value, and the leak guard reads it
    site.label("MASKED")
    site.generated()
    return cipher.encrypt(value)


BY_VALUE, BY_PATIENT, BY_REFERENCE = "value", "patient", "reference"


def reused_by(method: Callable, owner: str, element: Element, options: Mapping, rules: Mapping) -> str | None:
    """What alone decides `method`'s outcome on this element under a rule with these `options` (the result, the
    labels it gives, the known identifiers it records, whether the engine wrote the value), or None:
    BY_VALUE, the value anywhere in a record (a reference is rewritten by the one pseudonym function, a coding's
    display is looked up as a term); BY_PATIENT, the value and whose resource holds it (a date keeps its year,
    or moves by its patient's offset, unless it tells that patient's age over 89: then it is masked, which also
    writes beside it, and such an outcome is never reused); BY_REFERENCE, at one element path, the value and the
    Reference that holds it (a Reference.display takes the rule of what the reference and its type point at,
    where each rule it may take is `remove`, `keep`, `term` or `text` without settings). Only a date's outcome
    writes anything beside the element. The walker applies the method once per distinct value (per patient;
    per reference) in a record and reuses its outcome."""
    if options:
        by_target = options.get("by_target")
        if method is text and len(options) == 1 and by_target and all(
                _plain(rules.get(key)) for key in by_target.values()):
            return BY_REFERENCE
        return None
    if method is pseudonym:
        return BY_VALUE if element.name in REFERENCE_ELEMENTS else None
    if method is term:
        return BY_VALUE if owner != "CodeableConcept" else None  # a CodeableConcept.text is compared with its codings
    if method is shift or method is year and element.type != "instant":  # (an instant's year: is it required?)
        return BY_PATIENT
    return None


def _plain(rule) -> bool:
    """A rule whose outcome on a display is decided by the display alone."""
    return (rule is not None and rule.method in ("remove", "keep", "term", "text") and not rule.options
            and rule.test is None and not rule.trusted)


# Every method of the contract (fhir_transforms/methods.py), by name.
METHODS: dict[str, Callable] = {
    "remove": remove, "keep": keep, "year": year, "shift": shift, "pseudonym": pseudonym,
    "zip3": zip3, "age90": age90, "text": text, "fpe": fpe, "term": term,
    "substitute": substitute, "perturb": perturb, "generalize": generalize, "encrypt": encrypt,
}
check_implemented("FHIR R4", METHODS)
