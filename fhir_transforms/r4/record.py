"""De-identify one FHIR record (a Bundle or a resource): the one flow every entry point uses.

parse → known identifiers → rules → text stack → leak guard → (validated) output.
"""
from __future__ import annotations

import base64
import marshal
from dataclasses import dataclass, field
from datetime import date
from typing import Callable, Iterable, Iterator, Mapping

from fhir_transforms import dates, known as known_ids
from fhir_transforms.known import is_identifier_shaped
from fhir_transforms.r4 import rendered, versions
from fhir_transforms.r4.entries import remove_entries
from fhir_transforms.errors import DetectorFailed, InputError, LeakFound, OutputInvalid
from fhir_transforms.r4.methods import TEXT_CONTENT_TYPES, keeps_what_was_found
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.rules import Profile
from fhir_transforms.r4.schema import elements, is_resource_type, known_keys, model_class
from fhir_transforms.r4.shapes import R4_ONLY
from fhir_transforms.r4.uris import URI_TYPES, pseudonymize_uris
from fhir_transforms.r4.walker import RecordContext, WrittenSlots, age_limit, path_text, stamp_all, walk_record
from text_deid import leak_guard, replace
from text_deid.detectors.release import ReleaseMatcher
from text_deid.spans import DetectorError, KnownIdentifier, Span
from text_deid.stack import TextStack, known_identifiers_only

R4_ONLY_PLACEHOLDER = {"resourceType": "Basic", "code": {"text": "an R4 resource type the R4B models lack"}}
SKIP_KEYS = {"resourceType"}  # structure, not content
XHTML_NAMESPACE = "http://www.w3.org/1999/xhtml"
READ_APART = SKIP_KEYS | {"div", "data"}  # the keys whose strings the guard skips, or reads as rendered (XHTML, text attachments)


@dataclass(frozen=True)
class Finding:
    """Where the text stack found PHI: the JSON path of the text, and the span (offsets, category, detector)."""

    path: str
    span: Span


@dataclass
class RecordResult:
    resource: dict
    findings: list[Finding] = field(default_factory=list)
    texts: int = 0
    detector_seconds: dict[str, float] = field(default_factory=dict)
    known: tuple[KnownIdentifier, ...] = ()  # what the record's text and leak guard were checked against

    @property
    def spans_by_category(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.span.category] = counts.get(f.span.category, 0) + 1
        return counts


