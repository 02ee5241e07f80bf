"""Profiles: declarative rules read from mappings/fhir/*.yaml, looked up by specificity."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import yaml

from fhir_transforms.fpe import FpeFormat
from fhir_transforms.methods import METHODS
import mappings

MAPPINGS = Path(mappings.__file__).resolve().parent / "fhir"


class ProfileError(ValueError):
    """A profile file is missing or names an unknown method."""


@dataclass(frozen=True)
class Rule:
    method: str
    options: dict = field(default_factory=dict)


@dataclass
class Profile:
    name: str
    version: str
    rules: dict[str, Rule]
    default_primitive: Rule
    identifier_remove_types: frozenset[str]
    identifier_remove_systems: frozenset[str]
    extension_allow: frozenset[str]
    modifier_extension_allow: frozenset[str]
    kept_by_design: frozenset[str] = frozenset()  # Owner.element values the leak guard trusts where the rules kept them
    plans: dict = field(default_factory=dict, repr=False)  # the walker's per-path plans (fhir_transforms/r4/walker.py)
    fhir_version: str = "r4"  # the FHIR version whose models these rules are applied with
    version_rules: dict = field(default_factory=dict, repr=False)  # version → path → Rule, or None to drop the rule
    _variants: dict = field(default_factory=dict, repr=False, compare=False)

    def for_version(self, version: str) -> "Profile":
        """The profile as applied to another FHIR version's models: its `fhir_versions` rules laid over
        these, with plans of its own (the same element path has other types there)."""
        if version == self.fhir_version:
            return self
        if version not in self._variants:
            rules = {**self.rules, **self.version_rules.get(version, {})}
            self._variants[version] = replace(self, rules={p: r for p, r in rules.items() if r is not None},
                                              fhir_version=version, plans={}, _variants={})
        return self._variants[version]

    def lookup(self, path: str, owner: str, owner_is_resource: bool, element: str, element_type: str) -> Rule | None:
        """The most specific rule for an element: full path, then owner.element, then type (the walker
        caches the answer per path in its plans)."""
        rules = self.rules
        return (
            rules.get(path)
            or rules.get(f"{owner}.{element}")
            or (rules.get(f"Resource.{element}") if owner_is_resource else None)
            or (rules.get(f"Element.{element}") if not owner_is_resource else None)
            or rules.get(element_type)
        )


def _rule(spec, where: str) -> Rule:
    if isinstance(spec, str):
        spec = {"method": spec}
    method = spec.get("method")
    if method not in METHODS:
        raise ProfileError(f"{where}: unknown method {method!r} (known: {', '.join(sorted(METHODS))})")
    options = {k: v for k, v in spec.items() if k != "method"}
    check_options(method, options, where)
    return Rule(method, options)


def check_options(method: str, options: dict, where: str) -> None:
    """Refuse a rule whose settings its method cannot use (checked when the profile loads, not per value)."""
    if method == "fpe":
        try:
            FpeFormat.from_options(options)
        except ValueError as e:
            raise ProfileError(f"{where}: {e}") from None


@lru_cache(maxsize=None)
def profile_names(folder: Path) -> frozenset[str]:
    """The profiles a mappings folder holds (its *.yaml names), listed once: a profile is chosen from these
    by exact name, and no name given at run time is ever joined to a path."""
    return frozenset(p.stem for p in folder.glob("*.yaml"))


def read_profile_file(folder: Path, name: str, sections: tuple[str, ...] = ("rules",)) -> dict:
    """A profile's YAML with `extends` resolved: the child's `sections` (rule tables) are merged into the
    base's, key by key; every other key of the child replaces the base's. FHIR and HL7v2 profiles share this."""
    known = profile_names(folder)
    if name not in known:
        raise ProfileError(f"unknown profile {str(name)[:64]!r} (known: {', '.join(sorted(known))})")
    doc = yaml.safe_load((folder / f"{name}.yaml").read_text())
    if "extends" not in doc:
        return doc
    base = read_profile_file(folder, doc["extends"], sections)
    merged = {**base, **{k: v for k, v in doc.items() if k not in sections}}
    for section in sections:
        merged[section] = {**base.get(section, {}), **doc.get(section, {})}
    return merged


@lru_cache(maxsize=None)
def load_profile(name: str) -> Profile:
    """Read and check a profile by name; every rule's method must be known."""
    doc = read_profile_file(MAPPINGS, name)
    rules = {path: _rule(spec, f"{name}: {path}") for path, spec in doc.get("rules", {}).items()}
    ids = doc.get("identifiers", {})
    return Profile(
        name=doc["profile"],
        version=str(doc["version"]),
        rules=rules,
        default_primitive=_rule(doc.get("default_primitive", "keep"), f"{name}: default_primitive"),
        identifier_remove_types=frozenset(ids.get("remove_types", [])),
        identifier_remove_systems=frozenset(ids.get("remove_systems", [])),
        extension_allow=frozenset(doc.get("extensions", {}).get("allow", [])),
        modifier_extension_allow=frozenset(doc.get("modifier_extensions", {}).get("allow", [])),
        kept_by_design=frozenset(doc.get("leak_guard", {}).get("kept_by_design", [])),
        version_rules={version: {path: None if spec is None else _rule(spec, f"{name}: fhir_versions.{version}: {path}")
                                 for path, spec in (section or {}).get("rules", {}).items()}
                       for version, section in doc.get("fhir_versions", {}).items()},
    )
