"""`deid-adapter rules`: check a site rules file, explain which rule applies to a path, print the schema."""
from __future__ import annotations

import re
from pathlib import Path

import typer

from adapter.engines import Profiles, profiles
from fhir_transforms.hl7v2.rules import MAPPINGS as HL7_MAPPINGS
from fhir_transforms.hl7v2.rules import SECTIONS, Datatype, HL7Profile
from fhir_transforms.hl7v2.rules import Rule as HL7Rule
from fhir_transforms.hl7v2.standard import DEFAULT_VERSION, field_type
from fhir_transforms.r4.site import element_at
from fhir_transforms.rules import MAPPINGS, Rule, profile_names
from fhir_transforms import safe_harbor_gaps
from fhir_transforms.site_rules import origins, write_schema
from adapter.cli.common import fail

rules_app = typer.Typer(help="Check site rules files, and explain which rule applies to a FHIR or HL7v2 path.",
                        no_args_is_help=True)
HL7_PATH = re.compile(r"^(?P<sid>[A-Z][A-Z0-9]{2})[-.](?P<n>[1-9][0-9]*)$")  # PID-13 or PID.13


@rules_app.command("check")
def rules_check(file: Path = typer.Argument(..., help="A site rules file (YAML).")) -> None:
    """Check a site rules file: exit 0 and a summary, or exit 2 naming the line of each problem."""
    chosen = profiles(None, file)
    site = chosen.site
    fhir_rules = site.section("fhir").get("rules") or {}
    packaged = profiles(site.extends)
    typer.echo(f"{file}: ok; extends {site.extends} (FHIR {site.versions['fhir']}, HL7v2 {site.versions['hl7v2']})")
    typer.echo(f"  fhir.rules: {_counts(fhir_rules, packaged.fhir.rules)}")
    for section in SECTIONS:
        given = site.section("hl7v2").get(section) or {}
        typer.echo(f"  hl7v2.{section}: {_counts(given, getattr(packaged.hl7, section))}")
    typer.echo(f"  sha256 {site.sha256} (meta.tag http://deid-adapter.org/fhir/CodeSystem/site-rules, "
               "MSH-8, audit)")
    gaps = [*chosen.fhir.safe_harbor_gaps, *chosen.hl7.safe_harbor_gaps]
    if not gaps:
        typer.echo(f"  Safe Harbor: yes; outputs are labelled {safe_harbor_gaps.label(chosen.fhir)}")
        return
    typer.echo(f"  Safe Harbor: no, {len(gaps)} rule(s) keep more than it allows; outputs are labelled "
               f"{safe_harbor_gaps.label(chosen.fhir)} and {safe_harbor_gaps.NOT_SAFE_HARBOR}, not "
               f"{site.extends}@{site.versions['fhir']}:")
    for gap in gaps:
        part, section, key = gap.where.split(".", 2) if gap.where.count(".") >= 2 else (*gap.where.split("."), "")
        at = site.at(part, section, key) if key else site.at(part, section)
        typer.echo(f"    {at}: {gap}")


def _counts(given: dict, packaged: dict) -> str:
    dropped = sum(1 for v in given.values() if v is None)
    overridden = sum(1 for k, v in given.items() if v is not None and _packaged_key(k, packaged) in packaged)
    conditional = sum(1 for v in given.values() if isinstance(v, dict) and "where" in v)
    return (f"{len(given) - dropped - overridden} added, {overridden} overridden, {dropped} dropped, "
            f"{conditional} with a condition")


def _packaged_key(key: str, table: dict):
    return int(key) if key.isdigit() and int(key) in table else key


@rules_app.command("explain")
def rules_explain(file: str = typer.Argument(..., help="A site rules file, or a packaged profile's name."),
                  path: str = typer.Argument(..., help="A FHIR path (Patient.telecom, Address.city, dateTime) or an "
                                                       "HL7v2 field (PID-13).")) -> None:
    """Which rule applies to a path, from which file (packaged or site), and why, conditions included."""
    chosen = profiles(file) if file in profile_names(MAPPINGS) and not Path(file).exists() else profiles(None, Path(file))
    m = HL7_PATH.match(path)
    lines = _explain_hl7(chosen, m["sid"], int(m["n"])) if m else _explain_fhir(chosen, path)
    typer.echo("\n".join(lines))


def _source(chosen: Profiles, part: str, section: str, key: str) -> str:
    """Where a rule comes from: the site rules file and line, or the packaged file."""
    site = chosen.site
    folder = MAPPINGS if part == "fhir" else HL7_MAPPINGS
    packaged = origins(folder, site.extends if site else chosen.name, section).get(str(key))
    if site is not None and str(key) in (site.section(part).get(section) or {}):
        return f"site rules {site.at(part, section, str(key))}" + (f", over {packaged}" if packaged else "")
    return f"packaged {packaged}" if packaged else "packaged"


def _fhir_rule(rule: Rule) -> str:
    settings = ", ".join(f"{k}: {v}" for k, v in rule.options.items())
    return rule.method + (f" ({settings})" if settings else "") + (f" where {rule.where}" if rule.where else "")


