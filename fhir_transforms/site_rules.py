"""Site rules files: YAML that extends a packaged profile and overrides, adds or drops its rules (docs/rules.md).

A file is read with the line of every key, checked against a JSON Schema derived from the methods'
declaration (fhir_transforms/methods.py: names and settings), and merged onto the packaged profile by key.
Every error names the file and line. Its hash (canonical content + the packaged profiles' versions) marks
every output and audit record made with it. The engines check the paths against their models
(fhir_transforms/r4/site.py, fhir_transforms/hl7v2/rules.py).
"""
from __future__ import annotations

import hashlib
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import yaml

from fhir_transforms.config import files, yaml_data
from fhir_transforms.methods import COMMON, FHIR, HL7V2, METHODS, Param
from fhir_transforms.rules import MAPPINGS, ProfileError, profile_names, read_profile_file
import mappings

SCHEMA_FILE = Path(mappings.__file__).resolve().parent / "site-rules.schema.json"
HL7_MAPPINGS = Path(mappings.__file__).resolve().parent / "hl7v2"
SCHEMA_ID = "http://deid-adapter.org/schema/site-rules.schema.json"
MAX_ERRORS = 20
OTHER_FHIR_VERSIONS = ("r5", "stu3")  # FHIR versions whose rules lie over R4's (fhir_transforms/r4/schema.py FHIR_VERSIONS)
FHIR_PATH = r"^[A-Za-z][A-Za-z0-9]*(\.[a-z][A-Za-z0-9]*)*$"  # Type, Type.element, Resource.element.element
HL7_FIELD = r"^[A-Z][A-Z0-9]{2}\.[1-9][0-9]*$"  # SEG.n
HL7_DATATYPE = r"^[A-Z][A-Z0-9_]*$"  # datatype names are upper case, method names lower case


class RulesFileError(ProfileError):
    """A site rules file cannot be read, or breaks the schema or the model; the message names file and line."""


@contextmanager
def as_rules_error():
    """A profile built from a site file: its ProfileError is the file's error (exit 2), as its own ones are."""
    try:
        yield
    except RulesFileError:
        raise
    except ProfileError as e:
        raise RulesFileError(str(e)) from None


def param_schema(param: Param) -> dict:
    """A declared setting as JSON Schema: its type (\"any\": any JSON value), its choices, its meaning."""
    out: dict = {"description": param.meaning}
    if param.type != "any":
        out["type"] = param.type
    if param.choices:
        out["enum"] = list(param.choices)
    return out


def _method_rule(engine: str, where: dict | None) -> dict:
    """A rule object for an engine: a declared method and the settings that method declares for that engine
    (fhir_transforms/methods.py, the one declaration), plus `where` if conditions apply. What the types alone do
    not say (settings that go together) is checked when the rules load (fhir_transforms/rules.py check_options)."""
    cases = [{"if": {"properties": {"method": {"const": m.name}}},
              "then": {"properties": {"method": True,
                                      **{p.name: param_schema(p) for p in m.params + COMMON if engine in p.engines},
                                      **({"where": where} if where else {})},
                       "additionalProperties": False}}
             for m in METHODS.values() if engine in m.engines]
    return {"type": "object", "required": ["method"], "properties": {"method": {"enum": sorted(METHODS)}},
            "allOf": cases}


