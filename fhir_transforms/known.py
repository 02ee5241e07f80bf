"""Collect the known identifiers of a record: every identifying value its structured fields hold."""
from __future__ import annotations

import re
from typing import Iterable

from text_deid.spans import KnownIdentifier

PEOPLE = {"Patient", "RelatedPerson", "Person", "Practitioner"}
PERSON_REFERENCE_RE = re.compile(r"^(?:[^?]*/)?(Patient|RelatedPerson|Person|Practitioner|PractitionerRole)[/?]")
FULL_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}")
TELECOM_CATEGORY = {"phone": "PHONE_NUMBER", "sms": "PHONE_NUMBER", "pager": "PHONE_NUMBER",
                    "fax": "FAX_NUMBER", "email": "EMAIL_ADDRESS", "url": "URL"}
IDENTIFIER_CATEGORY = {"SS": "SOCIAL_SECURITY_NUMBER", "MR": "MEDICAL_RECORD_NUMBER", "MB": "HEALTH_PLAN_BENEFICIARY_NUMBER",
                       "SN": "HEALTH_PLAN_BENEFICIARY_NUMBER", "AN": "ACCOUNT_NUMBER", "DL": "CERTIFICATE_LICENSE_NUMBER",
                       "PPN": "CERTIFICATE_LICENSE_NUMBER"}
NAME_EXTENSIONS = {"http://hl7.org/fhir/StructureDefinition/patient-mothersMaidenName"}


def identifier_category(identifier: dict) -> str:
    if identifier.get("system") == "http://hl7.org/fhir/sid/us-ssn":
        return "SOCIAL_SECURITY_NUMBER"
    for coding in (identifier.get("type") or {}).get("coding", []) or []:
        if coding.get("code") in IDENTIFIER_CATEGORY:
            return IDENTIFIER_CATEGORY[coding["code"]]
    return "UNIQUE_IDENTIFIER"


def _person(res: dict) -> Iterable[KnownIdentifier]:
    for name in res.get("name", []) or []:
        parts = (name.get("given") or []) + ([name["family"]] if name.get("family") else [])
        if parts:
            yield KnownIdentifier(" ".join(parts), "NAME")
        if name.get("text"):
            yield KnownIdentifier(name["text"], "NAME")
    for contact in [res] + list(res.get("contact", []) or []):
        if contact is not res and contact.get("name"):
            yield from _person({"name": [contact["name"]]})
        for t in contact.get("telecom", []) or []:
            if t.get("value"):
                yield KnownIdentifier(t["value"], TELECOM_CATEGORY.get(t.get("system"), "PHONE_NUMBER"))
        addresses = contact.get("address") or []
        for a in addresses if isinstance(addresses, list) else [addresses]:
            for v in (a.get("line") or []) + [a.get("city"), a.get("district"), a.get("text"), a.get("postalCode")]:
                if v:
                    yield KnownIdentifier(v, "GEOGRAPHIC_LOCATION")
    if res.get("id"):
        yield KnownIdentifier(res["id"], "UNIQUE_IDENTIFIER")
    for ext in res.get("extension", []) or []:
        if ext.get("url") in NAME_EXTENSIONS and ext.get("valueString"):
            yield KnownIdentifier(ext["valueString"], "NAME")


def collect(resources: Iterable[dict]) -> set[KnownIdentifier]:
    """Known identifiers of the people in the record (names, telecom, addresses, ids, birth dates).

    Identifier values, dates and person reference displays elsewhere are recorded by the rule methods
    as they transform them (fhir_transforms/methods.py), so one walk serves both.
    """
    found: set[KnownIdentifier] = set()
    for res in resources:
        if res.get("resourceType") in PEOPLE:
            found.update(_person(res))
    return found
