"""Walk a FHIR resource with its element types and apply the profile's rules.

The walker finds a rule for each element (fhir_transforms/rules.py) and calls the method of that name
(fhir_transforms/r4/methods.py). Text is not replaced here: `text` methods hand back TextRefs that the
record engine sends through the text stack in one batch, then writes back.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from types import MappingProxyType
from typing import Callable, Mapping

from fhir_transforms import dates, safe_harbor_gaps
from fhir_transforms.r4 import references
from fhir_transforms.errors import InputError, UnknownModifier
from fhir_transforms.r4.methods import BY_PATIENT, BY_VALUE, DATA_ABSENT, METHODS, REMOVE, TextRef, reused_by
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.rules import Profile, Rule
from fhir_transforms.known import (FULL_DATE_RE, STAFF_TYPES, THING_TYPES, identifier_category, is_one_of, names_a_thing,
                                   type_codes)
from fhir_transforms.r4.schema import PRIMITIVES, Element, declared_targets, elements, is_resource_type
from fhir_transforms.r4.shapes import R4_ONLY, datatype_of, primitive_of
from text_deid.spans import KnownIdentifier

PRIMITIVE_TYPES = frozenset(PRIMITIVES.values()) | {"boolean"}
NUMBER_TYPES = frozenset({"integer", "positiveInt", "unsignedInt", "decimal"})
SECURITY_SYSTEM = "http://terminology.hl7.org/CodeSystem/v3-ObservationValue"
KEY_TAG_SYSTEM = "http://deid-adapter.org/fhir/CodeSystem/key-id"
PROFILE_TAG_SYSTEM = "http://deid-adapter.org/fhir/CodeSystem/deid-profile"
SITE_RULES_TAG_SYSTEM = "http://deid-adapter.org/fhir/CodeSystem/site-rules"  # code: the site rules file's SHA-256
DEID_STATUS_TAG_SYSTEM = "http://deid-adapter.org/fhir/CodeSystem/deid-status"  # code: not-safe-harbor
PATIENT_LINKS = ("subject", "patient", "beneficiary")
RELATIVE_ELEMENTS = ("born", "age", "deceased")  # FamilyMemberHistory elements that describe the relative
NO_OPTIONS: Mapping = MappingProxyType({})
# marking (a rule's or the profile's `marking: true`): the DS4P inline security label, and the method applied
INLINE_LABEL = "http://hl7.org/fhir/uv/security-label-ds4p/StructureDefinition/extension-inline-sec-label"
METHOD_EXTENSION = "http://deid-adapter.org/fhir/StructureDefinition/deid-method"


# A JSON path is made for every value the walk visits, and read only in an error message or a finding: the
# walk passes it on as (parent's path, key or index) pairs, and `path_text` writes one out when it is read.
JsonPath = str | tuple


def path_text(path: JsonPath) -> str:
    """A walk's path written out: Bundle.entry[3].resource.birthDate."""
    if type(path) is str:
        return path
    steps = []
    while type(path) is tuple:
        path, step = path
        steps.append(f"[{step}]" if type(step) is int else f".{step}")
    return path + "".join(reversed(steps))


@dataclass(slots=True)
class PendingText:
    ref: TextRef
    container: dict | list  # where the rebuilt value goes: container[slot]
    slot: object
    at: JsonPath
    labels: set[str]  # the owning resource's security labels: MASKED is added if a span is replaced

    @property
    def path(self) -> str:
        return path_text(self.at)


class WrittenSlots:
    """Where the engine wrote a value itself (a pseudonym, a year, a label): the leak guard does not read
    them. A slot is a key or index of a container (a dict or list of the output), and holds a string, or an
    object the engine made whole (a security label, a tag); the containers are held here, so that no other
    object takes their ids while the record is made."""

    def __init__(self) -> None:
        self.by_id: dict[int, frozenset] = {}  # id(container) → its written keys or indices
        self._containers: list = []

    def add(self, container, slot) -> None:
        key = id(container)
        written = self.by_id.get(key)
        if written is None:
            self._containers.append(container)
            one = _ONE_SLOT.get(slot)
            self.by_id[key] = one if one is not None else _one_slot(slot)
        elif slot not in written:
            self.by_id[key] = written | {slot}


_ONE_SLOT: dict = {}  # slot → frozenset({slot}): most containers hold one written slot, and share its set
_ONE_SLOT_MAX = 1024  # element names and small indices recur; past this many, each gets its own


def _one_slot(slot) -> frozenset:
    one = frozenset((slot,))
    if len(_ONE_SLOT) < _ONE_SLOT_MAX:
        _ONE_SLOT[slot] = one
    return one


