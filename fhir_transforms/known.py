"""Collect the known identifiers of a record: every identifying value its structured fields hold."""
from __future__ import annotations

import re
from typing import Iterable

from text_deid.spans import KnownIdentifier, Span

PEOPLE = {"Patient", "RelatedPerson", "Person", "Practitioner"}
PERSON_TYPES = PEOPLE | {"PractitionerRole"}  # what a Reference.display names a person for
FULL_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}")
TELECOM_CATEGORY = {"phone": "PHONE_NUMBER", "sms": "PHONE_NUMBER", "pager": "PHONE_NUMBER",
                    "fax": "FAX_NUMBER", "email": "EMAIL_ADDRESS", "url": "URL"}
IDENTIFIER_CATEGORY = {"SS": "SOCIAL_SECURITY_NUMBER", "MR": "MEDICAL_RECORD_NUMBER", "MB": "HEALTH_PLAN_BENEFICIARY_NUMBER",
                       "SN": "HEALTH_PLAN_BENEFICIARY_NUMBER", "AN": "ACCOUNT_NUMBER", "DL": "CERTIFICATE_LICENSE_NUMBER",
                       "PPN": "CERTIFICATE_LICENSE_NUMBER"}
NAME_EXTENSIONS = {"http://hl7.org/fhir/StructureDefinition/patient-mothersMaidenName"}


WORD_CATEGORIES = frozenset({"NAME", "GEOGRAPHIC_LOCATION", "DATE"})  # values that may be words or dates of anything


def is_identifier_shaped(known: KnownIdentifier) -> bool:
    """An MRN, SSN, phone number or id rather than a word: what no coincidence of words explains where a rule
    kept a value by design (a surname that is also a race's display is a word; a code equal to an MRN is not)."""
    return known.category not in WORD_CATEGORIES and any(c.isdigit() for c in known.value)


# resources that are things, not people: their identifiers may be their names (known identifiers elsewhere)
THING_TYPES = frozenset({"Organization", "Location", "Device", "DeviceDefinition", "HealthcareService", "Endpoint"})
# Resources of a record's staff and organizations: Safe Harbor's identifiers are the patient's and those of their
# relatives, household and employers, so a word of a name only these hold is not masked in coded terms
STAFF_TYPES = frozenset({"Practitioner", "PractitionerRole"}) | THING_TYPES


def thing_names(resources: Iterable[dict]) -> tuple[str, ...]:
    """The names of a record's organizations, locations and devices (casefolded): Organization and Location
    names and aliases, device names, service and endpoint names."""
    found: set[str] = set()
    for res in resources:
        if not is_one_of(res.get("resourceType"), THING_TYPES):
            continue
        found.update(_strings(res.get("name"), res.get("alias")))
        for named in _dicts(res.get("deviceName")):
            found.update(_strings(named.get("name")))
    return tuple(sorted(n.casefold() for n in found))


def names_a_thing(value, names: tuple[str, ...]) -> bool:
    """Whether `value` is one of `names`, or words of one (`EpicCare` of "EpicCare Ambulatory")."""
    if not isinstance(value, str) or not value.strip() or not names:
        return False
    pattern = re.compile(r"(?<!\w)" + re.escape(value.strip().casefold()) + r"(?!\w)")
    return any(pattern.search(name) for name in names)


def identifier_category(identifier: dict) -> str:
    if identifier.get("system") == "http://hl7.org/fhir/sid/us-ssn":
        return "SOCIAL_SECURITY_NUMBER"
    for code in type_codes(identifier):
        if code in IDENTIFIER_CATEGORY:
            return IDENTIFIER_CATEGORY[code]
    return "UNIQUE_IDENTIFIER"


def is_one_of(value, names: frozenset[str] | set[str] | dict) -> bool:
    """Whether a JSON value is one of `names`: before validation any value (a list, an object) may stand where
    a code or url belongs, and only a string is one."""
    return type(value) is str and value in names


def type_codes(identifier: dict) -> list[str]:
    """The codes of an Identifier's type, in order; without validation any JSON value may stand anywhere, and
    what is not a list of codings with string codes gives none."""
    concept = identifier.get("type")
    codings = concept.get("coding") if isinstance(concept, dict) else None
    if not isinstance(codings, list):
        return []
    return [c["code"] for c in codings if isinstance(c, dict) and isinstance(c.get("code"), str)]


