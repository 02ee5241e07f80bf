"""Whether a set of rules still meets Safe Harbor: each rule that differs from the packaged `safe-harbor`
profile is weighed against the rule it replaces, and every rule that keeps more than it is a gap.

A profile or site rules file with gaps must not label its outputs `safe-harbor@…` (docs/rules.md): a
downstream system reading that tag would treat full shifted dates or kept names as de-identified.
Rules are compared as objects of either engine (FHIR `Rule`, HL7v2 `Rule`/`Datatype`): this module reads
their `method` and `options` only, and knows neither engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

# How much of a value a method can let through, least first. Keyed pseudonyms and encryption count as
# Safe Harbor's re-identification codes (45 CFR 164.514(c)), as the packaged safe-harbor profile uses them.
KEEPS_ALL, KEEPS_DETAIL, SAFE = 0, 1, 2
_STRENGTH = {"keep": KEEPS_ALL, "shift": KEEPS_DETAIL}
_WHY = {KEEPS_ALL: "keeps the value as it is", KEEPS_DETAIL: "keeps full (shifted) dates: Safe Harbor keeps the year only"}

# Owners whose values identify staff or software, not the individual, a relative, an employer or a household
# member (164.514(b)(2)(i)): a site may keep them (staff work phones) and still meet Safe Harbor.
STAFF_OWNERS = frozenset({"Practitioner", "PractitionerRole", "STF", "PRA", "PRT"})


@dataclass(frozen=True)
class Gap:
    """One rule that keeps more than Safe Harbor allows: where it is (`fhir.rules.date`) and why."""

    where: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.why}"


def strength(rule) -> int:
    """How much a rule (a method and its options) can let through."""
    method = getattr(rule, "method", None)
    if method == "generalize":  # a value no case matches is kept unless `otherwise: remove` (the default)
        return KEEPS_ALL if (getattr(rule, "options", None) or {}).get("otherwise") == "keep" else SAFE
    return _STRENGTH.get(method, SAFE)


def _chain(rule) -> Iterable:
    """A rule and the rules it falls through to where its condition is false; an HL7v2 datatype's component
    rules and default."""
    while rule is not None:
        if hasattr(rule, "components"):
            yield from (*rule.components.values(), rule.default)
            return
        yield rule
        rule = getattr(rule, "otherwise", None) or getattr(rule, "beneath", None)


def compare(part: str, rules: dict, baseline: dict, owner_of: Callable[[str], str] = lambda key: key.split(".")[0]
            ) -> list[Gap]:
    """The gaps of `rules` (key → rule) against the safe-harbor `baseline` of the same table."""
    gaps = []
    for key in sorted(rules, key=str):
        rule, base = rules[key], baseline.get(key)
        if rule is None or _same(rule, base) or owner_of(str(key)) in STAFF_OWNERS:
            continue
        floor = min((strength(r) for r in _chain(base)), default=SAFE)
        weakest = min(strength(r) for r in _chain(rule))
        if weakest < floor:
            gaps.append(Gap(f"{part}.{key}", f"{getattr(rule, 'method', None) or 'a rule'} {_WHY[weakest]}"))
    return gaps


def dropped(part: str, keys: Iterable[str], baseline: dict) -> list[Gap]:
    """Gaps for packaged safe-harbor rules that a site file drops (`null`): what then applies is not proven."""
    return [Gap(f"{part}.{key}", "drops the packaged Safe Harbor rule") for key in keys
            if key in baseline and strength(baseline[key]) == SAFE and key.split(".")[0] not in STAFF_OWNERS]


def _same(rule, base) -> bool:
    return base is not None and [(getattr(r, "method", None), getattr(r, "options", None)) for r in _chain(rule)] == \
        [(getattr(r, "method", None), getattr(r, "options", None)) for r in _chain(base)]


NOT_SAFE_HARBOR = "not-safe-harbor"  # the tag code (FHIR) and MSH-8 suffix (HL7v2) of outputs of rules with gaps


def label(profile) -> str:
    """What the rules are, as outputs and audit records name them: `safe-harbor@2026.11.1` (a site file that keeps
    Safe Harbor is named by its hash beside it), `longitudinal@…`, or `site.<hash>` for site rules with gaps, which
    must not pass as the profile they extend."""
    sha = getattr(profile, "rules_sha256", "")
    if sha and profile.safe_harbor_gaps:
        return f"site.{sha[:12]}"
    return f"{profile.name}@{profile.version}"
