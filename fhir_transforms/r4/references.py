"""Rewrite every way FHIR points at a resource with the one pseudonym function, so references still resolve."""
from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote

from fhir_transforms.pseudonym import UUID_RE, Pseudonymizer

# [base/]Type/id[/_history/vid]
LITERAL_RE = re.compile(
    r"^(?P<base>(?:https?://[^?#]*/)?)(?P<type>[A-Z][A-Za-z]+)/(?P<id>[A-Za-z0-9\-.]{1,64})(?P<history>/_history/[A-Za-z0-9\-.]{1,64})?$"
)
# [base/]Type[/_search]?query: a conditional reference or url, a search (a Bundle's links, a batch's GETs)
CONDITIONAL_RE = re.compile(r"^(?P<base>(?:https?://[^?#]*/)?)(?P<type>[A-Z][A-Za-z]+)(?P<search>/_search)?"
                            r"\?(?P<query>[^#]*)$")
# search result parameters: how many, which and in what order, never whose (fhir.org/R4/search.html)
RESULT_PARAMETERS = frozenset({"_count", "_sort", "_include", "_revinclude", "_summary", "_elements", "_total",
                               "_contained", "_containedType", "_format", "_pretty"})
TYPE_ONLY_RE = re.compile(r"^[A-Z][A-Za-z]+$")
OPERATION_RE = re.compile(r"^(?:[A-Z][A-Za-z]+/)?\$[A-Za-z\-]+$")


def rewrite(value: str, pseudo: Pseudonymizer) -> str | None:
    """Pseudonymize the resource id inside a reference, fullUrl or request url; None if it cannot be kept."""
    if value.startswith("urn:uuid:"):
        inner = value[len("urn:uuid:"):]
        if not UUID_RE.match(inner):
            return None
        return "urn:uuid:" + pseudo.resource_id(inner)
    if value.startswith("urn:oid:"):
        # OID arc 2.25 holds integers derived from UUIDs: the pseudonym stays a valid OID.
        return "urn:oid:2.25." + str(int(pseudo.token("oid", value[len("urn:oid:"):]), 16))
    if value.startswith("#"):
        return "#" + pseudo.resource_id(value[1:]) if len(value) > 1 else value
    if TYPE_ONLY_RE.match(value) or OPERATION_RE.match(value):  # "Patient" (a create), "ValueSet/$lookup"
        return value
    m = LITERAL_RE.match(value)
    if m:
        return f"{m['base']}{m['type']}/{pseudo.resource_id(m['id'])}{m['history'] or ''}"
    m = CONDITIONAL_RE.match(value)
    if m:
        # identifiers and ids pseudonymized, other criteria dropped; "Patient?" stays a valid (criteria-less) url
        return f"{m['base']}{m['type']}{m['search'] or ''}?{_rewrite_query(m['query'], pseudo)}"
    return None


def rewrite_query(query: str, pseudo: Pseudonymizer) -> str | None:
    """`ifNoneExist`: _rewrite_query, None when no criterion is left."""
    return _rewrite_query(query, pseudo) or None


def _rewrite_query(query: str, pseudo: Pseudonymizer) -> str:
    """The search parameters of a conditional or search url, each ruled as the element it searches is:
    identifier and _id values pseudonymized (as Identifier.value and Resource.id are), result parameters
    (_count, _sort, ...) kept, every other criterion (name, family, birthdate, address, phone, a chained or
    reverse-chained one, ...) dropped, its value with it."""
    kept = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name == "identifier" or name.startswith("identifier:"):
            system, sep, ident = value.rpartition("|")
            if not sep:
                system, ident = "", value
            kept.append(f"{name}={quote(system, safe=':/.-_')}|{pseudo.identifier(system, ident)}")
        elif name == "_id":
            kept.append("_id=" + ",".join(pseudo.resource_id(v) for v in value.split(",") if v))
        elif name in RESULT_PARAMETERS:
            kept.append(f"{name}={quote(value, safe=':,.-_')}")
    return "&".join(kept)


def original_ids(value: str, rtype: str | None = None) -> list[str]:
    """How the ids a reference, fullUrl or url holds (or, with `rtype`, a resource id) are written in text:
    the bare id where it is distinctive (8 or more characters with a digit: a uuid, a long number), which
    also finds it in `Type/id`; else `Type/id`, so that "example" or "23" are looked for only there.
    Conditional references give their identifier values."""
    if rtype is not None:
        rid = value
    elif value.startswith("urn:uuid:"):
        rtype, rid = None, value[len("urn:uuid:"):]
    elif m := LITERAL_RE.match(value):
        rtype, rid = m["type"], m["id"]
    elif m := CONDITIONAL_RE.match(value):
        return query_identifiers(m["query"])
    else:
        return []
    if len(rid) >= 8 and any(map(str.isdigit, rid)):
        return [rid]  # its every match in `Type/id` too
    return [f"{rtype}/{rid}"] if rtype else []


def query_identifiers(query: str) -> list[str]:
    """The identifier values of a conditional url's or ifNoneExist's criteria."""
    return [value.rpartition("|")[2] for name, value in parse_qsl(query, keep_blank_values=True)
            if (name == "identifier" or name.startswith("identifier:")) and value.rpartition("|")[2]]


def resource_id_of(reference: str) -> str | None:
    """The target id of a literal or urn:uuid reference (used to find a resource's patient)."""
    if reference.startswith("urn:uuid:"):
        return reference[len("urn:uuid:"):]
    m = LITERAL_RE.match(reference)
    return m["id"] if m else None


def target_types(doc: dict) -> dict[str, str]:
    """What the record's own resources are, by the ways a reference names them inside it: each Bundle
    entry's fullUrl (urn:uuid references resolve only through these) and each contained resource's `#id`."""
    found: dict[str, str] = {}
    _add_targets(doc, found)
    return found


def _add_targets(res, found: dict[str, str]) -> None:
    if not isinstance(res, dict) or not isinstance(res.get("resourceType"), str):
        return
    for contained in _listed(res.get("contained")):
        if isinstance(contained, dict) and isinstance(contained.get("id"), str):
            found[f"#{contained['id']}"] = str(contained.get("resourceType"))
        _add_targets(contained, found)
    if res["resourceType"] == "Bundle":
        for entry in _listed(res.get("entry")):
            inner = entry.get("resource") if isinstance(entry, dict) else None
            if isinstance(inner, dict) and isinstance(entry.get("fullUrl"), str):
                found[entry["fullUrl"]] = str(inner.get("resourceType"))
            _add_targets(inner, found)


def _listed(value) -> list | tuple:
    """A list as it is; any other value (before validation, `"entry": 1`) as no items: the walk reports it."""
    return value if isinstance(value, list) else ()


def target_type(reference, type_uri, targets: dict[str, str]) -> str | None:
    """The resource type a Reference points to: by its `reference` (a resource of the record, or the type
    a literal or conditional reference names), else by its `type`; None when neither tells."""
    if isinstance(reference, str):
        if reference in targets:
            return targets[reference]
        m = LITERAL_RE.match(reference) or CONDITIONAL_RE.match(reference)
        if m:
            return m["type"]
    if isinstance(type_uri, str) and type_uri:
        return type_uri.rsplit("/", 1)[-1]  # "Practitioner", or its StructureDefinition's canonical url
    return None
