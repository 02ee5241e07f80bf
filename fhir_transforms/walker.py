"""Walk a FHIR resource with its element types and apply the profile's rules.

The walker finds a rule for each element (fhir_transforms/rules.py) and calls the method of that name
(fhir_transforms/methods.py). Text is not replaced here: `text` methods hand back TextRefs that the
record engine sends through the text stack in one batch, then writes back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Callable

from fhir_transforms import references
from fhir_transforms.errors import InputError, RecordRefused
from fhir_transforms.methods import METHODS, REMOVE, TextRef
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.rules import Profile, Rule
from fhir_transforms.known import FULL_DATE_RE
from fhir_transforms.schema import PRIMITIVES, Element, elements, is_resource_type
from text_deid.spans import KnownIdentifier

PRIMITIVE_TYPES = frozenset(PRIMITIVES.values()) | {"boolean"}
NUMBER_TYPES = frozenset({"integer", "positiveInt", "unsignedInt", "decimal"})
SECURITY_SYSTEM = "http://terminology.hl7.org/CodeSystem/v3-ObservationValue"
KEY_TAG_SYSTEM = "http://deid-adapter.org/fhir/CodeSystem/key-id"
PROFILE_TAG_SYSTEM = "http://deid-adapter.org/fhir/CodeSystem/deid-profile"
PATIENT_LINKS = ("subject", "patient", "beneficiary")


@dataclass
class PendingText:
    ref: TextRef
    write: Callable[[object], None]
    path: str
    labels: set[str]  # the owning resource's security labels: MASKED is added if a span is replaced


@dataclass
class RecordContext:
    """What one record's walk shares: profile, keys, clock, and what it has found so far."""

    profile: Profile
    pseudo: Pseudonymizer
    clock: Callable[[], date]
    single_patient: str | None = None
    pending: list[PendingText] = field(default_factory=list)
    generated: set[str] = field(default_factory=set)  # JSON paths of values the engine wrote itself
    known: set = field(default_factory=set)  # KnownIdentifiers found by the rule methods
    walked: list = field(default_factory=list)  # (resource, ResourceState, path), stamped once text is replaced


@dataclass
class ResourceState:
    type: str
    patient_id: str
    labels: set[str]


@dataclass
class Site:
    """Where a method is applied: the element, its owner and parent node, its path, and the record context."""

    ctx: RecordContext
    res: ResourceState
    parent: dict
    owner: str
    element: Element
    path: str  # JSON path, e.g. Bundle.entry[3].resource.birthDate
    fpath: str  # FHIR path without indices, e.g. Patient.birthDate
    pending_extensions: list = field(default_factory=list)
    options: dict = field(default_factory=dict)  # the rule's settings beyond its method

    @property
    def pseudo(self) -> Pseudonymizer:
        return self.ctx.pseudo

    def clock(self) -> date:
        return self.ctx.clock()

    def label(self, code: str) -> None:
        self.res.labels.add(code)

    def record_known(self, value, category: str) -> None:
        """A value the rules transform is a known identifier: it must not survive in any text."""
        if isinstance(value, str) and len(value.strip()) >= 2:
            if category == "DATE":
                if not FULL_DATE_RE.match(value):
                    return
                value = value[:10]
            self.ctx.known.add(KnownIdentifier(value, category))

    def generated(self) -> None:
        self.ctx.generated.add(self.path)

    def day_offset(self) -> int:
        return self.ctx.pseudo.day_offset(self.res.patient_id)

    def removes_identifier(self) -> bool:
        p = self.ctx.profile
        if self.parent.get("system") in p.identifier_remove_systems:
            return True
        codes = {c.get("code") for c in (self.parent.get("type") or {}).get("coding", []) or []}
        return bool(codes & p.identifier_remove_types)

    def add_primitive_extensions(self, extensions: list[dict]) -> None:
        self.pending_extensions.extend(extensions)

    def apply_type_rule(self, value):
        rule = self.ctx.profile.rules.get(self.element.type) or self.ctx.profile.default_primitive
        return METHODS[rule.method](value, self)

    def walk_into(self, node: dict):
        _walk_complex(node, _plan(self.ctx.profile, self.element.type, self.fpath, False), self.path, self.ctx, self.res)
        return node


