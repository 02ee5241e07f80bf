"""A site rules file's FHIR part: every rule path checked against the R4B models, then merged onto the
packaged profile it extends (fhir_transforms/site_rules.py reads and checks the file itself)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from fhir.resources.R4B import get_fhir_model_class

from fhir_transforms.r4.schema import PRIMITIVES, elements, is_resource_type
from fhir_transforms.r4.shapes import R4_ONLY
from fhir_transforms.rules import MAPPINGS, Profile, ProfileError, load_profile, profile_from_doc, read_profile_file
from fhir_transforms.site_rules import RulesFileError, SiteRules, merge

PRIMITIVE_NAMES = frozenset(PRIMITIVES.values()) | {"boolean"}


@dataclass(frozen=True)
class ElementAt:
    """Where a FHIR path leads: what the walker looks rules up by (Profile.lookup)."""

    path: str
    owner: str  # the type holding the last element (a resource, datatype or backbone element class)
    owner_is_resource: bool
    element: str
    type: str


def _is_type(name: str) -> bool:
    if name in PRIMITIVE_NAMES or name in R4_ONLY:
        return True
    try:
        get_fhir_model_class(name)
    except (KeyError, ValueError):
        return False
    return True


def element_at(path: str) -> ElementAt | str:
    """The element a rule path names (`Patient.telecom`, `Address.city`, `HumanName`), or why it names none."""
    parts = path.split(".")
    if not _is_type(parts[0]):
        return f"{parts[0]!r} is no FHIR R4 resource, datatype or primitive type"
    if len(parts) == 1:
        return ElementAt(path, "", False, "", parts[0])
    owner, is_resource = parts[0], parts[0] in ("Resource", "DomainResource") or is_resource_type(parts[0])
    found = None
    for i, name in enumerate(parts[1:], 1):
        if owner in R4_ONLY:  # no model to check against: the walker reads these by shape
            return ElementAt(path, owner, True, parts[-1], "")
        if owner in PRIMITIVE_NAMES:
            return f"{'.'.join(parts[:i])} is a primitive {owner}: it has no element {name!r}"
        found = next((e for e in elements(owner).values() if e.name == name and e.type != "Element"), None)
        if found is None:
            return f"{owner} has no element {name!r}"
        if i < len(parts) - 1:
            owner, is_resource = found.type, False
    return ElementAt(path, owner, is_resource, found.name, found.type)


def site_profile(site: SiteRules) -> Profile:
    """The packaged profile the file extends, with the file's FHIR rules merged in and its hash."""
    part = site.section("fhir")
    problems = [f"{site.at('fhir', 'rules', key)}: fhir.rules.{key}: {found}"
                for key in (part.get("rules") or {}) if isinstance(found := element_at(key), str)]
    if problems:
        raise RulesFileError("\n".join(problems))
    doc = merge(read_profile_file(MAPPINGS, site.extends), part, ("rules",))
    site_keys = set(part.get("rules") or {})

    def where(*keys: str) -> str:
        if keys[0] == "rules" and keys[-1] in site_keys:
            return f"{site.at('fhir', 'rules', keys[-1])}: fhir.rules.{keys[-1]}"
        return f"{site.extends}: {keys[-1]}"
    try:
        profile = profile_from_doc(doc, where, site.sha256)
    except RulesFileError:
        raise
    except ProfileError as e:
        raise RulesFileError(str(e)) from None
    packaged = load_profile(site.extends).rules
    for key in site_keys:
        rule = profile.rules.get(key)
        if rule is None:
            continue
        if rule.method == "keep":  # the site decided to release these values: the leak guard must not refuse them
            rule = profile.rules[key] = replace(rule, trusted=True)
        if rule.test is not None and key in packaged:  # where its condition is false, the packaged rule comes next
            profile.rules[key] = replace(rule, beneath=packaged[key])
    return profile
