"""Profiles: declarative rules read from mappings/fhir/*.yaml, looked up by specificity."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

import fhirpathpy
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
    where: str | None = None  # a FHIRPath condition on the element (on a primitive's parent): the rule applies where true
    test: Callable | None = field(default=None, compare=False, repr=False)  # `where`, compiled once per load
    otherwise: "Rule | None" = field(default=None, compare=False)  # where false: the next applicable rule (None: none)
    beneath: "Rule | None" = field(default=None, compare=False)  # the packaged rule of the same key a site rule overrides
    trusted: bool = field(default=False, compare=False)  # a site's `keep`: the leak guard does not read what it keeps

    def applies(self, node) -> "Rule | None":
        """The rule that applies to a value whose element (or parent, for a primitive) is `node`: this one, or
        where its condition is false the next applicable one."""
        rule = self
        while rule is not None and rule.test is not None and not _true(rule.test, node):
            rule = rule.otherwise
        return rule


def _true(test: Callable, node) -> bool:
    """FHIRPath's answer as a condition: true only for a single `true` (an empty answer is false)."""
    try:
        return test(node) == [True]
    except Exception:  # fhirpathpy raises its own kinds on a value of an unexpected shape: the condition fails
        return False


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
    rules_sha256: str = ""  # a site rules file's hash (fhir_transforms/site_rules.py); "" for a packaged profile
    plans: dict = field(default_factory=dict, repr=False)  # the walker's per-path plans (fhir_transforms/r4/walker.py)

    def lookup(self, path: str, owner: str, owner_is_resource: bool, element: str, element_type: str) -> Rule | None:
        """The most specific rule for an element: full path, then owner.element, then type (the walker
        caches the answer per path in its plans)."""
        rules = self.rules
        found = (
            rules.get(path)
            or rules.get(f"{owner}.{element}")
            or (rules.get(f"Resource.{element}") if owner_is_resource else None)
            or (rules.get(f"Element.{element}") if not owner_is_resource else None)
            or rules.get(element_type)
        )
        if found is None or found.test is None:
            return found
        chain = self.candidates(path, owner, owner_is_resource, element, element_type)
        return _chained([rule for _, rule in chain])

    def candidates(self, path: str, owner: str, owner_is_resource: bool, element: str,
                   element_type: str) -> list[tuple[str, Rule]]:
        """Every rule that may apply to an element, most specific first, with its key (`rules explain`)."""
        keys = (path, f"{owner}.{element}", f"Resource.{element}" if owner_is_resource else f"Element.{element}",
                element_type)
        found = []
        for key in dict.fromkeys(keys):
            rule = self.rules.get(key)
            while rule is not None:  # a conditional site rule, then the packaged rule of that key it overrides
                found.append((key, rule))
                rule = rule.beneath if rule.test is not None else None
        return found


def _chained(rules: list[Rule]) -> Rule | None:
    """The first rule, each conditional one falling through to the next (up to the first without a condition)."""
    if not rules:
        return None
    first = rules[0]
    return first if first.test is None else replace(first, otherwise=_chained(rules[1:]))


def _rule(spec, where: str) -> Rule:
    if isinstance(spec, str):
        spec = {"method": spec}
    method = spec.get("method")
    if method not in METHODS:
        raise ProfileError(f"{where}: unknown method {method!r} (known: {', '.join(sorted(METHODS))})")
    options = {k: v for k, v in spec.items() if k not in ("method", "where")}
    check_options(method, options, where)
    condition = spec.get("where")
    if condition is None:
        return Rule(method, options)
    try:
        test = fhirpathpy.compile(condition)
        test({})  # fhirpathpy compiles lazily: a first evaluation finds what it cannot parse or does not implement
    except Exception as e:  # the FHIRPath parser raises its own kinds
        raise ProfileError(f"{where}: where: not a FHIRPath expression ({str(e)[:120]})") from None
    return Rule(method, options, condition, test)


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
    return profile_from_doc(read_profile_file(MAPPINGS, name), lambda *keys: f"{name}: {keys[-1]}")


def profile_from_doc(doc: dict, where: Callable[..., str], rules_sha256: str = "") -> Profile:
    """A profile from its merged YAML; `where(section, key)` names a rule in error messages."""
    rules = {path: _rule(spec, where("rules", path)) for path, spec in doc.get("rules", {}).items()}
    ids = doc.get("identifiers", {})
    return Profile(
        name=doc["profile"],
        version=str(doc["version"]),
        rules=rules,
        default_primitive=_rule(doc.get("default_primitive", "keep"), where("default_primitive")),
        identifier_remove_types=frozenset(ids.get("remove_types", [])),
        identifier_remove_systems=frozenset(ids.get("remove_systems", [])),
        extension_allow=frozenset(doc.get("extensions", {}).get("allow", [])),
        modifier_extension_allow=frozenset(doc.get("modifier_extensions", {}).get("allow", [])),
        kept_by_design=frozenset(doc.get("leak_guard", {}).get("kept_by_design", [])),
        rules_sha256=rules_sha256,
    )