def walk_resource(res: dict, path: str, ctx: RecordContext) -> None:
    """Apply the profile to one resource (and, through the walk, to its contained and entry resources)."""
    rtype = res.get("resourceType")
    if not isinstance(rtype, str) or not is_resource_type(rtype):
        raise InputError(f"{path}: resourceType is missing or not an R4 resource type known to the R4B models")
    state = ResourceState(rtype, _patient_of(res, ctx), set())
    _walk_complex(res, _plan(ctx.profile, rtype, rtype, True), path, ctx, state)
    ctx.walked.append((res, state, path))


def stamp_all(ctx: RecordContext) -> None:
    """After text replacement: label every walked resource with what was changed in it."""
    for res, state, path in ctx.walked:
        _stamp(res, state, ctx, path)


def _patient_of(res: dict, ctx: RecordContext) -> str:
    """The patient whose date offset applies: the Patient itself, its subject/patient link, or the record's only patient."""
    if res.get("resourceType") == "Patient" and res.get("id"):
        return res["id"]
    for name in PATIENT_LINKS:
        link = res.get(name)
        if isinstance(link, dict) and isinstance(link.get("reference"), str):
            target = references.resource_id_of(link["reference"])
            if target:
                return target
    return ctx.single_patient or ""


@dataclass(frozen=True)
class _Step:
    """What the walker does with one JSON key of one element path, worked out once per profile."""

    owner: str  # the type that holds the element
    element: Element
    rule: Rule | None
    fpath: str
    kept_as: tuple[type, ...] = ()  # a primitive the rules keep unchanged: the JSON types it may have
    walk_into: bool = False  # a complex datatype without a rule of its own (extensions excepted: allow-list)


JSON_TYPES = {"boolean": (bool,), **{t: (int, float) for t in NUMBER_TYPES}}


def _plan(profile: Profile, type_name: str, fpath: str, is_resource: bool) -> dict[str, _Step]:
    """JSON key → step for an element of `type_name` at `fpath` (cached on the profile)."""
    cache_key = (type_name, fpath, is_resource)
    plan = profile.plans.get(cache_key)
    if plan is None:
        plan = {}
        for key, el in elements(type_name).items():
            sub_fpath = f"{fpath}.{el.name}"
            rule = profile.lookup(sub_fpath, type_name, is_resource, el.name, el.type)
            kept = el.type in PRIMITIVE_TYPES and (rule or profile.default_primitive).method == "keep"
            walk_into = rule is None and el.type not in PRIMITIVE_TYPES and el.type not in ("Resource", "Extension")
            plan[key] = _Step(type_name, el, rule, sub_fpath, JSON_TYPES.get(el.type, (str,)) if kept else (), walk_into)
        profile.plans[cache_key] = plan
    return plan


def _walk_complex(node: dict, plan: dict[str, _Step], path: str, ctx: RecordContext, state: ResourceState) -> None:
    for key in list(node):
        step = plan.get(key)
        if step is None:
            if key != "resourceType":  # unknown element: only reachable without validation; never passed through
                del node[key]
                state.labels.add("REDACTED")
            continue
        value = node[key]
        if step.kept_as and _keeps(value, step):
            continue  # most primitives (codes, units, values) stay as they are: nothing to rewrite
        if step.walk_into and type(value) is dict and not step.element.is_list:  # the commonest complex case
            _walk_complex(value, _plan(ctx.profile, step.element.type, step.fpath, False), f"{path}.{key}", ctx, state)
            if not value:
                del node[key]
            continue
        _walk_values(node, key, step, path, ctx, state)


def _keeps(value, step: _Step) -> bool:
    """A kept primitive in the JSON shape FHIR gives it (anything else takes the general path and its checks)."""
    if step.element.is_list:
        return type(value) is list and bool(value) and all(v is None or type(v) in step.kept_as for v in value)
    return type(value) in step.kept_as


