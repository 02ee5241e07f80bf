"""Profiles: declarative rules read from mappings/fhir/*.yaml, looked up by specificity."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

import yaml

from fhir_transforms.config import fhirpath
from fhir_transforms.fpe import FpeFormat
from fhir_transforms import safe_harbor_gaps as gaps
from fhir_transforms.methods import FHIR, METHODS
import mappings

MAPPINGS = Path(mappings.__file__).resolve().parent / "fhir"
DATA = MAPPINGS.parent / "data"
SAFE_HARBOR = "safe-harbor"  # the packaged profile every other set of rules is weighed against


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
    """FHIRPath's answer as a condition: true only for a single `true` (an empty answer is false); a condition that
    errors or runs out of its budget refuses the record (fhir_transforms/config/fhirpath.py)."""
    return fhirpath.holds(test, node)


@dataclass(frozen=True)
class EntryRule:
    """Bundle entries to remove: every resource of a type, or those whose coded `element` holds a code."""

    resource: str
    element: str | None = None
    code: str | None = None
    system: str | None = None


def _entry_rule(spec, where: str) -> EntryRule:
    if isinstance(spec, str):
        spec = {"resource": spec}
    unknown = set(spec) - {"resource", "element", "code", "system"} if isinstance(spec, dict) else {"?"}
    if unknown or not isinstance(spec.get("resource"), str) or ("element" in spec) != ("code" in spec):
        raise ProfileError(f"{where}: an entry rule is {{resource: Type}} or {{resource: Type, element: E, code: C "
                           f"[, system: S]}}")
    return EntryRule(spec["resource"], spec.get("element"), spec.get("code"), spec.get("system"))


@dataclass
class Profile:
    name: str
    version: str
    rules: dict[str, Rule]
    default_primitive: Rule
    identifier_remove_types: frozenset[str]
    identifier_remove_systems: frozenset[str]
    extension_allow: dict[str, "ExtensionKind | None"]  # url → what it may hold (None: anything, as before)
    modifier_extension_allow: frozenset[str]
    kept_by_design: frozenset[str] = frozenset()  # Owner.element values the leak guard trusts where the rules kept them
    rules_sha256: str = ""  # a site rules file's hash (fhir_transforms/site_rules.py); "" for a packaged profile
    safe_harbor_gaps: tuple = ()  # the rules that keep more than Safe Harbor allows (fhir_transforms/safe_harbor_gaps.py)
    marking: bool = False  # record on each element a rule changed what was done (a rule's `marking` overrides)
    remove_entries: tuple[EntryRule, ...] = ()  # Bundle entries removed whole, with the references to them
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

    @property
    def methods(self) -> set[str]:
        """The methods the profile's rules use."""
        return {r.method for r in self.rules.values()} | {self.default_primitive.method}

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
        test = fhirpath.compile_condition(condition) if isinstance(condition, str) else None
    except fhirpath.ConditionError as e:
        raise ProfileError(f"{where}: where: {e}") from None
    if test is None:
        raise ProfileError(f"{where}: where: a FHIRPath expression (a string)")
    return Rule(method, options, condition, test)


JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
              "object": (dict,)}
FPE_SETTINGS = ("alphabet", "keep_prefix", "check_digit")


def check_options(method: str, options: dict, where: str, engine: str = FHIR) -> None:
    """Refuse a rule whose settings its method cannot use (checked when the profile loads, not per value): each
    setting must be one the method declares for this engine (fhir_transforms/methods.py), of its type."""
    declared = METHODS[method]
    for name, value in options.items():
        param = declared.param(name)
        if param is None or engine not in param.engines:
            takes = [p.name for p in declared.params if engine in p.engines]
            raise ProfileError(f"{where}: {method}: unknown setting {name!r} (it takes: {', '.join(takes) or 'none'})")
        types = JSON_TYPES.get(param.type)
        if types and (not isinstance(value, types) or (bool in types) != isinstance(value, bool)):
            raise ProfileError(f"{where}: {method}: {name} is a{'n' * (param.type[0] in 'aeio')} {param.type}")
        if param.choices and value not in param.choices:
            raise ProfileError(f"{where}: {method}: {name} is one of {', '.join(map(str, param.choices))}")
    try:
        _check_method(method, options)
    except ValueError as e:
        raise ProfileError(f"{where}: {e}") from None


def _check_method(method: str, options: dict) -> None:
    """What the types alone do not say: settings that go together, and the shapes of `cases`."""
    if method == "fpe":
        FpeFormat.from_options(options)
    elif method == "encrypt":
        if options.get("format", "aes-siv") == "fpe":
            FpeFormat.from_options({k: v for k, v in options.items() if k in FPE_SETTINGS})
        elif any(k in options for k in FPE_SETTINGS):
            raise ValueError("encrypt: alphabet, keep_prefix and check_digit go with format: fpe")
    elif method == "substitute" and ("value" in options) == ("kind" in options):
        raise ValueError("substitute takes either value (a fixed value) or kind (a keyed surrogate)")
    elif method == "perturb" and (not isinstance(options.get("span"), (int, float)) or options["span"] < 0):
        raise ValueError("perturb needs span, a number of 0 or more")
    elif method == "perturb" and options.get("round_to", 0) < 0:
        raise ValueError("perturb: round_to is 0 or more decimal places")
    elif method == "generalize":
        cases = options.get("cases")
        if not isinstance(cases, list) or not cases:
            raise ValueError("generalize needs cases, a list of {range: [low, high], to: V} or {value: X, to: V}")
        for i, case in enumerate(cases):
            ok = isinstance(case, dict) and "to" in case and len(case) == 2 and (
                "value" in case or ("range" in case and isinstance(case["range"], list) and len(case["range"]) == 2))
            if not ok:
                raise ValueError(f"generalize: case {i + 1} is not {{range: [low, high], to: V}} or {{value: X, to: V}}")
    elif method == "shift" and "offset_days" in options and "scope" in options:
        raise ValueError("shift takes offset_days (one fixed offset) or scope, not both")