@dataclass
class RecordContext:
    """What one record's walk shares: profile, keys, clock, and what it has found so far."""

    profile: Profile
    pseudo: Pseudonymizer
    clock: Callable[[], date]
    single_patient: str | None = None
    pending: list[PendingText] = field(default_factory=list)
    # kept coded text (a term) → where it stands, (container, slot, JSON path, its resource's labels) for each
    # occurrence: a record repeats its codings' displays, and each distinct term is searched once
    terms: dict[str, list[tuple]] = field(default_factory=dict)
    generated: WrittenSlots = field(default_factory=WrittenSlots)  # values the engine wrote itself
    known: set = field(default_factory=set)  # KnownIdentifiers found by the rule methods
    walked: list = field(default_factory=list)  # (resource, ResourceState), stamped once text is replaced
    # a reused step's method (for a date: method and patient id) → value → its outcome (result, labels,
    # engine-written): a record points at its patient, codes its observations and dates its encounter's
    # resources many times over; None where each pseudonym issued is reported
    outcomes: defaultdict | None = field(init=False, default=None)
    known_seen: set = field(default_factory=set)  # (value, category) already in `known`
    resource_ids: set = field(default_factory=set)  # the known identifiers that are resource ids and references
    thing_names: tuple = ()  # the names of the record's organizations, locations and devices (known.thing_names)
    # known names of staff, and the (value, category) of the patient's and their people's names (known.collect_staff,
    # and Site.record_known): a word that only the staff's hold is not masked in coded terms
    staff: set = field(default_factory=set)
    personal: set = field(default_factory=set)
    age_limits: dict = field(default_factory=dict)  # patient id → the year they turned 90 (patients aged 90+ only)
    record_key: str = ""  # the record as given (its type and id): `shift` with scope record keys its offset on it
    targets: dict = field(default_factory=dict)  # fullUrl or #id → resourceType of the record's own resources
    # id(Reference object) → its reference as written: the walk rewrites it before its display is ruled
    original_references: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.forget_outcomes()

    def forget_outcomes(self) -> None:
        """Start the reused outcomes anew."""
        self.outcomes = defaultdict(dict) if self.pseudo.on_issue is None else None

    def staff_only(self) -> frozenset:
        """The known names that only staff hold."""
        return frozenset(k for k in self.staff if (k.value, k.category) not in self.personal)

    def add_people(self, staff: set, personal: set) -> None:
        """What known.collect_staff found."""
        self.staff |= staff
        self.personal.update((k.value, k.category) for k in personal)

    def start_batch(self) -> None:
        """Drop what the walk kept of the entries walked so far (a streamed Bundle's batch is written, or set
        aside): memory stays bounded, whatever the Bundle's size."""
        self.pending, self.terms, self.walked, self.generated = [], {}, [], WrittenSlots()
        self.original_references = {}
        self.forget_outcomes()


@dataclass
class ResourceState:
    type: str
    patient_id: str
    labels: set[str]
    relative_age_limit: int | None = None  # a FamilyMemberHistory's relative aged 90+: the year they turned 90
    container: "ResourceState | None" = None  # a contained resource's container: it carries the labels (dom-5)