def _walk_values(node: dict, key: str, step: _Step, path: str, ctx: RecordContext, state: ResourceState) -> None:
    el, profile = step.element, ctx.profile
    sub_path = f"{path}.{key}"
    values = node[key] if isinstance(node[key], list) else [node[key]]
    if key == "modifierExtension":
        _check_modifiers(values, profile, sub_path)
    if el.type == "Extension":
        allowed = [v for v in values if isinstance(v, dict) and v.get("url") in profile.extension_allow]
        if len(allowed) != len(values):
            state.labels.add("REDACTED")
        values = allowed
    out: list = []
    for value in values:
        # the index it will have in the output (generated-value paths must match the output the guard reads)
        item_path = f"{sub_path}[{len(out)}]" if el.is_list else sub_path
        if step.walk_into and type(value) is dict:  # a datatype no rule names: only its elements have rules
            _walk_complex(value, _plan(profile, el.type, step.fpath, False), item_path, ctx, state)
            result = value
        else:
            site = Site(ctx, state, node, step.owner, el, item_path, step.fpath)
            result = _apply(value, step.rule, site)
            if site.pending_extensions:
                _add_extensions(node, "_" + key, site.pending_extensions)
        if result is REMOVE or result == {}:  # an element left empty by the rules is dropped
            continue
        if isinstance(result, TextRef):
            index = len(out)
            out.append(value)
            ctx.pending.append(PendingText(result, _writer(node, key, out, index, el.is_list), item_path, state.labels))
        else:
            out.append(result)
    if out:
        node[key] = out if el.is_list else out[0]
    else:
        del node[key]


def _apply(value, rule: Rule | None, site: Site):
    el = site.element
    if value is None:
        if not el.is_list:
            raise InputError(f"{site.path}: null is not a FHIR value")
        return None  # a null in a list only aligns primitive extensions (`_given: [null, {...}]`)
    if not _has_json_shape(value, el.type):
        # only reachable without validation: a wrong JSON shape is bad input, never passed through
        raise InputError(f"{site.path}: expected {'a value' if el.type in PRIMITIVE_TYPES else 'an object'} of type {el.type}")
    if rule is not None:
        site.options = rule.options
        try:
            return METHODS[rule.method](value, site)
        except ValueError as e:  # e.g. a malformed date; messages never quote the value
            if isinstance(e, InputError):
                raise
            raise InputError(f"{site.path}: {e}") from None
    if el.type == "Resource":
        if not isinstance(value, dict):
            raise InputError(f"{site.path}: a resource must be a JSON object")
        walk_resource(value, site.path, site.ctx)
        return value
    if isinstance(value, dict):
        _walk_complex(value, _plan(site.ctx.profile, el.type, site.fpath, False), site.path, site.ctx, site.res)
        return value
    return METHODS[site.ctx.profile.default_primitive.method](value, site)


def _has_json_shape(value, type_name: str) -> bool:
    """The JSON type FHIR's JSON format gives each kind of element."""
    if type_name not in PRIMITIVE_TYPES:
        return isinstance(value, dict)
    if type_name == "boolean":
        return isinstance(value, bool)
    if type_name in NUMBER_TYPES:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def _writer(node: dict, key: str, out: list, index: int, is_list: bool) -> Callable[[object], None]:
    def write(new_value) -> None:
        if is_list:
            out[index] = new_value
        else:
            node[key] = new_value
    return write


def _check_modifiers(values: list, profile: Profile, path: str) -> None:
    for v in values:
        url = v.get("url") if isinstance(v, dict) else None
        if url not in profile.modifier_extension_allow:
            raise RecordRefused(f"{path}: unknown modifierExtension (its meaning cannot be kept); add it to the profile's allow-list")


def _add_extensions(node: dict, key: str, extensions: list[dict]) -> None:
    holder = node.setdefault(key, {})
    holder.setdefault("extension", []).extend(extensions)


def _stamp(res: dict, state: ResourceState, ctx: RecordContext, path: str) -> None:
    """meta.security labels for what was changed, and tags naming the key id and profile.

    The codes the engine adds are marked generated: a patient named "Masked" or "Harbor" is not a leak there."""
    meta = res.setdefault("meta", {})
    security = meta.setdefault("security", [])
    present = {(c.get("system"), c.get("code")) for c in security}
    for code in sorted(state.labels):
        if (SECURITY_SYSTEM, code) not in present:
            ctx.generated.add(f"{path}.meta.security[{len(security)}].code")
            security.append({"system": SECURITY_SYSTEM, "code": code})
    if not security:
        del meta["security"]
    tags = meta.setdefault("tag", [])
    for system, code in ((KEY_TAG_SYSTEM, ctx.pseudo.key_id),
                         (PROFILE_TAG_SYSTEM, f"{ctx.profile.name}@{ctx.profile.version}")):
        ctx.generated.add(f"{path}.meta.tag[{len(tags)}].code")
        tags.append({"system": system, "code": code})