def _check_by_target(rule: Rule, rules: dict[str, Rule], where: str) -> None:
    """`by_target` (a Reference.display's rule by what it points to) names, per resource type, rules of the profile."""
    by_target = rule.options.get("by_target")
    if by_target is None:
        return
    if rule.method != "text" or not isinstance(by_target, dict):
        raise ProfileError(f"{where}: by_target is a map of resource types to rules, on a `text` rule")
    for target, key in by_target.items():
        found = rules.get(key) if isinstance(key, str) else None
        if found is None or "by_target" in found.options:
            raise ProfileError(f"{where}: by_target.{target} names no other rule of the profile")


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
    profile = profile_from_doc(read_profile_file(MAPPINGS, name), lambda keys, label: f"{name}: {label}")
    return with_safe_harbor_gaps(profile) if name != SAFE_HARBOR else profile


def with_safe_harbor_gaps(profile: Profile, dropped_keys: Iterable[str] = ()) -> Profile:
    """The profile, knowing which of its rules keep more than the packaged safe-harbor profile's (and which of
    those a site file dropped): outputs of a profile with gaps are not labelled Safe Harbor."""
    baseline = load_profile(SAFE_HARBOR)
    profile.safe_harbor_gaps = tuple(
        gaps.compare("fhir.rules", profile.rules, baseline.rules)
        + gaps.compare("fhir", {"default_primitive": profile.default_primitive},
                       {"default_primitive": baseline.default_primitive})
        + gaps.dropped("fhir.rules", dropped_keys, baseline.rules))
    return profile


def profile_from_doc(doc: dict, where: Callable[[tuple, str], str], rules_sha256: str = "") -> Profile:
    """A profile from its merged YAML; `where(keys, label)` names a rule or setting in error messages (`keys`: its
    keys in the YAML, `label`: how the message spells it)."""
    rules = {path: _rule(spec, where(("rules", path), path)) for path, spec in doc.get("rules", {}).items()}
    for path, rule in rules.items():
        _check_by_target(rule, rules, where(("rules", path), path))
    ids = doc.get("identifiers", {})
    return Profile(
        name=doc["profile"],
        version=str(doc["version"]),
        rules=rules,
        default_primitive=_rule(doc.get("default_primitive", "keep"), where(("default_primitive",), "default_primitive")),
        identifier_remove_types=frozenset(ids.get("remove_types", [])),
        identifier_remove_systems=frozenset(ids.get("remove_systems", [])),
        extension_allow=_extensions(doc.get("extensions") or {}, where(("extensions",), "extensions")),
        modifier_extension_allow=frozenset(doc.get("modifier_extensions", {}).get("allow", [])),
        kept_by_design=frozenset(doc.get("leak_guard", {}).get("kept_by_design", [])),
        rules_sha256=rules_sha256,
        marking=_flag(doc.get("marking", False), where(("marking",), "marking")),
        remove_entries=tuple(_entry_rule(spec, where(("entries", "remove", str(i)), f"entries.remove[{i}]"))
                             for i, spec in enumerate((doc.get("entries") or {}).get("remove", []))),
        version_rules={version: {path: None if spec is None else _rule(spec, where(
                                     ("fhir_versions", version, "rules", path), f"fhir_versions.{version}: {path}"))
                                 for path, spec in (section or {}).get("rules", {}).items()}
                       for version, section in (doc.get("fhir_versions") or {}).items()},
    )


@dataclass(frozen=True)
class ExtensionKind:
    """What an allowed extension may hold, from its StructureDefinition (mappings/data/extensions.yaml): the types
    of its value[x] (lower case), and its sub-extensions' relative urls with theirs."""

    values: frozenset[str]
    parts: dict[str, frozenset[str]]

    def fits(self, extension: dict, types: frozenset[str] | None = None) -> bool:
        """Whether every value[x] of `extension` has one of the types (this kind's own, or a part's)."""
        allowed = self.values if types is None else types
        return all(key[5:].lower() in allowed for key in extension if key.startswith("value"))


def _extensions(section: dict, where: str) -> dict[str, ExtensionKind | None]:
    """The allow-list: the definitions file's extensions by what they hold, and `allow`'s urls, which may hold
    anything (a site's own extensions, and relative urls of sub-extensions of theirs)."""
    found: dict[str, ExtensionKind | None] = dict.fromkeys(section.get("allow", []))
    name = section.get("definitions")
    if name is not None:
        path = DATA / str(name)
        if not isinstance(name, str) or path.parent != DATA or not path.is_file():
            raise ProfileError(f"{where}: definitions names a file of mappings/data/")
        for url, spec in _extension_file(path).items():
            found[url] = ExtensionKind(
                frozenset(t.lower() for t in spec.get("value", [])),
                {part: frozenset(t.lower() for t in types) for part, types in spec.get("extension", {}).items()})
    return found


@lru_cache(maxsize=None)
def _extension_file(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))["extensions"]


def _flag(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{where}: true or false")
    return value