class Site:
    """Where a method is applied: the element, its owner and parent node, its path, and the record context."""

    # a plain class with slots: one is made for every value a rule transforms
    __slots__ = ("ctx", "res", "parent", "owner", "element", "at", "fpath", "container", "slot",
                 "pending_extensions", "options", "labels")

    def __init__(self, ctx: RecordContext, res: ResourceState, parent: dict, owner: str, element: Element,
                 at: JsonPath, fpath: str, container, slot, options: Mapping = NO_OPTIONS):
        self.ctx = ctx
        self.res = res
        self.parent = parent
        self.owner = owner
        self.element = element
        self.at = at  # JSON path (see path_text)
        self.fpath = fpath  # FHIR path without indices, e.g. Patient.birthDate
        self.container = container  # where the result goes: the parent (slot: the key) or the output list (slot: the index)
        self.slot = slot
        self.pending_extensions: list | None = None  # made by the first add_primitive_extensions
        self.options = options  # the rule's settings beyond its method
        self.labels: set[str] | None = None  # the labels the method gave this element (kept only for marking)

    @property
    def path(self) -> str:
        """The JSON path, e.g. Bundle.entry[3].resource.birthDate."""
        return path_text(self.at)

    @property
    def pseudo(self) -> Pseudonymizer:
        return self.ctx.pseudo

    def clock(self) -> date:
        return self.ctx.clock()

    def label(self, code: str) -> None:
        self.res.labels.add(code)
        if self.labels is not None:
            self.labels.add(code)

    def record_known(self, value, category: str, staff: bool = False) -> None:
        """A value the rules transform is a known identifier: it must not survive in any text. `staff`: a name of a
        member of staff (as is a name that a staff or organization resource holds)."""
        if isinstance(value, str) and len(value.strip()) >= 2:
            if category == "DATE":
                if not FULL_DATE_RE.match(value):
                    return
                value = value[:10]
            seen, key = self.ctx.known_seen, (value, category)
            if category == "NAME":
                if staff or self.res.type in STAFF_TYPES:
                    self.ctx.staff.add(KnownIdentifier(value, category))
                else:
                    self.ctx.personal.add(key)
            if key not in seen:  # dates and ids recur in a record: one KnownIdentifier each
                seen.add(key)
                self.ctx.known.add(KnownIdentifier(value, category))

    def record_identifier(self, value) -> None:
        """An Identifier's value is a known identifier of the record, except one of an organization, location or
        device that is a name of one of the record's (a software's identifier is often its name): it names no person,
        and would mask the names of organizations and devices the rules keep."""
        if self.res.type in THING_TYPES and names_a_thing(value, self.ctx.thing_names):
            return
        self.record_known(value, identifier_category(self.parent))

    def generated(self) -> None:
        self.ctx.generated.add(self.container, self.slot)

    def rewrite_reference(self, value: str) -> str | None:
        """references.rewrite, the ids it held recorded as known identifiers."""
        self.record_original_ids(value)
        return references.rewrite(value, self.ctx.pseudo)

    def record_original_ids(self, value: str, rtype: str | None = None) -> None:
        """The ids a rewritten reference (or, with `rtype`, resource id) held are known identifiers: left in
        a narrative they would link each pseudonym to its original."""
        for found in references.original_ids(value, rtype):
            self.record_known(found, "UNIQUE_IDENTIFIER")
            self.ctx.resource_ids.add(found)

    @property
    def resource_type(self) -> str:
        return self.res.type

    @property
    def fhir_version(self) -> str:
        return self.ctx.profile.fhir_version

    def day_offset(self) -> int:
        """The rule's fixed `offset_days`, else the keyed offset of its scope (patient, record or release)."""
        options = self.options
        if "offset_days" in options:
            return options["offset_days"]
        scope = options.get("scope", "patient")
        return self.ctx.pseudo.day_offset(self.scope_key(), scope)

    def scope_key(self) -> str:
        """Whose keyed offset or noise a rule uses: its `scope` (patient by default), record or release."""
        scope = self.options.get("scope", "patient")
        if scope == "record":
            return self.ctx.record_key
        if scope == "release":
            return str(self.options.get("release", ""))
        return self.res.patient_id

    def method_of(self, key: str) -> str:
        """The method of the rule the profile gives `key` (an element or a type)."""
        profile = self.ctx.profile
        return profile.rules.get(key, profile.default_primitive).method

    def age_limit_year(self) -> int | None:
        """The year the person this date belongs to turned 90, if they are 90 or older (else None)."""
        res = self.res
        if res.relative_age_limit is not None and self.fpath.split(".", 2)[1].startswith(RELATIVE_ELEMENTS):
            return res.relative_age_limit
        return self.ctx.age_limits.get(res.patient_id) if self.ctx.age_limits else None

    def removes_identifier(self) -> bool:
        p = self.ctx.profile
        if is_one_of(self.parent.get("system"), p.identifier_remove_systems):
            return True
        return not p.identifier_remove_types.isdisjoint(type_codes(self.parent))

    def add_primitive_extensions(self, extensions: list[dict]) -> None:
        if self.pending_extensions is None:
            self.pending_extensions = []
        self.pending_extensions.extend(extensions)

    def reference_targets(self) -> tuple[str, ...]:
        """The resource types the Reference holding this element may point to: the one its `reference` or
        `type` names, else those its element declares (`Claim.insurance.coverage`: Coverage); () for any."""
        written = self.ctx.original_references.get(id(self.parent), self.parent.get("reference"))
        found = references.target_type(written, self.parent.get("type"), self.ctx.targets)
        if found is not None:
            return (found,) if is_resource_type(found) or found in R4_ONLY else ()
        declared = declared_targets(self.fpath.rsplit(".", 1)[0])
        return () if "Resource" in declared else declared

    def apply_rule_of(self, key: str, value):
        """The value through the rule the profile gives `key` (an element or a type), with that rule's settings."""
        rule = self.ctx.profile.rules.get(key) or self.ctx.profile.default_primitive
        options, self.options = self.options, rule.options
        try:
            return METHODS[rule.method](value, self)
        finally:
            self.options = options

    def apply_type_rule(self, value):
        """The rule of the element's type, with that rule's own settings (a `date: shift` rule's offset)."""
        rule = self.ctx.profile.rules.get(self.element.type) or self.ctx.profile.default_primitive
        own, self.options = self.options, rule.options
        try:
            return METHODS[rule.method](value, self)
        finally:
            self.options = own

    def walk_into(self, node: dict):
        _walk_complex(node, _plan(self.ctx.profile, self.element.type, self.fpath, False), self.at, self.ctx, self.res)
        return node


def walk_record(doc: dict, path: JsonPath, ctx: RecordContext) -> None:
    """Apply the profile to a whole record (a Bundle or a resource), knowing what its references point to."""
    ctx.targets.update(references.target_types(doc))
    walk_resource(doc, path, ctx)


def walk_resource(res: dict, path: JsonPath, ctx: RecordContext, container: ResourceState | None = None) -> ResourceState:
    """Apply the profile to one resource (and, through the walk, to its contained and entry resources); its state."""
    rtype = res.get("resourceType")
    version = ctx.profile.fhir_version
    by_shape = version == "r4" and is_one_of(rtype, R4_ONLY)
    if not isinstance(rtype, str) or not (is_resource_type(rtype, version) or by_shape):
        raise InputError(f"{path_text(path)}: resourceType is missing or not an {version.upper()} resource type")
    state = ResourceState(rtype, _patient_of(res, ctx), set(), container=container)
    if rtype == "FamilyMemberHistory":
        state.relative_age_limit = age_limit(_relative_birth(res), ctx.clock())
    if by_shape:
        _walk_by_shape(res, rtype, rtype, True, path, ctx, state)
    else:
        _walk_complex(res, _plan(ctx.profile, rtype, rtype, True), path, ctx, state)
    ctx.walked.append((res, state))
    return state


