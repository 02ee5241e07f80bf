"""Entry rules: remove whole Bundle entries (every Provenance, the DocumentReferences of a type), and every
reference to them, so that the Bundle stays valid and no reference dangles.

Runs on the record as given, before the rules: references are matched in their original form (fullUrl,
Type/id, an absolute URL ending in Type/id). A removed reference in a list is dropped; a single one that the
model requires (or the last of a required list) keeps only a data-absent-reason ("masked"); any other single one is removed.
"""
from __future__ import annotations

from functools import lru_cache

from fhir.resources.R4B import get_fhir_model_class

from fhir_transforms.r4.references import LITERAL_RE
from fhir_transforms.r4.schema import PRIMITIVES, elements, is_resource_type
from fhir_transforms.rules import EntryRule

DATA_ABSENT = "http://hl7.org/fhir/StructureDefinition/data-absent-reason"
PRIMITIVE_TYPES = frozenset(PRIMITIVES.values()) | {"boolean"}


def remove_entries(bundle: dict, rules: tuple[EntryRule, ...]) -> set[int]:
    """Remove the entries the rules name from a Bundle, and the references to them; the ids (id()) of the
    resources changed: the Bundle itself when an entry went, and each resource that lost a reference."""
    if not rules or bundle.get("resourceType") != "Bundle" or not isinstance(bundle.get("entry"), list):
        return set()
    gone: set[str] = set()
    kept = []
    for entry in bundle["entry"]:
        res = entry.get("resource") if isinstance(entry, dict) else None
        if isinstance(res, dict) and any(_matches(res, rule) for rule in rules):
            if isinstance(entry.get("fullUrl"), str):
                gone.add(entry["fullUrl"])
            if isinstance(res.get("id"), str):
                gone.add(f"{res['resourceType']}/{res['id']}")
        else:
            kept.append(entry)
    if len(kept) == len(bundle["entry"]):
        return set()
    if kept:
        bundle["entry"] = kept
    else:
        del bundle["entry"]
    changed = {id(bundle)}
    for entry in kept:
        res = entry.get("resource")
        if isinstance(res, dict) and is_resource_type(str(res.get("resourceType"))) and \
                _clean(res, res["resourceType"], gone):
            changed.add(id(res))
    return changed


def removed(entry, rules: tuple[EntryRule, ...]) -> set[str] | None:
    """The ways references name an entry the rules remove (its fullUrl, Type/id); None for an entry kept."""
    res = entry.get("resource") if isinstance(entry, dict) else None
    if not (rules and isinstance(res, dict) and any(_matches(res, rule) for rule in rules)):
        return None
    names = {entry["fullUrl"]} if isinstance(entry.get("fullUrl"), str) else set()
    if isinstance(res.get("id"), str):
        names.add(f"{res['resourceType']}/{res['id']}")
    return names


def clean_entry(entry, gone: set[str]) -> bool:
    """Remove an entry's references to removed entries (`gone`, as `removed` names them); whether any went."""
    res = entry.get("resource") if isinstance(entry, dict) else None
    return bool(gone) and isinstance(res, dict) and is_resource_type(str(res.get("resourceType"))) and \
        _clean(res, res["resourceType"], gone)


def _matches(res: dict, rule: EntryRule) -> bool:
    if res.get("resourceType") != rule.resource:
        return False
    if rule.element is None:
        return True
    concepts = res.get(rule.element)
    for concept in concepts if isinstance(concepts, list) else [concepts]:
        for coding in (concept or {}).get("coding", []) if isinstance(concept, dict) else []:
            if isinstance(coding, dict) and coding.get("code") == rule.code and (
                    rule.system is None or coding.get("system") == rule.system):
                return True
    return False


def _points_at_removed(reference, gone: set[str]) -> bool:
    if not isinstance(reference, dict) or not isinstance(reference.get("reference"), str):
        return False
    value = reference["reference"]
    if value in gone:
        return True
    m = LITERAL_RE.match(value)
    return bool(m) and f"{m['type']}/{m['id']}" in gone


@lru_cache(maxsize=None)
def _required(type_name: str, key: str) -> bool:
    """Whether the model requires an element (a list of 1..*, which schema.Element does not mark)."""
    fields = get_fhir_model_class(type_name).model_fields
    return any((f.alias or n) == key and f.is_required() for n, f in fields.items())


def _clean(node: dict, type_name: str, gone: set[str]) -> bool:
    """Remove the references to removed entries under `node` (of FHIR type `type_name`); whether any went."""
    changed = False
    for key, el in elements(type_name).items():
        if key not in node or el.type in PRIMITIVE_TYPES or el.type in ("Element", "Extension"):
            continue
        value = node[key]
        items = value if isinstance(value, list) else [value]
        if el.type == "Reference":
            left = [v for v in items if not _points_at_removed(v, gone)]
            if len(left) == len(items):
                continue
            changed = True
            if left:
                node[key] = left
            elif el.required or _required(type_name, key):  # a reference the model requires: present, and saying why it is empty
                absent = {"extension": [{"url": DATA_ABSENT, "valueCode": "masked"}]}
                node[key] = [absent] if el.is_list else absent
            else:
                del node[key]
            continue
        for item in items:
            if not isinstance(item, dict):
                continue
            if el.type == "Resource":
                rtype = str(item.get("resourceType"))
                if is_resource_type(rtype):
                    changed |= _clean(item, rtype, gone)
            else:
                changed |= _clean(item, el.type, gone)
    return changed
