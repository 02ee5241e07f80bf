"""Which FHIR version a record is written in (R4 or R5), told by what the record itself says.

A record names its version in three ways, read in this order of trust, none of them required:
- `fhirVersion` (CapabilityStatement, StructureDefinition, ImplementationGuide, ...): 4.0.x and 4.3.x (R4B,
  whose models read R4 here) are R4, 5.0.x is R5;
- a `meta.profile` of a core resource with a version, as `http://hl7.org/fhir/StructureDefinition/Patient|5.0.0`
  or `http://hl7.org/fhir/R5/StructureDefinition/Patient` (an extension's versioned url, used across
  versions, is not a marker);
- a resource type only one of the two versions has (Transport and ActorDefinition are R5 only; Media and
  MedicinalProduct R4 only). Elements are never guessed from: an R5 element in a record read as R4 fails
  validation, and the message says that the record reads as R5.
Markers that disagree make the record ambiguous: it is refused unless the version is given (`--fhir-version`).
No marker: R4, as before there was R5 input.
"""
from __future__ import annotations

import re
from typing import Iterable

from fhir_transforms.errors import InputError
from fhir_transforms.r4.schema import FHIR_VERSIONS, elements, is_resource_type
from fhir_transforms.r4.shapes import R4_ONLY

AUTO = "auto"
DEFAULT = "r4"
VERSION_NUMBER_RE = re.compile(r"^(\d+)\.(\d+)")
NUMBERED = {(3, 0): "stu3", (4, 0): "r4", (4, 3): "r4", (5, 0): "r5"}  # FHIR release numbers → the models that read them
CORE_PROFILE_RE = re.compile(r"^http://hl7\.org/fhir/(?:(?P<release>STU3|R4B?|R5|3\.0|4\.0|4\.3|5\.0)/)?"
                             r"StructureDefinition/(?P<type>[A-Za-z]+)(?:\|(?P<number>[0-9.]+))?$")
RELEASES = {"STU3": "stu3", "3.0": "stu3", "R4": "r4", "R4B": "r4", "4.0": "r4", "4.3": "r4", "R5": "r5", "5.0": "r5"}
# Versions whose own elements mark a record: STU3's elements that R4 and R5 renamed or dropped (Condition.assertedDate,
# Claim.organization) are how most STU3 senders, who name no version, can be told apart; R4 and R5 are told by types.
ELEMENT_MARKED = ("stu3",)


def of_number(number: str) -> str | None:
    """stu3, r4 or r5 for a FHIR version number (3.0.2, 4.0.1, 4.3.0, 5.0.0, 5.0), else None."""
    m = VERSION_NUMBER_RE.match(number.strip()) if isinstance(number, str) else None
    return NUMBERED.get((int(m.group(1)), int(m.group(2)))) if m else None


def markers(resources: Iterable[dict]) -> dict[str, set[str]]:
    """Version (r4, r5) → what in the record says so (`fhirVersion 5.0.0`, `meta.profile`, `resourceType Transport`)."""
    found: dict[str, set[str]] = {}
    for res in resources:
        rtype = res.get("resourceType")
        numbers = res.get("fhirVersion")
        for number in numbers if isinstance(numbers, list) else [numbers]:
            if (version := of_number(number)) is not None:
                found.setdefault(version, set()).add(f"fhirVersion {number}")
        meta = res.get("meta")
        profiles = meta.get("profile") if isinstance(meta, dict) else None
        for url in profiles if isinstance(profiles, list) else []:
            if (version := _profile_version(url, rtype)) is not None:
                found.setdefault(version, set()).add("meta.profile")
        if isinstance(rtype, str) and (version := _only_in(rtype)) is not None:
            found.setdefault(version, set()).add(f"resourceType {rtype}")
        for version in ELEMENT_MARKED:
            if isinstance(rtype, str) and (key := _own_element(res, rtype, version)):
                found.setdefault(version, set()).add(f"{rtype}.{key}")
    return found


def detect(resources: Iterable[dict], path: str) -> str:
    """The version the record's markers name; R4 without any; InputError if they disagree."""
    found = markers(resources)
    if "stu3" in found and "r4" in found:  # a type R4 has and R5 dropped (Media) is STU3's too: no disagreement
        found["r4"] = {m for m in found["r4"] if not (m.startswith("resourceType ") and is_resource_type(m[13:], "stu3"))}
        if not found["r4"]:
            del found["r4"]
    if len(found) > 1:
        said = "; ".join(f"{v.upper()}: {', '.join(sorted(found[v]))}" for v in sorted(found))
        raise InputError(f"{path}: the record names more than one FHIR version ({said}); "
                         f"give the version it is written in (--fhir-version {' or '.join(FHIR_VERSIONS)})")
    return next(iter(found), DEFAULT)


def check(version: str) -> str:
    """A version setting (r4, r5 or auto) as given, or ValueError naming the choices."""
    if version not in (*FHIR_VERSIONS, AUTO):
        raise ValueError(f"unknown FHIR version {str(version)[:16]!r} (known: {', '.join(FHIR_VERSIONS)}, {AUTO})")
    return version


def _profile_version(url, rtype) -> str | None:
    m = CORE_PROFILE_RE.match(url) if isinstance(url, str) else None
    if m is None or m.group("type") != rtype:  # another type's profile (an extension's, a datatype's) says nothing
        return None
    if m.group("number"):
        return of_number(m.group("number"))
    return RELEASES.get(m.group("release") or "")


def _only_in(rtype: str) -> str | None:
    """The version a resource type marks: R4 or R5 where only one of them has it (as before STU3 was read), STU3
    where neither does and STU3 has it."""
    in_r4, in_r5 = is_resource_type(rtype, "r4") or rtype in R4_ONLY, is_resource_type(rtype, "r5")
    if in_r4 != in_r5:
        return "r5" if in_r5 else "r4"
    return "stu3" if not in_r4 and is_resource_type(rtype, "stu3") else None


def _own_element(res: dict, rtype: str, version: str) -> str | None:
    """A top-level element of `res` that only `version`'s resource type has, if any."""
    if not is_resource_type(rtype, version):
        return None
    own = elements(rtype, version)
    others = [elements(rtype, v) for v in FHIR_VERSIONS if v != version and is_resource_type(rtype, v)]
    return next((k for k in res if k in own and not any(k in o for o in others)), None)


def resources_of(doc) -> Iterable[dict]:
    """A record's resources wherever they sit (its contained resources, a Bundle's entries and their responses'
    outcomes, a Parameters' parameters and their parts, at any depth), each before those it holds: as markers
    and known identifiers are read from them, before validation, so any JSON value may be anywhere."""
    if not isinstance(doc, dict):
        return
    yield doc
    for c in _items(doc.get("contained")):
        yield from resources_of(c)
    rtype = doc.get("resourceType")
    if rtype == "Bundle":
        for entry in _items(doc.get("entry")):
            if isinstance(entry, dict):
                yield from resources_of(entry.get("resource"))
                response = entry.get("response")
                if isinstance(response, dict):
                    yield from resources_of(response.get("outcome"))
        yield from resources_of(doc.get("issues"))  # R5
    elif rtype == "Parameters":
        yield from _parameters_resources(doc.get("parameter"))


def _parameters_resources(parameters) -> Iterable[dict]:
    for parameter in _items(parameters):
        if isinstance(parameter, dict):
            yield from resources_of(parameter.get("resource"))
            yield from _parameters_resources(parameter.get("part"))


def _items(value) -> list:
    return value if isinstance(value, list) else []
