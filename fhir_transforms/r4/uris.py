"""Kept URIs that hold a known identifier of the record: an identifier's `system` built from its value
(`urn:id:<MRN>`, `…/patients/<surname>`), a local code system named for a patient. The rules keep URIs as
they are (they name systems, not people), so the part of one that is a known identifier is replaced by a
keyed pseudonym once the record's known identifiers are all collected, before the leak guard reads it."""
from __future__ import annotations

from typing import Iterator

from fhir_transforms.known import is_identifier_shaped
from fhir_transforms.r4.schema import elements, is_resource_type
from fhir_transforms.rules import Profile
from text_deid.detectors.known_identifiers import find_known_many
from text_deid.spans import KnownIdentifier

URI_TYPES = frozenset({"uri", "url", "canonical"})
NOT_READ = frozenset({"Extension.url"})  # an extension's url names its definition (the allow-list read it)
IDENTIFIER_SYSTEM = "Identifier.system"


def pseudonymize_uris(ctx, known: tuple[KnownIdentifier, ...]) -> None:
    """Replace each known identifier in the kept URIs of the resources walked by a keyed pseudonym: in an
    Identifier.system any of them (the system of an identifier is made of its value); in any other URI (a code
    system, a canonical url) only an identifier-shaped one that is not a resource id of the record (a canonical
    url ends with the id of the Questionnaire it names, which is no person's identifier). Each rewritten URI is
    the engine's own."""
    if not known:
        return
    found = [place for res, state in ctx.walked
             for place in _uris_in(res, res.get("resourceType"), True, state, ctx.profile, ctx.generated.by_id)]
    if not found:
        return
    shaped = tuple(k for k in known if is_identifier_shaped(k) and k.value not in ctx.resource_ids)
    for of_identifier, batch in ((True, known), (False, shaped)):
        places = [place for place in found if place[0] is of_identifier]
        if not places or not batch:
            continue
        for (_, container, slot, text, state), spans in zip(places, find_known_many([p[3] for p in places], batch,
                                                                                     "uri")):
            if spans:
                container[slot] = _with_pseudonyms(text, spans, ctx.pseudo)
                ctx.generated.add(container, slot)
                state.labels.add("PSEUDED")


def _with_pseudonyms(text: str, spans: list, pseudo) -> str:
    out, end = [], 0
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if span.start >= end:
            out += [text[end:span.start], pseudo.token("uri", text[span.start:span.end], 16)]
            end = span.end
    return "".join(out) + text[end:]


def _uris_in(node: dict, type_name, is_resource: bool, state, profile: Profile, written: dict) -> Iterator[tuple]:
    """(in an Identifier.system, container, key, value, the resource's state) for each URI string of one resource
    (not of the resources it holds: they are walked on their own) that the engine did not write."""
    version = profile.fhir_version
    if not isinstance(type_name, str) or (is_resource and not is_resource_type(type_name, version)):
        return
    try:
        table = elements(type_name, version)
    except ValueError:
        return
    own = written.get(id(node), ())
    for key, value in node.items():
        el = table.get(key)
        if el is None or el.type == "Resource":
            continue
        if type(value) is str:
            if el.type in URI_TYPES and key not in own and f"{type_name}.{el.name}" not in NOT_READ:
                yield f"{type_name}.{el.name}" == IDENTIFIER_SYSTEM, node, key, value, state
            continue
        for item in (value if type(value) is list else [value]):
            if type(item) is dict:
                yield from _uris_in(item, el.type, False, state, profile, written)