@dataclass
class Deidentifier:
    """Everything a record needs: profile, pseudonyms, text stack, clock, and whether to validate."""

    profile: Profile
    pseudo: Pseudonymizer
    stack: TextStack
    clock: Callable[[], date] = dates.today
    validate: bool = True
    terms: TextStack = field(default_factory=known_identifiers_only)  # what kept coded text is searched with
    fhir_version: str = versions.DEFAULT  # r4, r5, or auto: each record's own markers (fhir_transforms/r4/versions.py)
    release: ReleaseMatcher | None = None  # the known identifiers of every patient of a bulk release

    def deidentify(self, resource: dict, path: str = "", linked: Iterable[KnownIdentifier] = (), *,
                   consume: bool = False, linked_age_limits: Mapping[str, int] | None = None,
                   fhir_version: str | None = None) -> RecordResult:
        """The de-identified copy of `resource`, or InputError / RecordRefused; never a partial result.

        `linked`: known identifiers of people the record points at but does not hold (a bulk export's
        Patient, read from another file), masked in its text and checked by the leak guard like its own.
        `linked_age_limits`: for patients the record points at but does not hold, aged 90 or more, the year each
        turned 90 (patient id → year): their dates in this record follow the 90+ rule as if the Patient were here.
        `consume`: `resource` comes straight from json.loads (so it holds only JSON's own types, and no
        object twice) and the caller gives it up: it is de-identified in place instead of copied, and
        whatever the outcome, only its resourceType may be read afterwards.
        `fhir_version`: this record's version (r4, r5 or auto) instead of the engine's.
        """
        if not isinstance(resource, dict):
            raise InputError(f"{path or 'input'}: a FHIR resource must be a JSON object")
        rtype = resource.get("resourceType")
        path = path or str(rtype)
        version = fhir_version or self.fhir_version
        if version == versions.AUTO:
            version = versions.detect(versions.resources_of(resource), path)
        profile = self.profile.for_version(version)
        if self.validate:
            validate(resource, path, version)
        doc = resource if consume else _copy(resource)
        record_key = f"{rtype}/{doc.get('id') or path}"
        changed = remove_entries(doc, profile.remove_entries)
        members = list(iter_resources(doc))
        patients = [r.get("id") for r in members if r.get("resourceType") == "Patient" and r.get("id")]
        ctx = RecordContext(profile, self.pseudo, self.clock, patients[0] if len(patients) == 1 else None,
                            record_key=record_key)
        today = self.clock()
        ctx.age_limits.update(linked_age_limits or {})
        for r in members:
            if r.get("resourceType") == "Patient" and (limit := age_limit(r.get("birthDate"), today)) is not None:
                ctx.age_limits[r.get("id") or ""] = limit
        ctx.known.update(known_ids.collect(members))
        ctx.thing_names = known_ids.thing_names(members)
        ctx.add_people(*known_ids.collect_staff(members))
        ctx.known.update(linked)
        walk_record(doc, path, ctx)
        for res, state in ctx.walked:  # entries removed by the entry rules, and references to them
            if id(res) in changed:
                state.labels.add("REDACTED")
        # sorted by (value, category) as the dataclass orders them, without its generated __lt__
        if self.release is not None:  # another patient's name in this record's text is still a name
            ctx.known.update(self.release.known_in([t for p in ctx.pending for t in p.ref.texts] + list(ctx.terms)))
        known = tuple(sorted((k for k in ctx.known if len(k.value.strip()) >= 2), key=_known_order))

        findings, ntexts, timings = self.replace_texts(ctx, known, path)
        stamp_all(ctx)
        guard(doc, ctx, known, path, profile)
        if self.validate:
            try:
                validate(doc, path, version)
            except InputError as e:
                raise OutputInvalid(f"output failed validation (a bug; nothing written): {e}") from None
        return RecordResult(doc, findings, ntexts, timings, known)

    def replace_texts(self, ctx: RecordContext, known: tuple[KnownIdentifier, ...], path: str
                      ) -> tuple[list[Finding], int, dict[str, float]]:
        """Send the walk's pending texts through the text stack, and its terms (kept coded text) through `terms`,
        and write them back: (findings, texts read, detector seconds)."""
        texts = [text for p in ctx.pending for text in p.ref.texts]
        terms = list(ctx.terms)
        timings: dict[str, float] = {}
        try:
            spans = self.stack.detect_many(texts, known, timings)
            term_spans = self.terms.detect_many(terms, known) if terms else []
            personal = _personal_spans(terms, term_spans, known, ctx.staff_only())
        except DetectorError as e:
            raise DetectorFailed(f"{path}: text detector failed: {e}") from None
        findings: list[Finding] = []
        i = 0
        for pending in ctx.pending:
            ref = pending.ref
            found_in = spans[i:i + len(ref.texts)]
            i += len(ref.texts)
            if ref.build is None and not found_in[0]:  # one text, nothing found (most): it stays as written
                continue
            for found in found_in:
                findings.extend(Finding(pending.path, s) for s in found)
                if found:
                    pending.labels.add("MASKED")
            if ref.build is not None:
                pending.container[pending.slot] = ref.build(found_in)
            else:
                pending.container[pending.slot] = replace.apply(ref.texts[0], found_in[0])
        for term, found in zip(terms, term_spans):
            if not found:  # (most): every occurrence stays as written
                continue
            if term in personal:  # a member of staff's word stays, and the guard lets it be
                found = personal[term]
                for container, slot, _, _ in ctx.terms[term]:
                    ctx.generated.add(container, slot)
                if not found:
                    continue
            kept = keeps_what_was_found(term, found)
            for container, slot, at, labels in ctx.terms[term]:
                findings.extend(Finding(path_text(at), s) for s in found)
                if kept:
                    ctx.generated.add(container, slot)
                else:
                    labels.add("MASKED")
                    container[slot] = replace.apply(term, found)
        pseudonymize_uris(ctx, known)
        return findings, len(texts) + sum(map(len, ctx.terms.values())), timings


