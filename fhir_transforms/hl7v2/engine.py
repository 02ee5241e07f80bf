"""De-identify HL7v2 ER7 messages: the FHIR flow over HL7's own structure.

parse → rules (recording known identifiers) → text stack on narrative, one batch per message →
leak guard over every field of the output → serialize (re-split to check the segments). Never a partial result.
"""
from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from operator import attrgetter
from typing import Callable, Iterable, NamedTuple

from fhir_transforms.hl7v2 import message as er7
from fhir_transforms.hl7v2 import payload as ed
from fhir_transforms.hl7v2.identifying import MIN_CHARACTERS, dates_with_time, holds_known_day, identifying
from fhir_transforms.hl7v2.rules import (Datatype, DTMError, HL7Profile, Rule, dtm_age, dtm_full_date, dtm_shift, dtm_year,
                                         identifier_system, is_calendar_dtm, is_dtm, readable_year)
from fhir_transforms.hl7v2.standard import defines, field_type, standard_version
from fhir_transforms import dates, safe_harbor_gaps, values, zipcodes
from fhir_transforms.errors import InputError, LeakFound, RecordRefused
from fhir_transforms.fpe import FpeFallback, fpe_format, selects
from fhir_transforms.known import name_words, without_staff_words, words_of_names
from fhir_transforms.methods import METHODS, check_implemented
from fhir_transforms.pseudonym import Pseudonymizer
from text_deid import leak_guard, replace
from text_deid.spans import DetectorError, KnownIdentifier, Span
from text_deid.stack import TextStack, known_identifiers_only
from fhir_transforms.hl7v2.rules import load_hl7_profile

TEXT_PAYLOAD_SUBTYPES = ("PLAIN", "TEXT", "RTF", "HTML", "XML", "CDA", "X-HL7-CDA-LEVEL-ONE", "SGML", "JSON", "X-RTF")
# datatypes whose values `_record` turns into known identifiers for the text stack and the leak guard
RECORDED_TYPES = frozenset({"XPN", "XCN", "PPN", "NDL", "XAD", "XTN", "CX"})
# what a kept value must hold to hide a date with a time or an offset (`is_calendar_dtm(..., with_time=True)`)
DATE_TIME_RE = re.compile(r"\d{10}|\d{8}[+-]\d{4}")
LEAF_SEPARATOR = "\x00"  # between leaves in the leak guard's view of a field: no known form spans two leaves
OBX_AGE = Rule(method="age90", options={"value": "age"})  # OBX-5 of an age observation (`_age`)
# an ST age: a number with an optional comparator and unit word ("95 years", ">89")
AGE_TEXT_RE = re.compile(r"\s*(<=|>=|<|>|=)?\s*(\d{1,5}(?:\.\d+)?)\s*([A-Za-z_{}]*)\s*")
OBX_TEXT = Rule(method="text")  # OBX-5 of a value type the profile does not list
DTM_RULE = Rule(type="DTM")  # a date found where a field's rule expects text or a code
# What `run` does with a field, by its rule, and `rep` with a component, by its resolved rule
# (`HL7Deidentifier.field_kind`, `.components`): worked out once per rule of the profile.
WALK, KEEP, CHECKED, CLEARS, CONDITIONAL, REMOVE = "walk", "keep", "checked", "clears", "conditional", "remove"
CODED_TYPES = frozenset({"CE", "CWE", "CNE"})  # a `term` component of these is coded text only beside its code
SHORT_CODE_RE = re.compile(r"[A-Za-z]{1,3}")  # an XAD part this short is a code, not a place
ROUTING_SPLIT_RE = re.compile(r"[\^&~]")
INTEGER_RE = re.compile(r"[+-]?\d+")
DECIMAL_RE = re.compile(r"[+-]?(\d+\.\d*|\.\d+)")
# Segments about the patient or their visit: there a kept code or number that is a whole calendar date (with
# or without a time) is a date a sender put one field off, and gets the date rule (elsewhere only with a time:
# a code may be an 8-digit number)
PATIENT_SEGMENTS = frozenset({"PID", "PD1", "PV1", "PV2", "NK1", "GT1", "IN1", "IN2", "IN3", "MRG", "QPD"})
DAY_RE = re.compile(r"\d{8}")
ZIP_RE = re.compile(r"\s*\d{5}(?:-?\d{4})?\s*")  # a ZIP code in an address's state (XAD-4): ruled as XAD-5
ADDRESS_TYPES = frozenset({"XAD", "AD"})
# a field of these types holds a table code, a number or a date, never a segment id: one that does, followed
# by a set ID, starts a segment a sender glued on (`MessageWalk._glued_at`)
GLUE_TYPES = frozenset({"ID", "IS", "SI", "NM", "DT", "TM", "TS", "DTM"})
SET_ID_RE = re.compile(r"\d{1,4}")
QIP_FIELD_RE = re.compile(r"@?([A-Z][A-Z0-9]{2})[.-](\d+)(?:\.(\d+))?(?:\.(\d+))?")  # @PID.5.1
_value_and_category = attrgetter("value", "category")  # KnownIdentifier's own order, without its generated __lt__


class Finding(NamedTuple):
    """Where the text stack found PHI in a message, for the audit: the place of the text (`NTE[3]-3`, a run of OBX
    lines by its first; `message 2/` before it in a file), never its value, and the span in it."""

    path: str
    span: Span


class HL7Result(NamedTuple):
    """A de-identified message or file, and where the text stack found PHI in it."""

    text: str
    findings: tuple[Finding, ...] = ()


@dataclass
class Note:
    """Text for the stack and how to write its replacement: one leaf, a run of OBX or NTE lines, or an ED payload."""

    where: str
    parts: list[tuple[list[str], int]] = field(default_factory=list)  # (container, index) of each leaf
    texts: list[str] = field(default_factory=list)
    write: Callable[[Note, list[Span]], None] | None = None
    known_only: bool = False  # kept text (a term): searched for the message's known identifiers alone
    first: int = 0  # the segment a run of lines starts in (`_run_note`)

    @property
    def text(self) -> str:
        return "\n".join(self.texts)