def _explain_fhir(chosen: Profiles, path: str) -> list[str]:
    at = element_at(path)
    if isinstance(at, str):
        fail(f"{path}: {at}")
    profile = chosen.fhir
    if not at.element:  # a type name: its own rule
        found = [(path, profile.rules[path])] if path in profile.rules else []
        head = f"{path} (a type): every element of this type, unless a more specific rule applies"
    else:
        found = profile.candidates(path, at.owner, at.owner_is_resource, at.element, at.type)
        head = f"{path}: element {at.element!r} of {at.owner}, type {at.type or 'read by its shape'}"
    lines = [head, f"  rules: {chosen.site.path if chosen.site else 'packaged'} over {profile.name}@{profile.version}",
             "  candidates, most specific first (full path, owner.element, Resource./Element.element, type):"]
    seen = set()
    for i, (key, rule) in enumerate(found, 1):
        source = "the packaged rule it overrides" if key in seen else _source(chosen, "fhir", "rules", key)
        seen.add(key)
        lines.append(f"    {i}. {key}: {_fhir_rule(rule)}  [{source}]")
    applies = next((i for i, (_, r) in enumerate(found, 1) if r.where is None), None)
    if not found:
        lines.append("    (none)")
    if found and found[0][1].where is not None:
        rest = f"rule {applies}" if applies else _no_rule(at.type, profile)
        lines.append(f"  applies: rule 1 to each value whose element (a primitive: the element holding it) makes "
                     f"the FHIRPath condition true; where it is false or empty, the next candidate, ... up to {rest}")
    elif found:
        lines.append(f"  applies: rule 1 ({found[0][0]}), the most specific; the rules after it do not apply here")
    else:
        lines.append(f"  applies: {_no_rule(at.type, profile)}")
    if at.type == "Identifier" or path.endswith("Identifier.value"):
        lines.append(f"  also: identifiers of types {sorted(profile.identifier_remove_types)} or systems "
                     f"{sorted(profile.identifier_remove_systems)} are removed, not pseudonymized (identifiers:)")
    return lines


def _no_rule(type_name: str, profile) -> str:
    if type_name and type_name[0].islower():
        return f"no rule: default_primitive, {_fhir_rule(profile.default_primitive)}"
    return "no rule: the element is walked into, and each of its elements gets its own rule"


def _hl7_rule(rule: HL7Rule | Datatype) -> str:
    if isinstance(rule, Datatype):
        comps = ", ".join(f"{i}: {_hl7_rule(r)}" for i, r in sorted(rule.components.items()))
        return f"{{{comps + ', ' if comps else ''}default: {_hl7_rule(rule.default)}}}"
    text = rule.method or rule.type or ""
    if rule.options:
        text += " (" + ", ".join(f"{k}: {v}" for k, v in rule.options.items()) + ")"
    if rule.where is not None:
        text += f" where component {rule.where[0]} in {sorted(rule.where[1])}"
    return text


def _explain_hl7(chosen: Profiles, sid: str, n: int) -> list[str]:
    profile: HL7Profile = chosen.hl7
    lines = [f"{sid}-{n}", f"  rules: {chosen.site.path if chosen.site else 'packaged'} over "
                           f"{profile.name}@{profile.version} (HL7v2)"]
    if sid == "OBX" and n == 5:
        lines.append("  applies: OBX-5 is ruled by its value type OBX-2 (observation_values), ages by OBX-3/OBX-6")
        return lines
    if sid == "QPD" and n >= 3:
        named = [f"{name}: {_hl7_rule(q.fields[n]) if n in q.fields else 'QIP pairs, each ruled as the field it names'}"
                 for name, q in sorted(profile.queries.items()) if n in q.fields or n in q.pairs]
        lines += ["  applies: the query's parameter, by QPD-1.1 (queries):"] + [f"    {text}" for text in named]
        lines.append("    any other query: every value removed, and a known identifier")
        return lines
    if f"{sid}.{n}" in profile.subject_values:
        lines.append("  applies: subject_values: every value about the patient queried, removed and a known identifier")
        return lines
    listed = profile.fields.get(f"{sid}.{n}")
    datatype = field_type(DEFAULT_VERSION, sid, n)
    numbered = []
    if listed is not None:
        numbered.append(f"fields {sid}.{n}: {_hl7_rule(listed)}  [{_source(chosen, 'hl7v2', 'fields', f'{sid}.{n}')}]")
        if listed.where is not None and listed.beneath is not None:
            numbered.append(f"fields {sid}.{n}: {_hl7_rule(listed.beneath)}  [the packaged rule it overrides]")
    if datatype is None:
        fallback = f"unknown_segment: {_hl7_rule(profile.unknown_segment)} (no version defines {sid}-{n}: a Z-segment " \
                   "or a field past its segment's end)"
    elif datatype in profile.datatypes:
        target = profile.resolve(HL7Rule(type=datatype))
        fallback = f"datatype {datatype} (HL7v2 {DEFAULT_VERSION}, or the first later version defining it): " \
                   f"{_hl7_rule(target)}  [{_source(chosen, 'hl7v2', 'datatypes', datatype)}]"
    else:
        fallback = f"datatype {datatype}, not listed: unlisted_datatype, {_hl7_rule(profile.unlisted_datatype)}"
    numbered.append(fallback)
    lines += [f"    {i}. {text}" for i, text in enumerate(numbered, 1)]
    if listed is None:
        lines.append("  applies: rule 1, by the field's datatype (no field rule names it)")
    elif listed.where is not None:
        lines.append(f"  applies: rule 1 to each repetition whose component {listed.where[0]} is one of "
                     f"{sorted(listed.where[1])}; every other repetition gets rule 2")
        if len(numbered) > 2:
            lines.append(f"  (rule {len(numbered)} does not apply here: rule 2 has no condition)")
    else:
        lines.append("  applies: rule 1, the field rule; rule 2 does not apply here")
    return lines


@rules_app.command("schema")
def rules_schema() -> None:
    """Print the site rules JSON Schema (as shipped in mappings/site-rules.schema.json)."""
    typer.echo(write_schema(), nl=False)