def _personal_spans(terms: list[str], found: list[list], known: tuple[KnownIdentifier, ...],
                    staff_only: frozenset) -> dict[str, list]:
    """For each term in which a word that only a member of staff's name holds was found ("Reason for lab test"
    beside a provider named TEST), its spans without that word (known_ids.without_staff_words)."""
    if not staff_only or not any(found):
        return {}
    personal_words = known_ids.words_of_names(k for k in known if k not in staff_only)
    kept = {}
    for term, spans in zip(terms, found):
        if spans and len(left := known_ids.without_staff_words(term, spans, personal_words)) != len(spans):
            kept[term] = left
    return kept


def guard(doc: dict, ctx: RecordContext, known: tuple[KnownIdentifier, ...], path: str, profile: Profile,
          where: Callable[[dict, str], tuple[dict, str]] | None = None) -> None:
    """The leak guard: LeakFound when a known identifier survived in the output's text. Most records hold no
    surviving identifier: the output's distinct texts are searched first, and their paths worked out only when
    something is found. `where`: the document and path to read paths from (a Bundle entry: its Bundle's)."""
    if leak_guard.clean(output_texts(doc, ctx.generated), known):
        return
    at, at_path = where(doc, path) if where else (doc, path)
    strings = output_strings(at, ctx.generated, at_path)
    kept = kept_by_design(at, at_path, profile)
    leaks = leak_guard.scan(_unless_kept(strings, kept), known)
    if kept:  # kept by design: a coincidence of words is no leak there, an identifier-shaped value is
        shaped = tuple(k for k in known if is_identifier_shaped(k))
        not_ids = tuple(k for k in shaped if k.value not in ctx.resource_ids)  # a canonical url ends with an id
        for kind, among in (("kept", shaped), ("uri", not_ids)):
            if among:
                leaks += leak_guard.scan([(p, text) for p, text in strings if kept.get(p) == kind], among)
    if leaks:
        shown = "; ".join(str(leak) for leak in leaks[:5])
        raise LeakFound(f"{path}: leak guard refused the output: {len(leaks)} known identifier(s) survived: {shown}")


def _known_order(k: KnownIdentifier) -> tuple[str, str]:
    return k.value, k.category


def _copy(resource: dict) -> dict:
    """A deep copy of JSON data, many times faster than copy.deepcopy. Marshal format 2 keeps no object
    references, so a sub-object the caller shared between two places becomes two objects, as with JSON."""
    try:
        return marshal.loads(marshal.dumps(resource, 2))
    except ValueError:
        raise InputError("input: a FHIR resource must hold only JSON values") from None


def validate(resource: dict, path: str, version: str = versions.DEFAULT) -> None:
    """Validate against the version's models (R4: R4B's); the message names locations and error types, never values.

    The R4 types R4B dropped have no model (fhir_transforms/r4/shapes.py): a Bundle's entries of those
    types are held by a placeholder while the Bundle is checked."""
    rtype = resource.get("resourceType")
    if version == "r4" and known_ids.is_one_of(rtype, R4_ONLY):
        return
    entries = resource.get("entry")
    if version == "r4" and rtype == "Bundle" and isinstance(entries, list) and any(_is_r4_only(e) for e in entries):
        resource = {**resource, "entry": [{**e, "resource": R4_ONLY_PLACEHOLDER} if _is_r4_only(e) else e
                                          for e in resource["entry"]]}
    from pydantic import ValidationError  # pydantic loads with the first validation, not before

    name = version.upper()
    apart: list[tuple[str, object]] = []
    if _holds_value_extensions(resource):
        resource = _copy(resource)
        _take_value_extensions(resource, "", apart)
    try:
        model_class(rtype, version).model_validate(resource)
        for where, held in apart:  # each an Element: its id and extensions
            model_class("FHIRPrimitiveExtension", version).model_validate(held)
    except (KeyError, ValueError, TypeError, AttributeError) as e:  # (fhir.resources: AttributeError on `_birthDate: "7"`)
        hint = _other_version_hint(resource, version)
        if isinstance(e, ValidationError) and e.title == "FHIRPrimitiveExtension":
            where = f"{_loc_text(where.split('.'))}: " + "; ".join(
                f"{_loc_text(err['loc'])}: {err['type']}" for err in e.errors(include_input=False)[:5])
            raise InputError(f"{path}: not a valid FHIR {name} {rtype}: {where}") from None
        if isinstance(e, ValidationError):
            where = "; ".join(
                f"{_loc_text(err['loc'])}: {err['type']}" for err in e.errors(include_input=False)[:5]
            )
            raise InputError(f"{path}: not a valid FHIR {name} {rtype}: {where}{hint}") from None
        if isinstance(e, AttributeError):  # the models' own validators met a value of the wrong JSON shape
            raise InputError(f"{path}: not a valid FHIR {name} {rtype}: an element has the wrong JSON shape{hint}") from None
        models = {"r4": "R4B models", "r5": "R5 models", "stu3": "STU3 models"}[version]
        said = f"resourceType {rtype}" if isinstance(rtype, str) and any(
            is_resource_type(rtype, v) for v in versions.FHIR_VERSIONS) else \
            "a resourceType no FHIR version has"  # what a record says is repeated only where FHIR names it
        raise InputError(f"{path}: not a FHIR {name} resource the {models} know ({said}){hint}") from None