class MessageWalk:
    """One message's pass over the rules: transforms values in place, records known identifiers, queues notes."""

    def __init__(self, deid: HL7Deidentifier, message: er7.Message, known: set[KnownIdentifier]):
        self.deid, self.profile, self.pseudo = deid, deid.profile, deid.pseudo
        self.d = message.delimiters
        self.message = message
        self.known = known
        self.notes: list[Note] = []
        self.offset_key = _patient_key(message, self.profile)
        msh = message.segments[0]
        self.record_key = f"MSH-10|{self._decoded(msh.get(10))}" if msh.sid == "MSH" else ""
        self.version = standard_version(self._decoded(msh.get(12).split(self.d.component)[0])
                                        if msh.sid == "MSH" else "")
        self.old_birth_days = self._birth_days_over_89()
        self.written_dates: set[tuple[int, str]] = set()  # (segment number, value) a date rule wrote
        self.staff_names: set[str] = set()  # XCN names: known unless an organisation bears the same name
        self.org_names: set[str] = set()
        self._segment_number = 0
        self.checked: list[tuple[list[str], int, str]] = []  # values kept by their datatype, checked at the end
        self.checked_fields: list[tuple[er7.Segment, int, str]] = []  # whole kept fields, checked the same way
        self._open_note: tuple[str, Note] | None = None
        self._fields: list[tuple[er7.Segment, int, list]] = []
        self._cleared: list[tuple[er7.Segment, int, str]] = []  # fields whose rule empties every leaf
        self._copy_back: list[tuple[list[str], int, list[str], int]] = []  # QIP values ruled in their field's place
        self._not_separators = _not_separators(self.d)
        self.runs: dict[int, int] = {}  # first segment → last segment of each run of lines over several segments

    # --- segments and fields
    def run(self, segments: Iterable[er7.Segment] | None = None, start: int = 1) -> None:
        """Walk the message's segments, or (streamed, `stream.py`) those given, numbered from `start`."""
        for k, seg in enumerate(self.message.segments if segments is None else segments, start):
            self._segment_number = k
            if self._open_note and self._open_note[0].split("|", 1)[0] != seg.sid:
                self._open_note = None  # a run of OBX (or NTE) lines ends at the first other segment
            plans = self.deid.field_plans(self.version, seg.sid)
            glued = 0  # the field where a segment a sender glued onto this one starts (its id), if any
            for n, raw in _fields(seg):
                if not raw or raw == '""':
                    continue
                if (seg.sid == "QPD" and n >= 3) or f"{seg.sid}.{n}" in self.profile.subject_values:
                    self._query_field(seg, n, raw, f"{seg.sid}[{k}]-{n}")
                    continue
                if not glued and len(raw) == 3 and self._glued_at(seg, n):
                    glued = n  # "PID|…|PV1|1|O|…": a lost segment break; what follows is ruled as PV1's fields
                    continue
                if glued:
                    rule = self.profile.rule(seg.get(glued), n - glued, self.version)
                    kind = self.deid.field_kind(rule)
                else:
                    rule, kind = plans.get(n) or self._plan(seg, n, plans)
                if kind is KEEP:  # a datatype (ID, NM...) whose rule is `keep` is kept the same
                    continue
                if kind is CONDITIONAL:  # a site rule's condition: decided per repetition
                    self._conditional(rule, seg, n, raw, f"{seg.sid}[{k}]-{n}")
                    continue
                if kind is CHECKED and not (DAY_RE if seg.sid in PATIENT_SEGMENTS else DATE_TIME_RE).search(raw):
                    self.checked_fields.append((seg, n, raw))  # checked whole, split only on a hit
                    continue
                if kind is CLEARS:  # every leaf emptied: only the separators stay
                    self._cleared.append((seg, n, self._not_separators.sub("", raw)))
                    continue
                where = f"{seg.sid}[{k}]-{n}"
                f = er7.split_field(raw, self.d)
                for rep in f:
                    self.rep(rule, rep, where, seg)
                self._fields.append((seg, n, f))

    def _glued_at(self, seg: er7.Segment, n: int) -> bool:
        """Whether field `n` starts a segment glued onto `seg` (a lost segment break): a segment id of the
        standard, in a field the version does not define or one of a code, number or date type (no such value
        is a segment id), followed by a set ID, as most segments start (a facility coded "MSH" is followed by
        no such number)."""
        if seg.sid in er7.HEADERS or seg.sid == "QPD" or field_type(self.version, seg.get(n), 1) is None:
            return False
        typed = defines(self.version, seg.sid, n) and field_type(self.version, seg.sid, n) not in GLUE_TYPES
        return not typed and SET_ID_RE.fullmatch(seg.get(n + 1)) is not None

    def _query_field(self, seg: er7.Segment, n: int, raw: str, where: str) -> None:
        """A query parameter (QPD-3 on) by its query's statement in the profile (`queries`, by QPD-1.1): a rule,
        or `@SEG.n^value` pairs; else, as a subject field's values (QRF-5), every value removed and known."""
        name = self._decoded(seg.get(1).split(self.d.component)[0]).strip().upper() if seg.sid == "QPD" else ""
        query = self.profile.queries.get(name)
        f = er7.split_field(raw, self.d)
        if query and n in query.pairs:
            self._query_pairs(f, f"{where}.2", seg)
        elif query and n in query.fields:
            for rep in f:
                self.rep(query.fields[n], rep, where, seg)
        else:
            for rep in f:
                self._known_and_removed(rep)
        self._fields.append((seg, n, f))

    def _query_pairs(self, f: list, where: str, seg: er7.Segment) -> None:
        """QIP `@SEG.n[.c[.s]]^value` pairs (a repetition each): each value (component 2) ruled as the field it
        names, in that field's component and subcomponent, the pairs that name one field together (an id with its
        authority, `@PID.3.1` with `@PID.3.4.1`, gets the pseudonym the same id has in PID-3). A pair that names
        no field of the standard, and what follows a value: removed and known."""
        shaped: dict[tuple[str, int], list[list[list[str]]]] = {}  # (segment, field) → reps in the field's shape
        for rep in f:
            m = QIP_FIELD_RE.fullmatch(self._decoded(rep[0][0]).strip()) if rep and rep[0] else None
            sid, n = (m.group(1), int(m.group(2))) if m else ("", 0)
            if len(rep) < 2 or not m or (field_type(self.version, sid, n) is None
                                         and f"{sid}.{n}" not in self.profile.fields):
                self._known_and_removed(rep[1:])
                continue
            c, sub = int(m.group(3) or 1), int(m.group(4) or 0)
            value, slots = rep[1], range(sub - 1, sub) if sub else range(len(rep[1]))
            reps = shaped.setdefault((sid, n), [])
            target = next((r for r in reps if not any(_slot(r, c, j) for j in slots)), None)  # a free place
            if target is None:
                reps.append(target := [])
            target.extend([""] for _ in range(c - len(target)))
            comp = target[c - 1]
            comp.extend("" for _ in range(max(slots) + 1 - len(comp)))
            for k, j in enumerate(slots):
                comp[j] = value[k]
                self._copy_back.append((comp, j, value, k))
            self._known_and_removed(rep[2:])
        for (sid, n), reps in shaped.items():
            for rep in reps:
                self.rep(self.profile.rule(sid, n, self.version), rep, where, seg)

    def _known_and_removed(self, comps: list[list[str]]) -> None:
        """Every leaf emptied and kept as a known identifier of the message: a whole calendar date as a date,
        anything else as a unique identifier (the text stack masks it, the guard looks for it)."""
        for comp in comps:
            for j, raw in enumerate(comp):
                value = self._decoded(raw).strip()
                if value:
                    full = dtm_full_date(value) if is_calendar_dtm(value) else None
                    self.known.add(KnownIdentifier(full, "DATE") if full else KnownIdentifier(value, "UNIQUE_IDENTIFIER"))
                comp[j] = ""

    def _plan(self, seg: er7.Segment, n: int, plans: dict[int, tuple[Rule, str]]) -> tuple[Rule, str]:
        rule = self._rule(seg, n)
        found = (rule, self.deid.field_kind(rule))
        if not (seg.sid == "OBX" and n == 5):  # OBX-5 is ruled by each observation's value type
            plans[n] = found
        return found

    def _conditional(self, rule: Rule, seg: er7.Segment, n: int, raw: str, where: str) -> None:
        """Each repetition by the rule where its component holds one of the listed values, else by the next
        applicable rule (the field's datatype, ...)."""
        component, values = rule.where
        f = er7.split_field(raw, self.d)
        for rep in f:
            held = self._decoded(rep[component - 1][0]).strip() if len(rep) >= component else ""
            self.rep(rule if held in values else rule.otherwise, rep, where, seg)
        self._fields.append((seg, n, f))

    def next_window(self, keep_open_note: bool) -> None:
        """Forget what one window of segments queued (streamed, `stream.py`); the message's known identifiers stay."""
        self.notes, self.checked, self.checked_fields, self.written_dates = [], [], [], set()
        self._fields, self._cleared, self._copy_back = [], [], []
        if not keep_open_note:
            self._open_note = None

    def finish(self, stamp: bool = True, msh: er7.Segment | None = None) -> None:
        """Write every transformed field back into its segment (after the text stack wrote its notes); with
        `stamp`, the key and profile into `msh` (default: the message's first segment)."""
        for holder, i, comp, j in self._copy_back:
            comp[j] = holder[i]
        for seg, n, f in self._fields:
            seg.set(n, er7.join_field(f, self.d))
        for seg, n, raw in self._cleared:
            seg.set(n, raw)
        self._fields, self._cleared = [], []
        msh = msh or self.message.segments[0]
        if stamp and msh.sid == "MSH":
            self._stamp(msh)

    def _rule(self, seg: er7.Segment, n: int) -> Rule:
        if seg.sid == "OBX" and n == 5:
            vtype = self._decoded(seg.get(2).split(self.d.component)[0]).strip().upper()
            if vtype in self.profile.observation_age_types and self._per_year(seg) is not None:
                nm = self.profile.observation_values.get("NM")  # a site that perturbs numbers perturbs ages in years too
                if vtype == "NM" and nm and nm.method == "perturb" and self._per_year(seg) == 1:
                    return self.deid.age_perturb(nm)
                return OBX_AGE
            return self._observation_rule(vtype)
        return self.profile.rule(seg.sid, n, self.version)

    def _observation_rule(self, vtype: str) -> Rule:
        ov = self.profile.observation_values
        return ov.get(vtype) or ov.get("default") or OBX_TEXT

    def _per_year(self, seg: er7.Segment) -> float | None:
        """How many of its unit make a year, for an OBX that is an age (profile `observation_ages`,
        `observation_age_units`), else None: a unit of years makes any observation an age; an age code counts
        in its unit, or in years without one."""
        units = [self._decoded(c).strip().casefold() for c in seg.get(6).split(self.d.component)[:2]]
        per_year = next((self.profile.observation_age_units[u] for u in units if u in self.profile.observation_age_units),
                        None)
        if per_year == 1:
            return 1
        codes = seg.get(3).split(self.d.repetition)[0].split(self.d.component)
        if any(self._decoded(codes[i]).strip() in self.profile.observation_ages for i in (0, 3) if i < len(codes)):
            return per_year or 1
        return None

    def _age(self, rep: list[list[str]], where: str, seg: er7.Segment) -> None:
        """OBX-5 of an age observation: 90 years or more becomes the category 90+, in the unit sent (NM `90`,
        SN `>=^90`, ST `>=90`); younger ages are kept. An ST that is not a number goes through the text stack."""
        vtype = self._decoded(seg.get(2).split(self.d.component)[0]).strip().upper()
        per_year = self._per_year(seg)
        ninety = f"{math.ceil(90 * per_year):d}"
        if vtype == "SN":
            values = [self._decoded(c[0]) if c else "" for c in rep] + ["", "", "", ""]
            numbers = [float(v) for v in (values[1], values[3]) if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", v)]
            if any(_over_89(x / per_year, values[0].strip() if i == 0 else "") for i, x in enumerate(numbers)):
                rep[:] = [[">="], [ninety]]
            return
        value = self._decoded(rep[0][0]) if rep and rep[0] else ""
        m = AGE_TEXT_RE.fullmatch(value)
        if vtype == "ST" and not m:
            self.rep(self._observation_rule(vtype), rep, where, seg)
            return
        if not m or (vtype == "NM" and m.group(1)):
            return  # not a number: NM is kept as sent, as any NM
        word = m.group(3).casefold()
        per_word = self.profile.observation_age_units.get(word, per_year) if word else per_year
        if _over_89(float(m.group(2)) / per_word, m.group(1) or ""):
            written = ninety if vtype == "NM" else f">={math.ceil(90 * per_word):d}" + (f" {m.group(3)}" if word else "")
            rep[:] = [[er7.escape(written, self.d)]]

    def _birth_days_over_89(self) -> set[str]:
        """Full birth dates (PID-7) of patients aged 90 or more: the same date anywhere else is removed too."""
        days = set()
        for seg in self.message.segments:
            if seg.sid == "PID":
                value = self._decoded(seg.get(7).split(self.d.repetition)[0].split(self.d.component)[0])
                full = dtm_full_date(value)
                try:
                    if full and dtm_age(value, self.deid.clock()) >= 90:
                        days.add(full)
                except (DTMError, dates.DateFormatError, ValueError):
                    continue
        return days

    def _stamp(self, msh: er7.Segment) -> None:
        sid, n = self.profile.key_id_field.split(".")
        if sid == "MSH":
            while len(msh.parts) <= msh.index(int(n)):
                msh.parts.append("")
            # a site rules file's hash (its first 12 hex digits; the audit holds all of it) joins the profile's name;
            # rules that keep more than Safe Harbor are named by their hash alone, and say so
            sha = self.profile.rules_sha256[:12]
            name = self.profile.name + (f"+{sha}" if sha else "")
            if self.profile.safe_harbor_gaps:
                name = (f"site.{sha}" if sha else self.profile.name) + f"/{safe_harbor_gaps.NOT_SAFE_HARBOR}"
            msh.set(int(n), er7.escape(f"deid/{self.pseudo.key_id}/{name}", self.d))

    # --- rules on repetitions, components, leaves
    def _resolve(self, rule: Rule) -> Rule | Datatype:
        return self.profile.resolve(rule)

    def rep(self, rule: Rule, rep: list[list[str]], where: str, seg: er7.Segment) -> None:
        if rule is OBX_AGE:
            return self._age(rep, where, seg)
        target = self._resolve(rule)
        if isinstance(target, Datatype):
            if target.name in RECORDED_TYPES:
                decoded = self._decoded
                self._record(target.name, [[decoded(s) for s in c] for c in rep], where)
            listed, default = self.deid.components(target)
            for i, comp in enumerate(rep):
                sub, kind = listed[i] if i < len(listed) else default
                if kind is REMOVE:  # most components: emptied, or kept as they are, with nothing to record
                    comp[:] = [""] * len(comp)
                elif kind is WALK:
                    self.component(sub, comp, f"{where}.{i + 1}", target.name, rep, seg)
        elif _plain_remove(target):
            for comp in rep:
                comp[:] = [""] * len(comp)
        elif not _plain_keep(target):
            self.method(target, [leaf for comp in rep for leaf in [(comp, j) for j in range(len(comp))]], where,
                        rule.type, rep, seg)

    def component(self, target: Rule | Datatype, comp: list[str], where: str, owner: str, rep, seg) -> None:
        """One component by its resolved rule: a method, or a datatype whose parts are subcomponents."""
        if isinstance(target, Datatype):
            if target.name in RECORDED_TYPES:
                self._record(target.name, [[self._decoded(s)] for s in comp], where)
            listed, default = self.deid.components(target)
            for i in range(len(comp)):
                sub, kind = listed[i] if i < len(listed) else default
                if kind is REMOVE or isinstance(sub, Datatype):  # no datatype nests below a subcomponent
                    comp[i] = ""
                elif kind is WALK:
                    self.method(sub, [(comp, i)], f"{where}.{i + 1}", target.name, [[s] for s in comp], seg,
                                container=comp)
        else:
            self.method(target, [(comp, j) for j in range(len(comp))], where, owner, rep, seg)

    def method(self, rule: Rule, leaves: list[tuple[list[str], int]], where: str, owner: str | None, rep, seg,
               container: list[str] | None = None) -> None:
        """Apply a rule's method to the leaves of a field, component or subcomponent."""
        if leaves:
            self.LEAF_METHODS.get(rule.method, MessageWalk._each_value)(
                self, rule, leaves, where, owner, rep, seg, container)

    def _keep(self, rule: Rule, leaves, where, owner, rep, seg, container) -> None:
        if not rule.options.get("checked"):
            return None
        with_time = seg.sid not in PATIENT_SEGMENTS
        for holder, j in leaves:  # a number or code that holds a date (with a time): a sender's misuse
            value = self._decoded(holder[j])
            if is_calendar_dtm(value, with_time=with_time):
                self._as_date(holder, j, value, where, owner, rep)
            elif value.strip():
                self.checked.append((holder, j, value))

    def remove_kept_identifiers(self, guarded: tuple[KnownIdentifier, ...]) -> None:
        """Remove each `checked` kept value that holds a known identifier of the patient (the guard's own
        match), or that is one of the patient's identifiers too short to search for (a visit number 5001
        copied into a resource code)."""
        ids = {k.value.strip().casefold() for k in self.known
               if k.category not in ("DATE", "NAME", "GEOGRAPHIC_LOCATION") and len(k.value.strip()) >= 3}
        # whole fields first, split only those that may hold an identifier (most hold none)
        texts = [er7.to_leaf_separators(raw, self.d, LEAF_SEPARATOR) for _, _, raw in self.checked_fields]
        folded = [t.casefold() for t in texts]
        everything = "\n".join(folded)
        present = [x for x in ids if x in everything]  # most messages: none, and no field is read for each id
        suspect = {i for i, t in enumerate(folded) if self.d.escape in t or any(map(t.__contains__, present))} \
            if present or self.d.escape in everything else set()
        if texts and not leak_guard.clean(texts, guarded):
            suspect |= {int(leak.path) for leak in leak_guard.scan(((str(i), t) for i, t in enumerate(texts)), guarded)}
        for i in sorted(suspect):
            seg, n, raw = self.checked_fields[i]
            f = er7.split_field(raw, self.d)
            for r in f:
                for c in r:
                    self.checked.extend((c, j, self._decoded(v)) for j, v in enumerate(c) if v.strip())
            self._fields.append((seg, n, f))
        if not self.checked:
            return
        values = [v for _, _, v in self.checked]
        hits = set() if leak_guard.clean(values, guarded) else {
            leak.path for leak in leak_guard.scan(((str(i), v) for i, v in enumerate(values)), guarded)}
        for i, (holder, j, value) in enumerate(self.checked):
            if str(i) in hits or value.strip().casefold() in ids:
                holder[j] = ""

    def _text(self, rule: Rule, leaves, where, owner, rep, seg, container) -> None:
        if owner in ADDRESS_TYPES and where.endswith(".4") and ZIP_RE.fullmatch(self._decoded(leaves[0][0][leaves[0][1]])):
            address = self.profile.datatype(owner)  # a ZIP in the state: ruled as the ZIP (XAD-5)
            zip_rule = self._resolve(address.components.get(5, address.default)) if isinstance(address, Datatype) else None
            if isinstance(zip_rule, Rule):
                return self.method(zip_rule, leaves, where, owner, rep, seg, container)
        for holder, j in leaves:
            if holder[j]:
                self.text(holder, j, where, owner, rep, seg)

    def _term(self, rule: Rule, leaves, where, owner, rep, seg, container) -> None:
        """Coded text (CE/CWE/CNE 2, 5, 11 beside the code before it) and organisation names (XON-1): kept, and
        searched for the message's known identifiers alone. A text component without its code is free text."""
        if owner in CODED_TYPES and not _code_beside(where, rep):
            return self._text(rule, leaves, where, owner, rep, seg, container)
        for holder, j in leaves:
            if holder[j]:
                decoded = self._decoded(holder[j])
                if is_calendar_dtm(decoded):  # as in `text`: a date a sender put there gets the date rule
                    self._as_date(holder, j, decoded, where, owner, rep)
                else:
                    self.notes.append(Note(where, [(holder, j)], [decoded], self._write_leaves, known_only=True))

    def _remove(self, rule: Rule, leaves, where, owner, rep, seg, container) -> None:
        if "category" in rule.options:
            value = self._decoded(leaves[0][0][leaves[0][1]])
            if value:
                self.known.add(KnownIdentifier(value, rule.options["category"]))
        for holder, j in leaves:
            holder[j] = ""

    def _each_value(self, rule: Rule, leaves, where, owner, rep, seg, container) -> None:
        on_dates = METHODS[rule.method].on_dates
        for k, (holder, j) in enumerate(leaves):
            value = self._decoded(holder[j])
            # the method rules the first value; later ones only when they are dates too (TS-1, DR, a range)
            if not value.strip() or (k and not (on_dates and is_dtm(value))):
                continue
            result = self.value(rule.method, value, where, owner, rep, container, rule.options)
            holder[j] = "" if result is None else er7.escape(result, self.d)

    def value(self, m: str, value: str, where: str, owner: str | None, rep, container,
              options: dict | None = None) -> str | None:
        """One value through one method; None removes it. Values that do not fit the method are removed."""
        apply = self.VALUE_METHODS.get(m)
        if apply is None:
            raise InputError(f"{where}: method {m!r} does not apply to HL7v2 values")
        return apply(self, m, value, owner, rep, container, options or {})

    def _date(self, m: str, value: str, owner, rep, container, options: dict) -> str | None:
        try:
            full = dtm_full_date(value)
            if full:
                self.known.add(KnownIdentifier(full, "DATE"))
                if full in self.old_birth_days:  # the birth date of a patient aged 90 or more, wherever it stands
                    return None
            if m == "age90":
                return self._age90(value)
            out = dtm_year(value) if m == "year" else dtm_shift(value, self._offset(options))
        except (DTMError, dates.DateFormatError, ValueError):
            # a timestamp that is not standard (a sender's MSH-7 `2024-01-01T12:00`): its year where one reads
            out = readable_year(value) if m == "year" else None
            if out is None:
                return None
        self.written_dates.add((self._segment_number, out))
        return out

    def _zip3(self, m: str, value: str, owner, rep, container, options: dict) -> str | None:
        if any(ch.isdigit() for ch in value):
            self.known.add(KnownIdentifier(value, "GEOGRAPHIC_LOCATION"))
        return zipcodes.zip3(value)

    def _keyed(self, m: str, value: str, owner, rep, container, options: dict) -> str | None:
        if m == "pseudonym" and "namespace" in options:
            return self._token(value, options)
        return self._pseudonym(value, owner, rep, container, options if m == "fpe" else None)

    def _substitute(self, rule: Rule, leaves, where, owner, rep, seg, container) -> None:
        """A fixed value in the first leaf (the others emptied), or a keyed surrogate of the kind in every leaf."""
        options = rule.options
        category = options.get("category") or values.KIND_CATEGORY.get(options.get("kind", ""))
        for k, (holder, j) in enumerate(leaves):
            value = self._decoded(holder[j])
            if category and value.strip():
                self.known.add(KnownIdentifier(value, category))
            if "value" in options:
                holder[j] = er7.escape(str(options["value"]), self.d) if k == 0 else ""
            elif value.strip():
                holder[j] = er7.escape(values.surrogate(self.pseudo, options["kind"], value), self.d)

    def _generalize(self, rule: Rule, leaves, where, owner, rep, seg, container) -> None:
        """The first leaf by the cases; the others emptied (a code's text would tell the original). No match: kept
        or emptied (`otherwise`)."""
        first = self._decoded(leaves[0][0][leaves[0][1]])
        found = values.generalize(_number_or_text(first), rule.options["cases"]) if first.strip() else values.NO_MATCH
        if found is values.NO_MATCH and rule.options.get("otherwise", "remove") == "keep":
            return
        for k, (holder, j) in enumerate(leaves):
            holder[j] = er7.escape(_hl7_text(found), self.d) if k == 0 and found is not values.NO_MATCH else ""

    def _encrypt(self, rule: Rule, leaves, where, owner, rep, seg, container) -> None:
        """Every leaf encrypted in place under the vault key (AES-SIV, or FF3-1 keeping its shape: a value too
        short for it is removed)."""
        cipher = self.pseudo.cipher
        if cipher is None:
            raise InputError(f"{where}: the encrypt rule needs the vault key (--vault-key-file)")
        options = rule.options
        fmt = fpe_format({k: v for k, v in options.items() if k in ("alphabet", "keep_prefix", "check_digit")}) \
            if options.get("format") == "fpe" else None
        for holder, j in leaves:
            value = self._decoded(holder[j])
            if not value.strip():
                continue
            if "category" in options:
                self.known.add(KnownIdentifier(value, options["category"]))
            try:
                holder[j] = er7.escape(cipher.encrypt(value, fmt), self.d)
            except FpeFallback:
                holder[j] = ""

    def _perturb(self, m: str, value: str, owner, rep, container, options: dict) -> str | None:
        """Keyed noise on a number (a value that is none is removed); an age of 90 or more, before or after, is 90."""
        try:
            number = _number_or_text(value)
        except ValueError:
            return None
        if not isinstance(number, (int, float)):
            return None
        if options.get("age") and number >= 90:
            return "90"
        scope = options.get("scope", "patient")
        key = self.record_key if scope == "record" else (str(options.get("release", "")) if scope == "release"
                                                          else self.offset_key)
        noisy = values.perturb(self.pseudo, f"{owner or ''}|{key}", number, options)
        if options.get("age") and noisy >= 90:
            return "90"
        return str(noisy)

    # Every method of the contract (fhir_transforms/methods.py): a whole leaf set, or each value in turn.
    LEAF_METHODS = {"keep": _keep, "text": _text, "remove": _remove, "term": _term, "substitute": _substitute,
                    "generalize": _generalize, "encrypt": _encrypt}
    VALUE_METHODS = {"year": _date, "shift": _date, "age90": _date, "zip3": _zip3, "pseudonym": _keyed, "fpe": _keyed,
                     "perturb": _perturb}

    def _age90(self, value: str) -> str | None:
        if dtm_age(value, self.deid.clock()) >= 90:
            return None
        dtm = self._resolve(DTM_RULE)
        return dtm_year(value) if getattr(dtm, "method", "year") == "year" else dtm_shift(
            value, self._offset(getattr(dtm, "options", {})))

    def _offset(self, options: dict | None = None) -> int:
        """The rule's fixed `offset_days`, else the keyed offset of its scope: the patient (first PID-3), the
        record (MSH-10 as received) or the release."""
        options = options or {}
        if "offset_days" in options:
            return options["offset_days"]
        scope = options.get("scope", "patient")
        if scope == "record":
            return self.pseudo.day_offset(self.record_key, "record")
        if scope == "release":
            return self.pseudo.day_offset(str(options.get("release", "")), "release")
        return self.pseudo.day_offset(self.offset_key)

    def _token(self, value: str, options: dict) -> str:
        """The keyed pseudonym in a namespace the rule names (MSH-10: `control-id`), optionally one per sender
        (MSH-3 and MSH-4 as they stand), and cut to `length` hex characters (MSH-10 is at most 20 before v2.7)."""
        namespace = options["namespace"]
        sender = options.get("per_sender")
        if sender:
            msh = self.message.segments[0]
            app, facility = (5, 6) if sender == "receiver" else (3, 4)
            namespace = f"{namespace}|{msh.get(app)}|{msh.get(facility)}" if msh.sid == "MSH" else namespace
        return self.pseudo.token(namespace, value, int(options.get("length", 32)))

    def _pseudonym(self, value: str, owner: str | None, rep, container, fpe: dict | None = None) -> str | None:
        """CX-1 and EI-1 get the keyed identifier pseudonym, namespaced by the authority's FHIR system."""
        if container is not None:  # an EI inside a component (EIP): its parts are subcomponents
            parts = [self._decoded(s) for s in container]
            ns, uid, kind = (parts + ["", "", "", ""])[1:4]
            id_type = ""
        elif owner == "CX":
            hd = [self._decoded(s) for s in (rep[3] if len(rep) > 3 else [""])] + ["", "", ""]
            ns, uid, kind = hd[0], hd[1], hd[2]
            id_type = self._decoded(rep[4][0]) if len(rep) > 4 else ""
        else:
            parts = [self._decoded(c[0]) for c in rep] + ["", "", "", ""]
            ns, uid, kind = parts[1], parts[2], parts[3]
            id_type = ""
        if id_type.strip().upper() in self.profile.identifier_remove_types:
            return None
        system = identifier_system(self.profile, ns, uid, kind)
        if fpe is not None and selects(fpe, {id_type}):  # the FHIR `fpe` namespace and tweak: one MRN maps the same
            return self.pseudo.identifier_fpe(system, value, fpe_format(fpe))
        return self.pseudo.identifier(system, value)

    # --- known identifiers
    def _record(self, datatype: str, comps: list[list[str]], where: str) -> None:
        add = self.known.add

        def c(i: int) -> list[str]:
            return [s for s in comps[i - 1] if s.strip()] if len(comps) >= i else []

        if datatype in ("XPN", "XCN", "PPN"):
            first = 1 if datatype == "XPN" else 2
            # given, middle, family (with its subcomponents), each by its words with a letter
            parts = [p for p in map(name_words, c(first + 1) + c(first + 2) + c(first)) if p]
            subject = datatype == "XCN" and _field_key(where) in self.profile.subject_names
            if subject and c(1):
                add(KnownIdentifier(c(1)[0], "UNIQUE_IDENTIFIER"))
            if parts and (datatype == "XPN" or subject):
                add(KnownIdentifier(" ".join(parts), "NAME"))
                for part in parts if len(parts) > 1 else ():  # each a name in its own right, whatever word it
                    add(KnownIdentifier(part, "NAME"))        # spells (titles have their own components)
            elif parts:
                self.staff_names.add(" ".join(parts))
        elif datatype == "XON":
            self.org_names.update(v.strip().upper() for v in c(1))
        elif datatype == "NDL":
            parts = [p for p in map(name_words, c(1)[1:4]) if p]
            if parts:
                add(KnownIdentifier(" ".join(parts), "NAME"))
        elif datatype == "XAD":
            for i in (1, 2, 3, 5, 8, 9, 10):  # not XAD-4: Safe Harbor keeps the state
                for v in c(i):
                    if not SHORT_CODE_RE.fullmatch(v.strip()):  # short codes are not places
                        add(KnownIdentifier(v, "GEOGRAPHIC_LOCATION"))
            if len(c(1)) > 1:
                add(KnownIdentifier(" ".join(c(1)), "GEOGRAPHIC_LOCATION"))
        elif datatype == "XTN":
            category = "FAX_NUMBER" if (c(3) or [""])[0].upper() == "FX" else "PHONE_NUMBER"
            for v in c(1) + c(12):
                add(KnownIdentifier(v, category if "@" not in v else "EMAIL_ADDRESS"))
            for v in c(4):
                add(KnownIdentifier(v, "EMAIL_ADDRESS"))
            number = "".join((c(5) or [""])[0:1] + (c(6) or [""])[0:1] + (c(7) or [""])[0:1])
            if number:
                add(KnownIdentifier(number, category))
            if c(7):
                add(KnownIdentifier(c(7)[0], category))
        elif datatype == "CX":
            for v in c(1):
                id_type = (c(5) or [""])[0].upper()
                add(KnownIdentifier(v, self.profile.identifier_categories.get(id_type, "UNIQUE_IDENTIFIER")))

    # --- narrative
    def text(self, holder: list[str], j: int, where: str, owner: str | None, rep, seg: er7.Segment) -> None:
        raw = holder[j]
        decoded = self._decoded(raw)
        if is_calendar_dtm(decoded):  # a valid calendar date in a field we only know as text gets the date rule
            self._as_date(holder, j, decoded, where, owner, rep)
            return
        if owner == "ED" and where.endswith(".5"):
            self._payload(holder, j, where, rep)
            return
        note = self._note_for(seg, where)
        note.parts.append((holder, j))
        note.texts.append(decoded)

    def _as_date(self, holder: list[str], j: int, value: str, where: str, owner, rep) -> None:
        dtm = self._resolve(DTM_RULE)
        result = self.value(dtm.method, value, where, owner, rep, None) if isinstance(dtm, Rule) else None
        holder[j] = "" if result is None else er7.escape(result, self.d)

    def known_identifiers(self) -> tuple[tuple[KnownIdentifier, ...], tuple[KnownIdentifier, ...]]:
        """(for the text stack, for the leak guard): the known identifiers that identify alone
        (`identifying.identifying`), in a stable order; the guard's names without their short words. Staff
        names (XCN) are masked in text unless an organisation of the message bears the same name, but the guard
        does not look for them: they are not the patient's, and codes (a route "HAND", a department) often
        share a word with one."""
        msh = self.message.segments[0]
        routing = {t.strip().upper() for n in (3, 4, 5, 6) for t in ROUTING_SPLIT_RE.split(self._decoded(msh.get(n)))}
        orgs = self.org_names | routing
        staff = {KnownIdentifier(v, "NAME") for v in self.staff_names if v.strip().upper() not in orgs}
        patient = {k for k in self.known if identifying(k, routing)}
        text = patient | {k for k in staff if identifying(k, routing)}
        # the guard reads names less their one- and two-letter words (each part long enough is a known identifier
        # of its own): those spell table codes, an initial "BC" in a plan code "BC-CNY", a prefix "Mr" in "MR"
        guarded = set(map(_long_words, patient))
        return tuple(sorted(text, key=_value_and_category)), tuple(sorted(guarded, key=_value_and_category))

    def _note_for(self, seg: er7.Segment, where: str) -> Note:
        number = where.rsplit("-", 1)[-1].split(".")[0]
        if seg.sid == "NTE" and number == "3":
            # a comment's lines (its repetitions, and the NTE segments that follow) are one text: a name split
            # over two of them ("Kowa" ~ "lczyk") is read whole
            return self._run_note("NTE|3", where)
        if seg.sid == "OBX" and number == "5":
            vtype = self._decoded(seg.get(2)).strip().upper()
            if vtype in self.profile.narrative_types:
                return self._run_note(f"OBX|{seg.get(3)}|{seg.get(4)}|{vtype}", where)
        note = Note(where, write=self._write_leaves)
        self.notes.append(note)
        return note

    def _run_note(self, key: str, where: str) -> Note:
        """The note of the run of lines `key` names, open since an earlier segment, or a new one."""
        if self._open_note and self._open_note[0] == key:
            note = self._open_note[1]
            if self._segment_number > note.first:
                self.runs[note.first] = self._segment_number
            return note
        note = Note(where, write=self._write_leaves, first=self._segment_number)
        self.notes.append(note)
        self._open_note = (key, note)
        return note

    def _write_leaves(self, note: Note, spans: list[Span]) -> None:
        start = 0
        for (holder, j), text in zip(note.parts, note.texts):
            end = start + len(text)
            mine = [(max(s.start, start) - start, min(s.end, end) - start, f"[{s.category}]")
                    for s in spans if s.start < end and s.end > start]
            holder[j] = er7.rewrite(holder[j], self.d, mine)
            start = end + 1  # the "\n" that joined the lines

    def _payload(self, holder: list[str], j: int, where: str, rep) -> None:
        """ED-5: text payloads are decoded, scanned and re-encoded; anything else (PDF, images) is removed."""
        part = [self._decoded(c[0]).strip().upper() for c in rep] + ["", "", "", ""]
        data_type, subtype, encoding = part[1], part[2], part[3]
        textual = data_type == "TEXT" or subtype in TEXT_PAYLOAD_SUBTYPES or subtype.startswith("X-HL7-CDA")
        if not textual or encoding not in ("A", "BASE64", "HEX", ""):
            holder[j] = ""
            return
        raw = self._decoded(holder[j])
        try:
            data = base64.b64decode(raw, validate=True) if encoding == "BASE64" else (
                bytes.fromhex(raw) if encoding == "HEX" else None)
            codec = ed.payload_codec(data) if data is not None else None
            text = raw if data is None else data.decode(codec)
        except (ValueError, LookupError):
            raise InputError(f"{where}: encapsulated data is not valid {encoding.lower() or 'text'} in the "
                             "character set it declares") from None

        def write(note: Note, spans: list[Span]) -> None:
            out = replace.apply(note.texts[0], spans)
            if encoding == "BASE64":
                holder[j] = base64.b64encode(ed.encode(out, codec)).decode()
            elif encoding == "HEX":
                holder[j] = ed.encode(out, codec).hex().upper()
            else:
                holder[j] = er7.escape(out, self.d)

        self.notes.append(Note(where, [(holder, j)], [text], write))

    def _decoded(self, raw: str) -> str:
        return er7.decode(raw, self.d)[0] if self.d.escape in raw else raw


def _patient_key(message: er7.Message, profile: HL7Profile) -> str:
    """Whose date offset applies (longitudinal): the first PID-3 identifier, by its FHIR system and value."""
    pid = message.first("PID")
    if not pid:
        return ""
    d = message.delimiters
    first = pid.get(3).split(d.repetition)[0].split(d.component)
    value = er7.decode(first[0], d)[0]
    hd = (er7.decode(first[3], d)[0].split(d.subcomponent) if len(first) > 3 else []) + ["", "", ""]
    return f"{identifier_system(profile, hd[0], hd[1], hd[2])}|{value}"


check_implemented("HL7v2", {**MessageWalk.LEAF_METHODS, **MessageWalk.VALUE_METHODS})


@dataclass
class HL7Deidentifier:
    """Profile, pseudonyms, text stack and clock: everything an HL7v2 message needs (the MLLP edge uses it too)."""

    profile: HL7Profile
    pseudo: Pseudonymizer
    stack: TextStack
    clock: Callable[[], date] = dates.today
    terms: TextStack = field(default_factory=known_identifiers_only)  # what kept coded text is searched with
    charset: str = ""  # the codec of messages whose MSH-18 is empty (--charset), else the profile's
    # per rule (by identity: the profile's own objects, held here so that an id is never another's), worked out
    # once: what `run` does with a field, the resolved rule of each component of a datatype, OBX-5 age rules
    _kinds: dict[int, tuple[Rule, str]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _components: dict[int, tuple[Datatype, tuple]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _age_rules: dict[int, tuple[Rule, Rule]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _plans: dict[tuple[str, str], dict[int, tuple[Rule, str]]] = field(default_factory=dict, init=False, repr=False,
                                                                      compare=False)

    @classmethod
    def from_names(cls, profile: str, pseudo: Pseudonymizer, stack: TextStack,
                   clock: Callable[[], date] = dates.today) -> HL7Deidentifier:
        return cls(load_hl7_profile(profile), pseudo, stack, clock)

    def field_plans(self, version: str, sid: str) -> dict[int, tuple[Rule, str]]:
        """(rule, `field_kind`) of each field of `sid` in `version` worked out so far, by field number: filled by
        `MessageWalk`, so that a field's rule is looked up once per segment id, not once per message."""
        return self._plans.setdefault((version, sid), {})

    def field_kind(self, rule: Rule) -> str:
        """What `MessageWalk.run` does with a field ruled by `rule`: CONDITIONAL (a site rule's condition), KEEP,
        CHECKED (kept, and checked for the patient's identifiers), CLEARS (every leaf emptied and nothing
        recorded: a plain `remove`, or a datatype `_record` does not read whose every component is one), or WALK."""
        return _once(self._kinds, rule, self._field_kind)

    def _field_kind(self, rule: Rule) -> str:
        if rule.where is not None:
            return CONDITIONAL
        target = self.profile.resolve(rule)
        if isinstance(target, Rule) and target.method == "keep":
            return CHECKED if target.options.get("checked") else KEEP
        if isinstance(target, Datatype):
            clears = (target.name not in RECORDED_TYPES and not target.components
                      and _plain_remove(self.profile.resolve(target.default)))
        else:
            clears = _plain_remove(target)
        return CLEARS if clears else WALK

    def components(self, datatype: Datatype) -> tuple[tuple, tuple]:
        """((resolved rule, REMOVE, KEEP or WALK) of each listed component, in order, then the same of the
        datatype's default for the components after them)."""
        return _once(self._components, datatype, self._component_kinds)

    def _component_kinds(self, datatype: Datatype) -> tuple[tuple, tuple]:
        listed = tuple(self._component_kind(datatype.components.get(i, datatype.default))
                       for i in range(1, max(datatype.components, default=0) + 1))
        return listed, self._component_kind(datatype.default)

    def _component_kind(self, rule: Rule) -> tuple[Rule | Datatype, str]:
        sub = self.profile.resolve(rule)
        return sub, REMOVE if _plain_remove(sub) else KEEP if _plain_keep(sub) else WALK

    def age_perturb(self, nm: Rule) -> Rule:
        """The OBX-5 rule of an age in years where the profile perturbs numbers (NM): the NM rule's, as an age."""
        return _once(self._age_rules, nm, lambda rule: Rule(method="perturb", options={**rule.options, "age": True}))

    def read(self, data: bytes) -> er7.Decoded:
        """HL7v2 bytes as text (`message.read_bytes`): where MSH-18 is empty, in the channel's character set (`charset`,
        else the site rules file's), else only as UTF-8."""
        return er7.read_bytes(data, self.charset or self.profile.charset)

    def deidentify(self, message: str) -> str:
        """One ER7 message in, its de-identified ER7 out (segments ended by \\r).

        InputError when it is not one parseable message; RecordRefused when a detector failed or a known
        identifier survived. Messages name segments, fields and categories, never values.
        """
        return self._message(er7.parse_message(message), "message")

    def deidentify_with_findings(self, message: str) -> HL7Result:
        """`deidentify`, and where the text stack found PHI (paths within the message)."""
        findings: list[Finding] = []
        return HL7Result(self._message(er7.parse_message(message), "message", findings, ""), tuple(findings))

    def deidentify_file_text(self, text: str) -> str:
        """Every message of a file (and its FHS/BHS/BTS/FTS envelope), de-identified, in order."""
        return self.deidentify_file(text).text

    def deidentify_file(self, text: str) -> HL7Result:
        """`deidentify_file_text`, and where the text stack found PHI (`message N/` before each path). The
        envelope's segments are read with the known identifiers of every message of the file (those they
        wrap): a patient's name in a batch header's or trailer's free text (FHS-9, BHS-9, BTS-2) is a known name."""
        items = er7.parse_text(text)
        out: list[str] = [""] * len(items)
        found: list[list[Finding]] = [[] for _ in items]
        wrapped: set[KnownIdentifier] = set()
        n = 0
        for i, item in enumerate(items):
            if not item.envelope:
                n += 1
                where = f"message {n}"
                out[i], known = self._deidentified(item, where, found[i], where + "/")
                wrapped.update(known)
        linked = tuple(sorted(wrapped, key=_value_and_category))
        for i, item in enumerate(items):
            if item.envelope:
                where = f"envelope {item.segments[0].sid}"
                out[i] = self._deidentified(item, where, found[i], where + "/", linked)[0]
        return HL7Result("".join(out), tuple(f for item_found in found for f in item_found))

    def _message(self, message: er7.Message, where: str, findings: list[Finding] | None = None, at: str = "") -> str:
        return self._deidentified(message, where, findings, at)[0]

    def _deidentified(self, message: er7.Message, where: str, findings: list[Finding] | None = None, at: str = "",
                      linked: tuple[KnownIdentifier, ...] = ()) -> tuple[str, tuple[KnownIdentifier, ...]]:
        """(the message's output, the known identifiers its leak guard read), its findings added to `findings`
        (their paths after `at`); `linked`: the known identifiers of other messages (an envelope's), masked in
        its text and read by its guard as its own."""
        before = message.ids()
        known: set[KnownIdentifier] = set()
        walk = MessageWalk(self, message, known)
        walk.run()
        known_ids, guarded = walk.known_identifiers()
        if linked:
            known_ids = tuple(sorted({*known_ids, *linked}, key=_value_and_category))
            guarded = tuple(sorted({*guarded, *linked}, key=_value_and_category))
        written = self.write_notes(walk, known_ids, guarded, where, at)
        if findings is not None:
            findings.extend(written[0] + written[1])
        walk.remove_kept_identifiers(guarded)
        walk.finish()
        out = er7.fit_charset(message)  # the output as written; the guard reads its fields
        refuse_leaks(where, guard(message, self.profile, walk, guarded))
        if not message.envelope:
            try:
                er7.check_output(before, out)
            except RuntimeError as e:
                raise RecordRefused(f"{where}: {e} (a bug; nothing written)") from None
        return out, guarded

    def write_notes(self, walk: MessageWalk, known_ids: tuple[KnownIdentifier, ...], guarded: tuple[KnownIdentifier, ...],
                    where: str, at: str) -> tuple[list[Finding], list[Finding]]:
        """Run the text stack over the walk's notes (one batch) and write each back; (the notes' findings, the
        coded terms' findings), their paths after `at`."""
        notes = [n for n in walk.notes if not n.known_only]
        terms = [n for n in walk.notes if n.known_only]
        try:
            found = self.stack.detect_many([n.text for n in notes], known_ids)
            found += self.terms.detect_many([n.text for n in terms], known_ids) if terms else []
        except DetectorError as e:
            raise RecordRefused(f"{where}: text detector failed: {e}") from None
        personal_words = words_of_names(guarded) if terms else frozenset()
        written: tuple[list[Finding], list[Finding]] = ([], [])
        for k, (note, spans) in enumerate(zip(notes + terms, found)):
            if k >= len(notes) and spans:  # a coded term: a staff member's word alone stays (as the guard reads)
                spans = without_staff_words(note.text, spans, personal_words)
            note.write(note, spans)
            written[k >= len(notes)].extend(Finding(at + note.where, span) for span in spans)
        return written


def guard(message: er7.Message, profile: HL7Profile, walk: MessageWalk, guarded: tuple[KnownIdentifier, ...],
          start: int = 1) -> tuple[list[leak_guard.Leak], list[leak_guard.Leak]]:
    """The leak guard over the output's segments (numbered from `start`): (known identifiers, known dates with
    a time) that survived, read with coding systems and HD parts, and again without them where that finds
    something (most messages never get there)."""
    leaks = _leaks(message, profile, walk.version, walk.written_dates, guarded, skip_codes=False, start=start)
    if leaks[0] or leaks[1]:
        leaks = _leaks(message, profile, walk.version, walk.written_dates, guarded, skip_codes=True, start=start)
    return leaks


def refuse_leaks(where: str, found: tuple[list[leak_guard.Leak], list[leak_guard.Leak]]) -> None:
    """LeakFound naming the first five leaks (each list in the guard's order: by path), when there is one."""
    leaks = sorted(found[0], key=lambda leak: (leak.path, leak.category)) + sorted(found[1], key=lambda leak: leak.path)
    if leaks:
        shown = "; ".join(str(leak) for leak in leaks[:5])
        raise LeakFound(f"{where}: leak guard refused the output: {len(leaks)} known identifier(s) survived: {shown}")


def _leaks(message: er7.Message, profile: HL7Profile, version: str, written_dates: set[tuple[int, str]],
           guarded: tuple[KnownIdentifier, ...], skip_codes: bool,
           start: int = 1) -> tuple[list[leak_guard.Leak], list[leak_guard.Leak]]:
    """The leak guard over the output (`_output_strings`): known identifiers, and known dates with a time.
    Reading every field first, one search of the texts segment by segment (`_guard_texts`); the fields and
    their paths are read only when it finds something (most messages: never)."""
    if not skip_codes:
        texts = _guard_texts(message, profile, version, written_dates, start)
        if leak_guard.clean(texts, guarded) and not holds_known_day(texts, guarded):
            return [], []
    strings = _output_strings(message, profile, version, written_dates, skip_codes, start)
    return leak_guard.scan(strings, guarded), dates_with_time(strings, guarded)


def _long_words(known: KnownIdentifier) -> KnownIdentifier:
    """A name without its words of fewer than MIN_CHARACTERS letters; a name of short words only ("Li Wu": no
    part of it is looked for on its own), and any other known identifier, as it is."""
    if known.category != "NAME":
        return known
    words = known.value.split()
    long = [w for w in words if len(w.strip(".,")) >= MIN_CHARACTERS]
    return known if len(long) in (0, len(words)) else KnownIdentifier(" ".join(long), "NAME")


def _slot(rep: list[list[str]], c: int, j: int) -> bool:
    """Whether subcomponent `j` (from 0) of component `c` (from 1) of a rep holds a value already."""
    return len(rep) >= c and len(rep[c - 1]) > j and rep[c - 1][j] != ""


def _field_key(where: str) -> str:
    """`QRD.8` for a place `QRD[2]-8.1`."""
    sid, _, rest = where.partition("[")
    return f"{sid}.{rest.split('-', 1)[-1].split('.')[0]}"


def _number_or_text(value: str):
    """An HL7 NM value as a number (int when it has no point); any other value as it is."""
    text = value.strip()
    if INTEGER_RE.fullmatch(text):
        return int(text)
    if DECIMAL_RE.fullmatch(text):
        return float(text)
    return value


def _hl7_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _over_89(years: float, comparator: str) -> bool:
    """An age in the category 90+: 90 years or more, or more than 89 (completed years)."""
    return years >= 90 or (comparator == ">" and years >= 89)


def _code_beside(where: str, rep) -> bool:
    """Whether the component (or subcomponent) before a text component at `where` (`...-3.2`) holds a code."""
    last = where.rsplit(".", 1)[-1] if "." in where.rsplit("-", 1)[-1] else ""
    i = int(last) if last.isdigit() else 0
    return i >= 2 and len(rep) >= i - 1 and any(v.strip() and v != '""' for v in rep[i - 2])


def _plain_remove(target: Rule | Datatype) -> bool:
    return isinstance(target, Rule) and target.method == "remove" and "category" not in target.options


def _plain_keep(target: Rule | Datatype) -> bool:
    return isinstance(target, Rule) and target.method == "keep" and not target.options.get("checked")


def _once(cache: dict[int, tuple], key, make: Callable):
    """`make(key)`, worked out once per object `key` (by identity: rules compare without their options; the
    object is held beside its answer, so that its id is never another's)."""
    found = cache.get(id(key))
    if found is None:
        found = cache[id(key)] = (key, make(key))
    return found[1]


@lru_cache(maxsize=64)
def _not_separators(d: er7.Delimiters) -> re.Pattern:
    """Runs of characters other than the repetition, component and subcomponent separators."""
    return re.compile(f"[^{re.escape(d.repetition + d.component + d.subcomponent)}]+")


def _fields(seg: er7.Segment):
    """(field number, raw value) of each field present; a header's MSH-1/MSH-2 (its delimiters) are not fields here."""
    if seg.sid in er7.HEADERS:
        return enumerate(seg.parts[2:], 3)
    return enumerate(seg.parts[1:], 1)


def _output_strings(message: er7.Message, profile: HL7Profile, version: str,
                    written_dates: set[tuple[int, str]] = frozenset(), skip_codes: bool = True,
                    start: int = 1) -> list[tuple[str, str]]:
    """Every field of the output that can hold patient data, as the leak guard reads it: leaves unescaped,
    ED text payloads decoded. Not read: the profile's `leak_guard_skip` fields, the coding-system and HD
    components of `leak_guard_skip_components`, and the dates a date rule wrote (a shifted date may land
    on another date of the same message)."""
    written_in = _written_in(written_dates)
    return [found for k, seg in enumerate(message.segments, start)
            for found in _segment_strings(seg, k, message.delimiters, profile, version, written_in.get(k), skip_codes)]


def _guard_texts(message: er7.Message, profile: HL7Profile, version: str, written_dates: set[tuple[int, str]],
                 start: int = 1) -> list[str]:
    """The texts of `_output_strings(..., skip_codes=False)` without their paths, a segment at a time where it
    can be: a segment with no field the guard skips, nothing to unescape and no ED payload is one text, its
    fields apart as its leaves are (LEAF_SEPARATOR), without the leaves that are dates a rule wrote there. No
    known form or date shape holds a NUL, or ends or starts with what separates texts, so the guard finds a
    known identifier or day in these exactly where it finds one in those."""
    d = message.delimiters
    written_in = _written_in(written_dates)
    skipping = profile.guard_skip_segments
    texts = []
    for k, seg in enumerate(message.segments, start):
        line = "" if seg.sid in skipping or seg.sid in er7.HEADERS else LEAF_SEPARATOR.join(seg.parts[1:])
        if not line or d.escape in line or (seg.sid == "OBX" and seg.get(2).upper().startswith("ED")):
            texts.extend(text for _, text in _segment_strings(seg, k, d, profile, version, written_in.get(k), False))
            continue
        text = er7.to_leaf_separators(line, d, LEAF_SEPARATOR)
        written = written_in.get(k)
        if written and any(w in text for w in written):
            text = LEAF_SEPARATOR.join(v for v in text.split(LEAF_SEPARATOR) if v not in written)
        texts.append(text)
    return texts


def _written_in(written_dates: set[tuple[int, str]]) -> dict[int, set[str]]:
    """The dates a date rule wrote, by segment number."""
    written_in: dict[int, set[str]] = {}
    for k, value in written_dates:
        written_in.setdefault(k, set()).add(value)
    return written_in


def _segment_strings(seg: er7.Segment, k: int, d: er7.Delimiters, profile: HL7Profile, version: str,
                     written: set[str] | None, skip_codes: bool) -> list[tuple[str, str]]:
    """`_output_strings` of segment number `k`, given the dates a rule wrote there."""
    strings = []
    readings = profile.guard_readings(seg.sid, version)
    for n, raw in _fields(seg):
        if not raw:
            continue
        skipped, skip = readings.get(n) or profile.guard_reading(seg.sid, n, version)
        if skipped:
            continue
        skip = skip if skip_codes else None
        path = f"{seg.sid}[{k}]-{n}"
        ed_field = seg.sid == "OBX" and n == 5 and seg.get(2).upper().startswith("ED")
        if skip and raw.count(d.component) < min(skip) - 1:
            skip = None  # no component to skip: read the field as it stands
        if d.escape not in raw and not ed_field and not skip and not (written and any(w in raw for w in written)):
            strings.append((path, er7.to_leaf_separators(raw, d, LEAF_SEPARATOR)))  # nothing to unescape
            continue
        leaves = [er7.decode(s, d)[0] for r in er7.split_field(raw, d)
                  for i, c in enumerate(r, 1) if not (skip and i in skip) for s in c]
        strings.append((path, LEAF_SEPARATOR.join(v for v in leaves if not written or v not in written)))
        if ed_field:
            strings.extend((path, text) for leaf in leaves if (text := ed.payload_text(leaf)) is not None)
    return strings