def walk_entry(entry, index: int, path: JsonPath, ctx: RecordContext, bundle: ResourceState):
    """One Bundle entry as the walk of its whole Bundle takes it, at `path`.entry[index] of the output; the
    entry to write, or REMOVE when the rules leave it empty."""
    step = _plan(ctx.profile, "Bundle", "Bundle", True)["entry"]
    item_path = ((path, "entry"), index)
    if type(entry) is dict:
        _walk_complex(entry, step.inner[0] or _plan_into(step, ctx.profile), item_path,
                      ctx, bundle)
        return entry if entry else REMOVE
    return _transform({}, "entry", entry, step, item_path, [], 0, ctx, bundle)


def entries_walked_alone(profile: Profile) -> bool:
    """Whether the profile walks Bundle.entry item by item (no rule of its own): what walk_entry needs."""
    step = _plan(profile, "Bundle", "Bundle", True).get("entry")
    return step is not None and step.walk_into is not None and step.element.is_list


def _walk_by_shape(node: dict, owner: str, fpath: str, is_resource: bool, path: JsonPath, ctx: RecordContext,
                   state: ResourceState) -> None:
    """A resource type the R4B models lack (fhir_transforms/r4/shapes.py): DomainResource's elements as
    usual; each other element's datatype told by its JSON shape, an object of no known shape walked the same way."""
    known = _plan(ctx.profile, "DomainResource", fpath, True) if is_resource else {}
    plan: dict[str, _Step] = {}
    for key in list(node):
        if key == "resourceType" or key in known:
            continue
        value = node[key]
        first = value[0] if type(value) is list and value else value
        name, sub_fpath = key.lstrip("_"), f"{fpath}.{key.lstrip('_')}"
        if key.startswith("_"):
            type_name = "Element"
        elif type(first) is dict:
            type_name = datatype_of(first) or ""
            if not type_name:  # a backbone element: walked by shape here, passed over by _walk_complex below
                items = value if type(value) is list else [value]
                for i, item in enumerate(items):
                    item_path = ((path, key), i) if type(value) is list else (path, key)
                    if type(item) is dict:
                        _walk_by_shape(item, owner, sub_fpath, False, item_path, ctx, state)
                plan[key] = _Step(owner, Element(name, "BackboneElement", type(value) is list, False), None, sub_fpath,
                                  (dict,), (dict,), (dict,), None, False, *_method_of(None, ctx.profile))
                continue
        else:
            type_name = primitive_of(first)
        el = Element(name, type_name, type(value) is list, False)
        rule = ctx.profile.lookup(sub_fpath, owner, is_resource, name, type_name)
        conditional = rule is not None and (rule.test is not None or rule.trusted)  # per value: the general path
        kept = type_name in PRIMITIVE_TYPES and (rule or ctx.profile.default_primitive).method == "keep" and not conditional
        walk_into = rule is None and type_name not in PRIMITIVE_TYPES
        shape = _shape(type_name)
        single = rule is not None and not el.is_list and not conditional
        plan[key] = _Step(owner, el, rule, sub_fpath, shape, shape if kept and not el.is_list else (),
                          shape if kept and el.is_list else (), (type_name, sub_fpath, False) if walk_into else None,
                          single, *_step_method(rule, ctx.profile, owner, el, single))
    _walk_complex(node, {**known, **plan}, path, ctx, state)
    for key, step in plan.items():  # backbone elements the rules left empty are dropped
        if step.element.type == "BackboneElement" and key in node:
            items = [v for v in (node[key] if type(node[key]) is list else [node[key]]) if v]
            if not items:
                del node[key]
            else:
                node[key] = items if type(node[key]) is list else items[0]


def stamp_all(ctx: RecordContext) -> None:
    """After text replacement: label every walked resource with what was changed in it. A contained
    resource's labels go to its container: R4 (dom-5) forbids security labels on contained resources."""
    for _, state in ctx.walked:  # contained resources are walked (and listed) before their container
        if state.container is not None:
            state.container.labels |= state.labels
    stamps = [(KEY_TAG_SYSTEM, ctx.pseudo.key_id), (PROFILE_TAG_SYSTEM, safe_harbor_gaps.label(ctx.profile))]
    if ctx.profile.rules_sha256:  # made with a site rules file: outputs of other rules never pass as the same release
        stamps.append((SITE_RULES_TAG_SYSTEM, ctx.profile.rules_sha256))
    if ctx.profile.safe_harbor_gaps:  # full shifted dates, kept values: a reader must not take it for Safe Harbor
        stamps.append((DEID_STATUS_TAG_SYSTEM, safe_harbor_gaps.NOT_SAFE_HARBOR))
    for res, state in ctx.walked:
        if state.container is None:
            _stamp(res, state, ctx, stamps)


def age_limit(birth, today: date) -> int | None:
    """The year a person born on `birth` turned 90, if they are 90 or older on `today`; else None."""
    if not isinstance(birth, str):
        return None
    try:
        if dates.age_in_years(birth, today) < 90:
            return None
    except dates.DateFormatError:
        return None  # the walk reports the malformed date where it is
    return int(birth[:4]) + 90