def _loc_text(loc) -> str:
    """A validation error's place: list positions and the element names the models know; a key they do not
    know is not repeated (a sender's key may be anything, a name included)."""
    return ".".join(str(p) if isinstance(p, int) or p.isdigit() or p in known_keys()
                    or p.lstrip("_") in known_keys() else "(unknown key)" for p in loc if p != "")


def _holds_value_extensions(node) -> bool:
    """Whether an extension holds a primitive extension of its value (`_valueInstant`): valid FHIR JSON that
    fhir.resources' Extension models have no field for."""
    if type(node) is dict:
        if "url" in node and any(type(k) is str and k.startswith("_value") for k in node):
            return True
        return any(_holds_value_extensions(v) for v in node.values() if type(v) in (dict, list))
    return type(node) is list and any(_holds_value_extensions(v) for v in node if type(v) in (dict, list))


def _take_value_extensions(node, path: str, apart: list) -> None:
    """Take every extension's `_value[x]` out of `node` (a copy) into `apart`, as (path, its Element), to be
    validated on their own."""
    if type(node) is dict:
        for key in [k for k in node if "url" in node and type(k) is str and k.startswith("_value")]:
            apart.append((f"{path}.{key}".lstrip("."), node.pop(key)))
        for key, value in node.items():
            if type(value) in (dict, list):
                _take_value_extensions(value, f"{path}.{key}", apart)
    elif type(node) is list:
        for i, value in enumerate(node):
            _take_value_extensions(value, f"{path}.{i}", apart)


def _other_version_hint(resource: dict, version: str) -> str:
    """When a record invalid in one version is valid in another: say so, and how to read it that way."""
    for other in (v for v in versions.FHIR_VERSIONS if v != version):
        try:
            model_class(resource.get("resourceType"), other).model_validate(resource)
        except (KeyError, ValueError, TypeError, AttributeError):
            continue
        return f" (it is valid FHIR {other.upper()}: read it with --fhir-version {other})"
    return ""


def _is_r4_only(entry) -> bool:
    resource = entry.get("resource") if isinstance(entry, dict) else None
    return isinstance(resource, dict) and known_ids.is_one_of(resource.get("resourceType"), R4_ONLY)


def iter_resources(doc: dict) -> Iterator[dict]:
    """A resource, its contained resources, and for a Bundle every entry's resource (recursively). Without
    validation any JSON value may stand where a list should (`"entry": 1`): the walk reports it as bad input."""
    return versions.resources_of(doc)


def output_strings(node, generated: WrittenSlots, path: str) -> list[tuple[str, str]]:
    """Every string of the output the leak guard must read, with its path: XHTML as text, text attachments
    decoded; the values the engine wrote itself are not read."""
    found: list[tuple[str, str]] = []
    _collect_strings(node, generated.by_id, path, found)
    return found


def kept_by_design(doc: dict, path: str, profile: Profile) -> dict[str, str]:
    """The JSON paths of the output's strings that the rules kept by design, each with its kind (`uri` for a
    URI, else `kept`): an element or datatype the profile lists under leak_guard.kept_by_design (Coding.display,
    Address.state, uri, ...) whose rule at that place is `keep`, so that its value is the input's, unchanged."""
    found: dict[str, str] = {}
    if profile.kept_by_design:
        rtype = doc.get("resourceType")
        _find_kept(doc, rtype, rtype, True, path, profile, found)
    return found