def schema() -> dict:
    """The site rules JSON Schema, derived from the methods' declaration and the packaged profiles (shipped as
    mappings/site-rules.schema.json; a test keeps the two equal)."""
    methods = {"enum": sorted(METHODS)}
    hl7_type_rule = {"type": "object", "required": ["type"], "additionalProperties": False,
                     "properties": {"type": {"type": "string", "pattern": HL7_DATATYPE}}}
    hl7_rule = {"if": {"type": "string"}, "then": {"anyOf": [methods, {"pattern": HL7_DATATYPE}]},
                "else": {"if": {"type": "object", "required": ["type"]}, "then": hl7_type_rule,
                         "else": {"$ref": "#/$defs/hl7MethodRule"}}}
    strings = {"type": "array", "items": {"type": "string"}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "deid-adapter site rules",
        "type": "object",
        "required": ["extends"],
        "additionalProperties": False,
        "properties": {
            "extends": {"enum": sorted(profile_names(MAPPINGS) & profile_names(HL7_MAPPINGS))},
            "description": {"type": "string"},
            "fhir": {"type": "object", "additionalProperties": False, "properties": {
                "rules": {"type": "object", "propertyNames": {"pattern": FHIR_PATH},
                          "additionalProperties": {"$ref": "#/$defs/fhirRule"}},
                "identifiers": {"type": "object", "additionalProperties": False,
                                "properties": {"remove_types": strings, "remove_systems": strings}},
                "marking": {"type": "boolean", "description": "record on each changed element what was done"},
                "entries": {"type": "object", "additionalProperties": False, "properties": {
                    "remove": {"type": "array", "items": {"$ref": "#/$defs/entryRule"}}}},
                "fhir_versions": {"type": "object", "additionalProperties": False, "properties": {
                    version: {"type": "object", "additionalProperties": False, "properties": {
                        "rules": {"type": "object", "propertyNames": {"pattern": FHIR_PATH},
                                  "additionalProperties": {"$ref": "#/$defs/fhirRule"}}}}
                    for version in OTHER_FHIR_VERSIONS}},
            }},
            "hl7v2": {"type": "object", "additionalProperties": False, "properties": {
                "fields": {"type": "object", "propertyNames": {"pattern": HL7_FIELD},
                           "additionalProperties": {"$ref": "#/$defs/hl7FieldRule"}},
                "datatypes": {"type": "object", "propertyNames": {"pattern": HL7_DATATYPE},
                              "additionalProperties": {"$ref": "#/$defs/hl7Datatype"}},
                "identifiers": {"type": "object", "additionalProperties": False,
                                "properties": {"remove_types": strings}},
                "charset": {"type": "string", "minLength": 1,
                            "description": "character set of messages whose MSH-18 is empty (HL7 table 0211: 8859/1)"},
            }},
        },
        "$defs": {
            # null drops the packaged rule of that key; a string names a method
            "fhirRule": {"if": {"type": "string"}, "then": methods,
                         "else": {"if": {"type": "null"}, "then": True, "else": {"$ref": "#/$defs/fhirMethodRule"}}},
            "fhirMethodRule": _method_rule(FHIR, {"type": "string", "minLength": 1}),  # a FHIRPath on the element
            # a whole resource type, or those whose coded element holds a code (fhir_transforms/rules.py EntryRule)
            "entryRule": {"if": {"type": "string"}, "then": {"pattern": "^[A-Z][A-Za-z]*$"},
                          "else": {"type": "object", "required": ["resource"], "additionalProperties": False,
                                   "dependentRequired": {"element": ["code"], "code": ["element"]},
                                   "properties": {"resource": {"type": "string", "pattern": "^[A-Z][A-Za-z]*$"},
                                                  "element": {"type": "string"}, "code": {"type": "string"},
                                                  "system": {"type": "string"}}}},
            "hl7Condition": {"type": "object", "required": ["component", "in"], "additionalProperties": False,
                             "properties": {"component": {"type": "integer", "minimum": 1},
                                            "in": {"type": "array", "minItems": 1, "items": {"type": "string"}}}},
            "hl7MethodRule": _method_rule(HL7V2, None),
            "hl7FieldRule": {"if": {"type": "null"}, "then": True,
                             "else": {"if": {"type": "object", "required": ["where"]},
                                      "then": {"$ref": "#/$defs/hl7ConditionalRule"}, "else": hl7_rule}},
            "hl7ConditionalRule": _method_rule(HL7V2, {"$ref": "#/$defs/hl7Condition"}),
            "hl7Datatype": {"if": {"type": "null"}, "then": True,
                            "else": {"if": {"type": "object", "not": {"anyOf": [{"required": ["method"]},
                                                                                {"required": ["type"]}]}},
                                     "then": {"type": "object", "additionalProperties": False,
                                              "patternProperties": {"^[1-9][0-9]*$": hl7_rule},
                                              "properties": {"default": hl7_rule}},
                                     "else": hl7_rule}},
        },
    }


@dataclass
class SiteRules:
    """A checked site rules file: its content, the line of each key, its hash and the packaged profile it extends."""

    path: Path
    doc: dict
    lines: dict[tuple[str, ...], int]
    sha256: str = ""
    extends: str = ""
    versions: dict = field(default_factory=dict)  # the packaged profiles' versions the hash covers

    def at(self, *keys: str) -> str:
        """`file:line` of a key (or the nearest enclosing one)."""
        keys = tuple(str(k) for k in keys)
        while keys and keys not in self.lines:
            keys = keys[:-1]
        return f"{self.path}:{self.lines.get(keys, 1)}"

    def section(self, name: str) -> dict:
        return self.doc.get(name) or {}