def _relative_birth(res: dict):
    born = res.get("bornPeriod")
    return res.get("bornDate") or (born.get("start") or born.get("end") if isinstance(born, dict) else None)


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


@dataclass(frozen=True, slots=True)
class _Step:
    """What the walker does with one JSON key of one element path, worked out once per profile."""

    owner: str  # the type that holds the element
    element: Element
    rule: Rule | None
    fpath: str
    shape: tuple[type, ...]  # the JSON types FHIR's JSON format gives the element's values
    kept_as: tuple[type, ...] = ()  # a single primitive the rules keep unchanged: the JSON types it may have
    kept_items: tuple[type, ...] = ()  # the same for a list of primitives
    walk_into: tuple | None = None  # a complex datatype without a rule of its own: the key of its plan
    single_rule: bool = False  # a single value a rule transforms (extensions excepted: allow-list first)
    method: Callable | None = None  # the rule's method (or the default primitive's); per value for a conditional rule
    marking: bool = False  # whether the rule marks what it does (`marking`, its own or the profile's)
    # a single value whose method's outcome depends on the value alone, on the value and its patient, or on the
    # value and its Reference (methods.reused_by): applied once per distinct value (and scope) in a record
    reused_by: str | None = None
    # the JSON type of a value walked into as one object (dict) or as a list of objects (list); else None
    walks_one: type | None = field(init=False, default=None)
    walks_many: type | None = field(init=False, default=None)
    # Reference.reference: its value as written is kept for the rule of the Reference's display (reference_targets)
    is_reference: bool = field(init=False, default=False)
    # [the plan of walk_into], once made (`_plan_into`): a step belongs to one profile's plans, and its datatype's
    # plan is found here without hashing its key for every value
    inner: list = field(init=False, default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_reference", self.owner == "Reference" and self.element.name == "reference")
        if self.walk_into:  # (frozen: set once here, so that the walk compares one type per value)
            object.__setattr__(self, "inner", [None])
            object.__setattr__(self, "walks_many" if self.element.is_list else "walks_one",
                               list if self.element.is_list else dict)


def _shape(type_name: str) -> tuple[type, ...]:
    """The JSON types FHIR's JSON format gives each kind of element. The walker compares exact types: the
    record is a marshal copy or fresh from json.loads (see Deidentifier.deidentify), either of which holds
    only the built-in types (and bool is not one of the numbers)."""
    if type_name not in PRIMITIVE_TYPES:
        return (dict,)
    if type_name == "boolean":
        return (bool,)
    if type_name in NUMBER_TYPES:
        return (int, float)
    return (str,)


def _method_of(rule: Rule | None, profile: Profile) -> tuple[Callable, bool]:
    """A rule's method and marking (the default primitive's method where there is no rule)."""
    if rule is None:
        return METHODS[profile.default_primitive.method], False
    return METHODS[rule.method], bool(rule.options.get("marking", profile.marking))


def _step_method(rule: Rule | None, profile: Profile, owner: str, el: Element, single: bool
                 ) -> tuple[Callable, bool, str | None]:
    """A step's method, its marking, and (`single`: a single value one rule transforms; the rule marks nothing)
    what its outcome is reused by (methods.reused_by)."""
    method, marking = _method_of(rule, profile)
    reuse = reused_by(method, owner, el, rule.options, profile.rules) if single and not marking else None
    return method, marking, reuse


def _plan(profile: Profile, type_name: str, fpath: str, is_resource: bool) -> dict[str, _Step]:
    """JSON key → step for an element of `type_name` at `fpath` (cached on the profile)."""
    cache_key = (type_name, fpath, is_resource)
    plan = profile.plans.get(cache_key)
    if plan is None:
        plan = {}
        for key, el in elements(type_name, profile.fhir_version).items():
            sub_fpath = f"{fpath}.{el.name}"
            rule = profile.lookup(sub_fpath, type_name, is_resource, el.name, el.type)
            conditional = rule is not None and (rule.test is not None or rule.trusted)  # per value: the general path
            kept = el.type in PRIMITIVE_TYPES and (rule or profile.default_primitive).method == "keep" and not conditional
            walk_into = rule is None and el.type not in PRIMITIVE_TYPES and el.type not in ("Resource", "Extension")
            shape = _shape(el.type)
            single = rule is not None and not el.is_list and el.type != "Extension" and not conditional
            plan[key] = _Step(type_name, el, rule, sub_fpath, shape, shape if kept and not el.is_list else (),
                              shape if kept and el.is_list else (), (el.type, sub_fpath, False) if walk_into else None,
                              single, *_step_method(rule, profile, type_name, el, single))
        profile.plans[cache_key] = plan
    return plan


def _plan_into(step: _Step, profile: Profile) -> dict[str, _Step]:
    """The plan of the datatype `step` walks into, made once and kept on the step."""
    plan = step.inner[0] = profile.plans.get(step.walk_into) or _plan(profile, *step.walk_into)
    return plan


def _walk_complex(node: dict, plan: dict[str, _Step], path: JsonPath, ctx: RecordContext, state: ResourceState) -> None:
    for key in list(node):
        step = plan.get(key)
        if step is None:
            if key != "resourceType":  # unknown element: only reachable without validation; never passed through
                del node[key]
                state.labels.add("REDACTED")
            continue
        value = node[key]
        value_type = type(value)
        # most primitives (codes, units, values) stay as they are: nothing to rewrite
        if value_type in step.kept_as or (step.kept_items and _all_kept(value, step.kept_items)):
            continue
        if value_type is step.walks_one:  # the commonest complex case
            _walk_complex(value, step.inner[0] or _plan_into(step, ctx.profile), (path, key), ctx, state)
            if not value and not _absent_if_required(value, step, ctx):
                del node[key]
        elif value_type is step.walks_many:  # codings, identifiers, ...
            _walk_items(node, key, value, step, (path, key), ctx, state)
        elif step.single_rule and value_type in step.shape:  # a reference, a date, a text, ...
            sub_path = (path, key)
            if step.reused_by is None or ctx.outcomes is None:
                outcomes = None
            elif step.reused_by is BY_VALUE:  # (the commonest: inline)
                outcomes, seen_as = ctx.outcomes[step.method], value
            else:
                outcomes, seen_as = _reuse_scope(step, node, value, ctx, state)
            if outcomes is not None:
                outcome = outcomes.get(seen_as)
                if outcome is None:
                    result = _first_outcome(node, key, value, step, sub_path, ctx, state, outcomes, seen_as)
                else:  # the method's outcome for the same value earlier in the record
                    result, labels, own = outcome
                    if step.is_reference:
                        ctx.original_references[id(node)] = value
                    if labels:
                        state.labels |= labels
                    if own:
                        ctx.generated.add(node, key)
            else:
                result = _apply(node, key, value, step, step.rule, step.method, step.marking, sub_path, node, key, ctx, state)
            if result is REMOVE:
                del node[key]
                _absent_in_place(node, key, step, ctx)
            elif type(result) is TextRef:
                _pend(ctx, result, node, key, sub_path, state.labels)
            else:
                node[key] = result
        else:
            _walk_values(node, key, step, path, ctx, state)


def _pend(ctx: RecordContext, ref: TextRef, container, slot, at: JsonPath, labels: set) -> None:
    """A value for the text stack, rebuilt at container[slot] once the stack has read it: a term among the
    places of the same term."""
    if ref.known_only:
        ctx.terms.setdefault(ref.texts[0], []).append((container, slot, at, labels))
    else:
        ctx.pending.append(PendingText(ref, container, slot, at, labels))


def _all_kept(value, kept_items: tuple[type, ...]) -> bool:
    """A list of kept primitives in the JSON shape FHIR gives them (anything else takes the general path and its checks)."""
    return type(value) is list and bool(value) and all(v is None or type(v) in kept_items for v in value)


def _walk_items(node: dict, key: str, items: list, step: _Step, path: JsonPath, ctx: RecordContext, state: ResourceState) -> None:
    """A list of a datatype no rule names: each object is walked, and dropped if the rules leave it empty."""
    plan = step.inner[0] or _plan_into(step, ctx.profile)
    out: list = []
    for item in items:
        item_path = (path, len(out))
        if type(item) is dict:
            _walk_complex(item, plan, item_path, ctx, state)
            if item:
                out.append(item)
        else:  # no rule applies: None (a null aligning primitive extensions) comes back, any other value is bad input
            out.append(_transform(node, key, item, step, item_path, out, len(out), ctx, state))
    if not out and items and type(items[0]) is dict and _absent_if_required(absent := {}, step, ctx):
        out.append(absent)
    if out:
        node[key] = out
    else:
        del node[key]


def _absent_if_required(emptied: dict, step: _Step, ctx: RecordContext) -> bool:
    """A required element the rules emptied (an ExplanationOfBenefit.insurer that held only the display of a
    facility name a site removes) stays, marked data-absent (masked), so that the resource is still valid."""
    if not (step.element.required or _model_requires(step.owner, step.element.name, ctx.profile.fhir_version)):
        return False
    emptied["extension"] = [_absent_mark(ctx)]
    return True


def _model_requires(owner: str, name: str, version: str) -> bool:
    """Whether the models require a complex element (read from the element table: no model is built); asked
    only of an element the rules emptied."""
    if version == "r4" and owner in R4_ONLY:
        return False
    try:
        found = elements(owner, version).get(name)
    except ValueError:
        return False
    return found is not None and found.model_required


def _walk_values(node: dict, key: str, step: _Step, path: JsonPath, ctx: RecordContext, state: ResourceState) -> None:
    el, profile = step.element, ctx.profile
    sub_path = (path, key)
    if (type(node[key]) is list) is not el.is_list:  # only reachable without validation: a cardinality error
        raise InputError(f"{path_text(sub_path)}: expected {'a list' if el.is_list else 'one value, not a list'}"
                         f" ({el.type})")
    values = node[key] if el.is_list else [node[key]]
    if key == "modifierExtension":
        _check_modifiers(values, profile, sub_path)
    if el.type == "Extension":
        allowed = _allowed_extensions(node, values, step.owner, profile)
        if len(allowed) != len(values):
            state.labels.add("REDACTED")
        values = allowed
    out: list = []
    is_list = el.is_list
    for value in values:
        # the index it will have in the output (written slots and text paths must match the output the guard reads)
        item_path = (sub_path, len(out)) if is_list else sub_path
        if step.walk_into and type(value) is dict:  # a datatype no rule names: only its elements have rules
            _walk_complex(value, step.inner[0] or _plan_into(step, profile), item_path, ctx, state)
            if value:  # an element left empty by the rules is dropped
                out.append(value)
            continue
        container, slot = (out, len(out)) if is_list else (node, key)
        result = _transform(node, key, value, step, item_path, container, slot, ctx, state)
        if result is REMOVE:
            continue
        if type(result) is TextRef:
            # rebuilt in place once the text stack has read it: in the output list, or (single) in the node
            _pend(ctx, result, container, slot, item_path, state.labels)
            out.append(value)
        else:
            out.append(result)
    if out:
        node[key] = out if is_list else out[0]
    else:
        del node[key]
        _absent_in_place(node, key, step, ctx)


def _absent_in_place(node: dict, key: str, step: _Step, ctx: RecordContext) -> None:
    """A required element the rules removed leaves valid FHIR (the element table says what is required): a
    primitive keeps only a data-absent-reason `masked` extension (`_address` for Endpoint.address), a complex
    element an object holding only that extension. A required choice is the date methods' (`_mask_date`)."""
    el = step.element
    if key.startswith("_"):  # a primitive's own extensions, removed by its rule: the primitive decides
        if key[1:] in node or (ctx.profile.fhir_version == "r4" and step.owner in R4_ONLY):
            return
        el = elements(step.owner, ctx.profile.fhir_version).get(key[1:])
        if el is None:
            return
        key = key[1:]
    if el.required_choice:
        return
    primitive = el.type in PRIMITIVE_TYPES
    if not (el.required if primitive else _model_requires(step.owner, el.name, ctx.profile.fhir_version)):
        return
    if primitive and el.is_list:
        return  # (codes of definitional resources, CapabilityStatement.format: no packaged rule removes one)
    absent = {"extension": [_absent_mark(ctx)]}
    if primitive:
        node["_" + key] = absent
    else:
        node[key] = [absent] if el.is_list else absent


def _absent_mark(ctx: RecordContext) -> dict:
    mark = {"url": DATA_ABSENT, "valueCode": "masked"}
    ctx.generated.add(mark, "valueCode")
    return mark


def _allowed_extensions(node: dict, values: list, owner: str, profile: Profile) -> list:
    """The extensions of `values` the allow-list lets through, by what they hold: an extension it defines, with a
    value of a type its definition allows; inside such an extension (`owner` Extension), a sub-extension it
    defines. An allowed url the list does not define (`allow`) may hold anything, as may its sub-extensions
    that are allowed urls themselves."""
    allow = profile.extension_allow
    kind = allow.get(node.get("url")) if owner == "Extension" and type(node.get("url")) is str else None
    if kind is not None:  # sub-extensions of a defined extension: its parts only
        return [v for v in values if type(v) is dict and type(v.get("url")) is str and v["url"] in kind.parts
                and kind.fits(v, kind.parts[v["url"]])]
    found = []
    for v in values:
        if type(v) is dict and is_one_of(v.get("url"), allow):
            own = allow[v["url"]]
            if own is None or own.fits(v):
                found.append(v)
    return found


def _transform(node: dict, key: str, value, step: _Step, path: JsonPath, container, slot, ctx: RecordContext,
               state: ResourceState):
    """One value through its rule (or its type's): the new value, a TextRef, or REMOVE (also for an emptied element)."""
    el, rule = step.element, step.rule
    if value is None:
        if not el.is_list:
            raise InputError(f"{path_text(path)}: null is not a FHIR value")
        return None  # a null in a list only aligns primitive extensions (`_given: [null, {...}]`)
    if type(value) not in step.shape:
        # only reachable without validation: a wrong JSON shape is bad input, never passed through
        kind = "a value" if el.type in PRIMITIVE_TYPES else "an object"
        raise InputError(f"{path_text(path)}: expected {kind} of type {el.type}")
    method, marking = step.method, step.marking
    if rule is not None and rule.test is not None:  # a condition on the element (on a primitive's parent)
        rule = rule.applies(value if type(value) is dict else node)
        method, marking = _method_of(rule, ctx.profile)
    if rule is None:
        if el.type == "Resource":
            walk_resource(value, path, ctx, state if key == "contained" else None)
            return value
        if type(value) is dict:
            _walk_complex(value, _plan(ctx.profile, el.type, step.fpath, False), path, ctx, state)
            return REMOVE if not value else value
    return _apply(node, key, value, step, rule, method, marking, path, container, slot, ctx, state)


def _apply(node: dict, key: str, value, step: _Step, rule: Rule | None, method: Callable, marking: bool, path: JsonPath,
           container, slot, ctx: RecordContext, state: ResourceState, labels: set | None = None):
    """`_transform` once the value's shape is checked and its rule known (a single_rule step's value comes here
    straight from the walk): the method applied, its marks and extensions added. `labels` receives the labels
    the method gave."""
    el = step.element
    if step.is_reference:
        ctx.original_references[id(node)] = value
    site = Site(ctx, state, node, step.owner, el, path, step.fpath, container, slot,
                rule.options if rule is not None else NO_OPTIONS)
    if marking:
        site.labels = set()
    elif labels is not None:
        site.labels = labels
    try:
        result = method(value, site)
    except ValueError as e:  # e.g. a malformed date; messages never quote the value
        if isinstance(e, InputError) or rule is None:
            raise
        raise InputError(f"{path_text(path)}: {e}") from None
    if marking and site.labels and result is not REMOVE and type(result) is not TextRef:
        _mark(key, result, el, rule.method, site, ctx)
    if site.pending_extensions:
        _add_extensions(node, "_" + key, site.pending_extensions)
    if rule is not None and rule.trusted:
        _trust(result, container, slot, ctx.generated)
    return REMOVE if type(result) is dict and not result else result


def _reuse_scope(step: _Step, node: dict, value, ctx: RecordContext, state: ResourceState) -> tuple[dict | None, object]:
    """Where the outcome of a value is reused from, and what it is looked up as there, for a step reused by
    patient or by reference (methods.reused_by); (None, None) where it is applied anew."""
    if step.reused_by is BY_PATIENT:  # a date, among its patient's resources
        if state.relative_age_limit is not None:  # a FamilyMemberHistory of a relative aged 90+: also theirs
            return None, None
        return ctx.outcomes[step.method, state.patient_id], value
    # BY_REFERENCE: a Reference.display, by the reference as written and its type (what reference_targets reads)
    reference = ctx.original_references.get(id(node), node.get("reference"))
    kind = node.get("type")
    if not (reference is None or type(reference) is str) or not (kind is None or type(kind) is str):
        return None, None  # (without validation: a shape the walk reports elsewhere)
    return ctx.outcomes[step.method, step.fpath], (value, reference, kind)


def _first_outcome(node: dict, key: str, value, step: _Step, path: JsonPath, ctx: RecordContext,
                   state: ResourceState, outcomes: dict, seen_as):
    """A reused step's value seen first (in its scope): `_apply`'s result, its outcome kept in `outcomes` under
    `seen_as` for the next, unless a date was removed (masked: its data-absent mark is written beside it)."""
    labels: set = set()
    result = _apply(node, key, value, step, step.rule, step.method, False, path, node, key, ctx, state, labels)
    if result is not REMOVE or step.reused_by is not BY_PATIENT:
        own = key in ctx.generated.by_id.get(id(node), ())  # (a key is walked once: only the method can have marked it)
        outcomes[seen_as] = (result, frozenset(labels), own)
    return result


def _trust(value, container, slot, written: WrittenSlots) -> None:
    """Every string of a value a site rule keeps, marked as the engine's own: the leak guard does not read it
    there (the same value anywhere else is still read)."""
    if type(value) is str:
        written.add(container, slot)
    elif type(value) is dict:
        for k, v in value.items():
            _trust(v, value, k, written)
    elif type(value) is list:
        for i, v in enumerate(value):
            _trust(v, value, i, written)


def _mark(key: str, result, el: Element, method: str, site: Site, ctx: RecordContext) -> None:
    """Record on the element what was done: its security label (the DS4P inline label) and the rule's method.
    A primitive in a list is not marked (its `_x` list would have to align); its resource's labels say it."""
    marks = [{"url": INLINE_LABEL, "valueCoding": {"system": SECURITY_SYSTEM, "code": code}}
             for code in sorted(site.labels)] + [{"url": METHOD_EXTENSION, "valueCode": method}]
    for mark in marks:
        written = mark.get("valueCoding", mark)
        ctx.generated.add(written, "code" if "valueCoding" in mark else "valueCode")
    if type(result) is dict:
        result.setdefault("extension", []).extend(marks)
    elif not el.is_list and site.owner not in R4_ONLY and "_" + key in elements(site.owner):
        site.add_primitive_extensions(marks)  # (Resource.id has no `_id` in the models: not marked)


def _check_modifiers(values: list, profile: Profile, path: JsonPath) -> None:
    for v in values:
        if not (isinstance(v, dict) and is_one_of(v.get("url"), profile.modifier_extension_allow)):
            raise UnknownModifier(f"{path_text(path)}: unknown modifierExtension (its meaning cannot be kept); "
                                  "add it to the profile's allow-list")


def _add_extensions(node: dict, key: str, extensions: list[dict]) -> None:
    holder = node.setdefault(key, {})
    holder.setdefault("extension", []).extend(extensions)


def _stamp(res: dict, state: ResourceState, ctx: RecordContext, stamps: list[tuple[str, str]]) -> None:
    """meta.security labels for what was changed, and the record's `stamps` as tags (system, code): the key id,
    profile and site rules file.

    The codes the engine adds are marked generated: a patient named "Masked" or "Harbor" is not a leak there."""
    meta = res.setdefault("meta", {})
    security = meta.setdefault("security", [])
    present = {(c.get("system"), c.get("code")) for c in security} if security else ()  # (the input's: rare)
    for code in sorted(state.labels):
        if (SECURITY_SYSTEM, code) not in present:
            ctx.generated.add(security, len(security))  # the whole label is the engine's
            security.append({"system": SECURITY_SYSTEM, "code": code})
    if not security:
        del meta["security"]
    tags = meta.setdefault("tag", [])
    for system, code in stamps:
        ctx.generated.add(tags, len(tags))
        tags.append({"system": system, "code": code})