def _find_kept(node: dict, type_name, fpath: str, is_resource: bool, path: str, profile: Profile, found: set) -> None:
    version = profile.fhir_version
    for key, value in node.items():
        el = elements(type_name, version).get(key) if is_resource_type(type_name, version) or not is_resource else None
        if el is None:
            continue
        items = value if type(value) is list else [value]
        for i, item in enumerate(items):
            item_path = f"{path}.{key}[{i}]" if type(value) is list else f"{path}.{key}"
            if type(item) is dict and el.type == "Resource":
                rtype = item.get("resourceType")
                _find_kept(item, rtype, str(rtype), True, item_path, profile, found)
            elif type(item) is dict:
                _find_kept(item, el.type, f"{fpath}.{el.name}", False, item_path, profile, found)
            elif type(item) is str and (f"{type_name}.{el.name}" in profile.kept_by_design
                                        or el.type in profile.kept_by_design):
                rule = profile.lookup(f"{fpath}.{el.name}", type_name, is_resource, el.name, el.type)
                if (rule or profile.default_primitive).method == "keep" and (rule is None or rule.test is None):
                    found[item_path] = "uri" if el.type in URI_TYPES else "kept"  # (a conditional keep may not have kept it)


def _unless_kept(strings: list[tuple[str, str]], kept: dict[str, str]) -> list[tuple[str, str]]:
    return [(p, text) for p, text in strings if p not in kept] if kept else strings


def output_texts(node, generated: WrittenSlots) -> list[str]:
    """The distinct texts of `output_strings`, in the same order, without their paths."""
    found: dict[str, None] = {}
    _collect_texts(node, generated.by_id, found)
    return list(found)


def _is_text(node: dict) -> bool:
    return str(node.get("contentType", "")).lower().startswith(TEXT_CONTENT_TYPES)


def _read_as_rendered(key: str, value: str, node: dict) -> list[str]:
    """A div or text attachment as the text stack read it (markup joined or broken as rendered, references
    decoded, attribute values apart), undecodable references as written; and the attachment as written."""
    if key == "div":  # less the namespace every div declares, the spec's constant ("www", "http" are no leak in it)
        return rendered.texts([p for p in rendered.markup_pieces(value, xml=False, strict=False)
                               if p.text != XHTML_NAMESPACE])
    decoded = base64.b64decode(value).decode("utf-8", "replace")
    return [decoded, *rendered.texts(rendered.content_pieces(str(node.get("contentType", "")), decoded, strict=False))]


def _collect_strings(node, written_in: dict[int, set], path: str, found: list) -> None:
    # a plain recursive walk (no generators): it visits every value of every record
    is_dict = type(node) is dict
    written = written_in.get(id(node), ())
    items = node.items() if is_dict else enumerate(node)
    for k, v in items:
        t = type(v)
        if t is dict or t is list:
            if k not in written:  # (a written one: a label or tag the engine made whole)
                _collect_strings(v, written_in, f"{path}.{k}" if is_dict else f"{path}[{k}]", found)
        elif t is str:
            if is_dict and k in READ_APART:
                if k in SKIP_KEYS:
                    continue
                if k == "div" or _is_text(node):
                    found.extend((f"{path}.{k}", text) for text in _read_as_rendered(k, v, node))
                    continue
            if k not in written:
                found.append((f"{path}.{k}" if is_dict else f"{path}[{k}]", v))


def _collect_texts(node: dict, written_in: dict[int, set], found: dict) -> None:
    # _collect_strings without paths: this one runs on every record, _collect_strings only where it finds something
    written = written_in.get(id(node))
    for k, v in node.items():
        t = type(v)
        if t is str:
            if k in READ_APART:  # (one set lookup for the few keys read apart)
                if k in SKIP_KEYS:
                    continue
                if k == "div" or _is_text(node):
                    found.update(dict.fromkeys(_read_as_rendered(k, v, node)))
                    continue
            if written is None or k not in written:
                found[v] = None
        elif written is not None and k in written:
            continue  # an object or list the engine made whole (a security label, a tag)
        elif t is dict:
            _collect_texts(v, written_in, found)
        elif t is list:
            _collect_items(v, written_in, found)


def _collect_items(items: list, written_in: dict[int, set], found: dict) -> None:
    written = written_in.get(id(items))
    for i, v in enumerate(items):
        t = type(v)
        if t is str:
            if written is None or i not in written:
                found[v] = None
        elif written is not None and i in written:
            continue
        elif t is dict:
            _collect_texts(v, written_in, found)
        elif t is list:
            _collect_items(v, written_in, found)
