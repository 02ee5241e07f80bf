"""A site rules file's FHIR part: every rule path checked against the models' element tables (R4B for `rules`,
R5 for `fhir_versions.r5.rules`), then merged onto the packaged profile it extends (fhir_transforms/site_rules.py
reads and checks the file itself)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from fhir_transforms.r4.schema import PRIMITIVES, elements, is_resource_type
from fhir_transforms.r4.shapes import R4_ONLY
from fhir_transforms.rules import MAPPINGS, Profile, load_profile, profile_from_doc, read_profile_file, with_safe_harbor_gaps
from fhir_transforms.site_rules import RulesFileError, SiteRules, as_rules_error, merge

PRIMITIVE_NAMES = frozenset(PRIMITIVES.values()) | {"boolean"}


@dataclass(frozen=True)
class ElementAt:
    """Where a FHIR path leads: what the walker looks rules up by (Profile.lookup)."""

    path: str
    owner: str  # the type holding the last element (a resource, datatype or backbone element class)
    owner_is_resource: bool
    element: str
    type: str


def _is_type(name: str, version: str) -> bool:
    if name in PRIMITIVE_NAMES or (version == "r4" and name in R4_ONLY):
        return True
    try:
        elements(name, version)
    except ValueError:
        return False
    return True


def element_at(path: str, version: str = "r4") -> ElementAt | str:
    """The element a rule path names (`Patient.telecom`, `Address.city`, `HumanName`) in a FHIR version's models
    (the R4B tables for r4), or why it names none."""
    parts = path.split(".")
    if not _is_type(parts[0], version):
        return f"{parts[0]!r} is no FHIR {version.upper()} resource, datatype or primitive type"
    if len(parts) == 1:
        return ElementAt(path, "", False, "", parts[0])
    owner = parts[0]
    is_resource = owner in ("Resource", "DomainResource") or is_resource_type(owner, version)
    found = None
    for i, name in enumerate(parts[1:], 1):
        if version == "r4" and owner in R4_ONLY:  # no model to check against: the walker reads these by shape
            return ElementAt(path, owner, True, parts[-1], "")
        if owner in PRIMITIVE_NAMES:
            return f"{'.'.join(parts[:i])} is a primitive {owner}: it has no element {name!r}"
        found = next((e for e in elements(owner, version).values() if e.name == name and e.type != "Element"), None)
        if found is None:
            return f"{owner} has no element {name!r}"
        if i < len(parts) - 1:
            owner, is_resource = found.type, False
    return ElementAt(path, owner, is_resource, found.name, found.type)


def site_profile(site: SiteRules) -> Profile:
    """The packaged profile the file extends, with the file's FHIR part merged in (rules, identifiers, marking,
    entries, fhir_versions) and its hash."""
    part = site.section("fhir")
    tables = [(("rules",), "r4", part.get("rules") or {})] + [
        (("fhir_versions", version, "rules"), version, (section or {}).get("rules") or {})
        for version, section in (part.get("fhir_versions") or {}).items()]
    problems = [f"{site.at('fhir', *keys, key)}: fhir.{'.'.join(keys)}.{key}: {found}"
                for keys, version, table in tables for key in table
                if isinstance(found := element_at(key, version), str)]
    if problems:
        raise RulesFileError("\n".join(problems))
    packaged_doc = read_profile_file(MAPPINGS, site.extends)
    doc = merge(packaged_doc, {k: v for k, v in part.items() if k != "fhir_versions"}, ("rules",))
    versions = dict(packaged_doc.get("fhir_versions") or {})
    for version, section in (part.get("fhir_versions") or {}).items():
        versions[version] = merge(versions.get(version) or {}, section or {}, ("rules",))
    if versions:
        doc["fhir_versions"] = versions

    def where(keys: tuple, label: str) -> str:
        if ("fhir", *keys) in site.lines:
            return f"{site.at('fhir', *keys)}: fhir.{'.'.join(keys)}"
        return f"{site.extends}: {label}"
    with as_rules_error():
        profile = profile_from_doc(doc, where, site.sha256)
    packaged = load_profile(site.extends)
    _mark_site_rules(profile.rules, set(part.get("rules") or {}), packaged.rules)
    for version, section in (part.get("fhir_versions") or {}).items():
        _mark_site_rules(profile.version_rules.get(version, {}), set((section or {}).get("rules") or {}),
                         {**packaged.rules, **packaged.version_rules.get(version, {})})
    return with_safe_harbor_gaps(profile, [k for k, v in (part.get("rules") or {}).items() if v is None])


def _mark_site_rules(rules: dict, site_keys: set[str], packaged: dict) -> None:
    """A site's `keep` of an element (`Owner.element`, not a whole datatype such as `ContactPoint`, which patients'
    values have too) is trusted: the leak guard does not read what it keeps, there. A site rule with a condition
    falls through to the packaged rule of its key where the condition is false."""
    for key in site_keys:
        rule = rules.get(key)
        if rule is None:
            continue
        if rule.method == "keep" and "." in key:
            rule = rules[key] = replace(rule, trusted=True)
        if rule.test is not None and packaged.get(key) is not None:
            rules[key] = replace(rule, beneath=packaged[key])