def read_site_rules(path: Path) -> SiteRules:
    """Read and check a site rules file: RulesFileError names the file and line of each problem."""
    path = Path(path)
    try:
        text = files.read_config_text(path)
    except files.ConfigFileError as e:
        raise RulesFileError(f"{path}: cannot read the rules file: {e.strerror}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RulesFileError(f"{path}: cannot read the rules file ({type(e).__name__})") from None
    try:
        node = yaml_data.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line + 1 if mark else 1
        raise RulesFileError(f"{path}:{line}: not YAML: {getattr(e, 'problem', None) or e}") from None
    lines: dict[tuple[str, ...], int] = {}
    problems: list[tuple[int, str]] = []
    doc = _construct(node, (), lines, problems, path) if node is not None else None
    site = SiteRules(path, doc if isinstance(doc, dict) else {}, lines)
    if not isinstance(doc, dict):
        raise RulesFileError(f"{path}:1: a rules file is a mapping (extends: safe-harbor, fhir: ..., hl7v2: ...)")
    validator = jsonschema.Draft202012Validator(schema())
    for error in validator.iter_errors(doc):
        error = jsonschema.exceptions.best_match([error])
        keys = [str(k) for k in error.absolute_path]
        extra = _unexpected_key(error)
        if extra is not None:
            keys.append(extra)
        where = site.at(*keys)
        problems.append((int(where.rsplit(":", 1)[1]), f"{where}: {_describe(keys, error, extra)}"))
    if problems:
        raise RulesFileError("\n".join(m for _, m in sorted(problems)[:MAX_ERRORS]))
    site.extends = doc["extends"]
    site.versions = {"fhir": str(read_profile_file(MAPPINGS, site.extends)["version"]),
                     "hl7v2": str(read_profile_file(HL7_MAPPINGS, site.extends, ("fields", "datatypes"))["version"])}
    canonical = json.dumps({"site": doc, "packaged": {site.extends: site.versions}}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    site.sha256 = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return site


def _construct(node: yaml.Node, keys: tuple[str, ...], lines: dict, problems: list, source: Path):
    """The node's value with every mapping key as text, recording each key's line (and duplicate keys)."""
    lines.setdefault(keys, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            key = str(yaml_data.construct_scalar(key_node))
            if key in out:
                problems.append((key_node.start_mark.line + 1, f"{source}:{key_node.start_mark.line + 1}: "
                                 f"{'.'.join(keys + (key,))}: given twice"))
            lines[keys + (key,)] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, keys + (key,), lines, problems, source)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, keys + (str(i),), lines, problems, source) for i, v in enumerate(node.value)]
    return yaml_data.construct_scalar(node)


def _unexpected_key(error: jsonschema.ValidationError) -> str | None:
    """The first key an `additionalProperties: false` or `propertyNames` error is about, to point at its line."""
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {})
        patterns = error.schema.get("patternProperties", {})
        return next((k for k in error.instance if k not in known
                     and not any(re.search(p, k) for p in patterns)), None)
    if error.validator == "pattern" and error.path and error.parent is None and error.schema_path \
            and "propertyNames" in error.schema_path:
        return str(error.instance)
    return None


def _describe(keys: list[str], error: jsonschema.ValidationError, extra: str | None) -> str:
    """One sentence for a schema error: what, where in the file's structure, and what is allowed."""
    where = ".".join(keys) or "the file"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return f"{where}: unknown key {extra!r}" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if error.validator == "enum" and error.validator_value == sorted(METHODS):
        return f"{where}: unknown method {error.instance!r} (known: {', '.join(sorted(METHODS))})"
    if error.validator == "enum" and keys == ["extends"]:
        return f"extends: unknown profile {error.instance!r} (known: {', '.join(error.validator_value)})"
    if error.validator == "pattern" and extra is not None:
        return f"{where}: {extra!r} is not a rule key of this section (pattern {error.validator_value})"
    if error.validator == "anyOf" and isinstance(error.instance, str):
        return f"{where}: {error.instance!r} is neither a method ({', '.join(sorted(METHODS))}) nor a datatype name"
    if error.validator == "required":
        return f"{where}: {error.message}"
    if error.validator == "type":
        return f"{where}: expected {error.validator_value}, got {type(error.instance).__name__}"
    return f"{where}: {error.message}"


def merge(base: dict, site_part: dict, sections: tuple[str, ...]) -> dict:
    """The packaged profile with a site part merged in: in each rule table (`sections`), a site key replaces the
    packaged rule of that key or adds one, and `null` drops it; any other mapping (identifiers) is merged one
    level down (a list given replaces the packaged list), and any other value (marking) replaces the packaged one."""
    merged = dict(base)
    for key, value in site_part.items():
        if key in sections:
            table = dict(base.get(key) or {})
            for k, rule in value.items():
                if rule is None:
                    table.pop(_key(k, table), None)
                else:
                    table[_key(k, table)] = rule
            merged[key] = table
        elif isinstance(value, dict):
            merged[key] = {**(base.get(key) or {}), **value}
        else:
            merged[key] = value
    return merged


def _key(key: str, table: dict):
    """A site key as the packaged table spells it (YAML reads `2:` in a packaged datatype as a number)."""
    return int(key) if key.isdigit() and int(key) in table else key


def origins(folder: Path, name: str, section: str) -> dict[str, str]:
    """Key → the packaged file its rule in `section` comes from (the profile or one it extends)."""
    doc = yaml.safe_load((folder / f"{name}.yaml").read_text())
    found = origins(folder, doc["extends"], section) if "extends" in doc else {}
    here = f"mappings/{folder.name}/{name}.yaml"
    return {**found, **{str(k): here for k in (doc.get(section) or {})}}


def write_schema() -> str:
    """The schema as it is shipped (mappings/site-rules.schema.json)."""
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


def schema_file_is_current() -> bool:
    return SCHEMA_FILE.is_file() and SCHEMA_FILE.read_text(encoding="utf-8") == write_schema()