def _dicts(value) -> list[dict]:
    """The objects in a list (or a single object); anything else yields nothing (unvalidated input)."""
    items = value if isinstance(value, list) else [value]
    return [v for v in items if isinstance(v, dict)]


def _strings(*values) -> list[str]:
    out = []
    for v in values:
        out.extend(x for x in (v if isinstance(v, list) else [v]) if isinstance(x, str) and x)
    return out


def name_words(value: str) -> str:
    """A name as a known identifier: its words that hold a letter. A number typed into a name (a house number,
    a bed) is no name token: as one it would mask or refuse that number in every range, dose and count."""
    return " ".join(w for w in value.split() if any(map(str.isalpha, w)))


def _person(res: dict) -> Iterable[KnownIdentifier]:
    for name in _dicts(res.get("name")):
        parts = [p for p in map(name_words, _strings(name.get("given"), name.get("family"))) if p]
        if parts:
            yield KnownIdentifier(" ".join(parts), "NAME")
        for part in parts if len(parts) > 1 else ():  # each a name in its own right, whatever word it spells
            yield KnownIdentifier(part, "NAME")        # (titles have their own elements: prefix, suffix)
        for text in filter(None, map(name_words, _strings(name.get("text")))):
            yield KnownIdentifier(text, "NAME")
    for contact in [res] + _dicts(res.get("contact")):
        if contact is not res:
            yield from _person({"name": contact.get("name")})
        for t in _dicts(contact.get("telecom")):
            system = t.get("system")
            category = TELECOM_CATEGORY[system] if is_one_of(system, TELECOM_CATEGORY) else "PHONE_NUMBER"
            for value in _strings(t.get("value")):
                yield KnownIdentifier(value, category)
        for a in _dicts(contact.get("address")):
            for v in _strings(a.get("line"), a.get("city"), a.get("district"), a.get("text"), a.get("postalCode")):
                yield KnownIdentifier(v, "GEOGRAPHIC_LOCATION")
    for rid in _strings(res.get("id")):
        yield KnownIdentifier(rid, "UNIQUE_IDENTIFIER")
    for ext in _dicts(res.get("extension")):
        if is_one_of(ext.get("url"), NAME_EXTENSIONS):
            for v in _strings(ext.get("valueString")):
                yield KnownIdentifier(v, "NAME")


def collect(resources: Iterable[dict]) -> set[KnownIdentifier]:
    """Known identifiers of the people in the record (names, telecom, addresses, ids, birth dates).

    Identifier values, dates and person reference displays elsewhere are recorded by the rule methods
    as they transform them (fhir_transforms/r4/methods.py), so one walk serves both.
    """
    found: set[KnownIdentifier] = set()
    for res in resources:
        if is_one_of(res.get("resourceType"), PEOPLE):
            found.update(_person(res))
    return found


def collect_staff(resources: Iterable[dict]) -> tuple[set[KnownIdentifier], set[KnownIdentifier]]:
    """(the staff's, the patient's and their people's) names among the known identifiers `collect` finds."""
    staff: set[KnownIdentifier] = set()
    personal: set[KnownIdentifier] = set()
    for res in resources:
        kind = res.get("resourceType")
        if is_one_of(kind, PEOPLE):
            (staff if kind in STAFF_TYPES else personal).update(k for k in _person(res) if k.category == "NAME")
    return staff, personal


def words_of_names(known: Iterable[KnownIdentifier]) -> frozenset[str]:
    """The casefolded words of the names among `known`."""
    return frozenset(w.casefold() for k in known if k.category == "NAME" for w in k.value.replace(",", " ").split())


def without_staff_words(term: str, spans: list[Span], personal_words: frozenset[str]) -> list[Span]:
    """A coded term's spans less the single words that no name of the patient or their people holds ("test" in
    "Reason for lab test" beside a provider named TEST): Safe Harbor's identifiers are the individual's and their
    relatives', household's and employers'. A staff member's whole name stays masked, as does a term that is the
    word alone (it names the person)."""
    whole = term.strip()
    return [s for s in spans if not (s.category == "NAME" and len(covered := term[s.start:s.end].split()) == 1
                                     and covered[0] != whole and covered[0].casefold() not in personal_words)]
