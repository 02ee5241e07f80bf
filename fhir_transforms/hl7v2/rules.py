"""HL7v2 profiles (mappings/hl7v2/*.yaml) and the HL7 forms of the shared value functions.

Rules use the FHIR method vocabulary (remove, keep, year, shift, pseudonym, zip3, age90, text, term); a rule may
also name a datatype whose components have their own rules. Values are transformed by fhir_transforms:
the one keyed pseudonym, `dates.year_only`/`dates.shift` through the DTM adapter below, `zipcodes.zip3`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import date
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Callable, Iterable


from fhir_transforms import dates
from fhir_transforms import safe_harbor_gaps as gaps
from fhir_transforms.hl7v2.message import charset_codec
from fhir_transforms.hl7v2.standard import datatype_names, defined_fields, field_type, table_components
from fhir_transforms.methods import HL7V2, METHODS
from fhir_transforms.rules import SAFE_HARBOR, ProfileError, check_options, read_profile_file
from fhir_transforms.site_rules import RulesFileError, SiteRules, as_rules_error, merge
import mappings

MAPPINGS = Path(mappings.__file__).resolve().parent / "hl7v2"
# YYYY[MM[DD[HH[MM[SS[.S[S[S[S]]]]]]]]][+/-ZZZZ]
DTM_RE = re.compile(r"^(?P<date>\d{4}(?:\d{2}(?:\d{2})?)?)(?P<time>(?:\d{2}(?:\d{2}(?:\d{2}(?:\.\d{1,4})?)?)?)?)"
                    r"(?P<tz>[+-]\d{4})?$")
CALENDAR_DTM_RE = re.compile(r"^(?P<y>\d{4})(?P<m>\d{2})(?P<d>\d{2})(?P<time>(?:\d{2}|\d{4}|\d{6}(?:\.\d{1,4})?)?)"
                             r"(?P<tz>[+-]\d{4})?$")

LEADING_YEAR_RE = re.compile(r"\s*(\d{4})")
YEAR_RE = re.compile(r"(?<!\d)(\d{4})(?!\d)")


class DTMError(ValueError):
    """A value is not an HL7 DT/DTM (the message never quotes it)."""


def _dtm(value: str) -> re.Match:
    m = DTM_RE.match(value.strip())
    if not m or (m.group("time") and len(m.group("date")) < 8):
        raise DTMError("not an HL7 DTM value")
    return m


def dtm_to_fhir_date(value: str) -> str:
    """`19880818...` → `1988-08-18` (the precision the date part has)."""
    d = _dtm(value).group("date")
    return "-".join(x for x in (d[:4], d[4:6], d[6:8]) if x)


def dtm_year(value: str) -> str:
    """Year only: `198808181126+0215` → `1988`."""
    return dates.year_only(dtm_to_fhir_date(value))


def readable_year(value: str) -> str | None:
    """The year of a timestamp that is not an HL7 DTM (`2024-01-01T12:00`, `20240101 1200`, `01/02/2024`): its
    first four digits, else its one four-digit group, when that is a year 1800-2199; else None."""
    m = LEADING_YEAR_RE.match(value)
    years = [m.group(1)] if m else YEAR_RE.findall(value)
    return years[0] if len(years) == 1 and 1800 <= int(years[0]) <= 2199 else None


def dtm_shift(value: str, days: int) -> str:
    """Shift the date part by `days`; time, fractional seconds and offset are kept, and so is the precision."""
    m = _dtm(value)
    shifted = dates.shift(dtm_to_fhir_date(value), days).replace("-", "")
    return shifted + m.group("time") + (m.group("tz") or "")


def dtm_full_date(value: str) -> str | None:
    """The ISO calendar day of a DTM with day precision (a known identifier for the text stack), else None."""
    try:
        d = _dtm(value).group("date")
    except DTMError:
        return None
    return f"{d[:4]}-{d[4:6]}-{d[6:8]}" if len(d) == 8 else None


def dtm_age(value: str, on: date) -> int:
    return dates.age_in_years(dtm_to_fhir_date(value), on)


def is_dtm(value: str) -> bool:
    try:
        _dtm(value)
    except DTMError:
        return False
    return len(value.strip()) >= 6


def is_calendar_dtm(value: str, with_time: bool = False) -> bool:
    """A whole value that is a real day (`YYYYMMDD`, year 1800-2199) with a valid time and offset if any:
    `76164006` (SNOMED) is not, `20141006092900+0700` is. `with_time`: only a date with a time or an offset."""
    m = CALENDAR_DTM_RE.match(value.strip())
    if not m or not 1800 <= int(m["y"]) <= 2199 or (with_time and not (m["time"] or m["tz"])):
        return False
    try:
        date(int(m["y"]), int(m["m"]), int(m["d"]))
    except ValueError:
        return False
    t = m["time"]
    return (not t or (int(t[:2]) < 24 and (len(t) < 4 or int(t[2:4]) < 60) and (len(t) < 6 or int(t[4:6]) < 61))) \
        and (not m["tz"] or (int(m["tz"][1:3]) <= 14 and int(m["tz"][3:]) < 60))


@dataclass(frozen=True)
class Rule:
    """A method, or a datatype (`type`) whose components are ruled in the profile's `datatypes`."""

    method: str | None = None
    type: str | None = None
    options: dict = field(default_factory=dict, hash=False, compare=False)
    # a field rule's condition: (component number, the values it may hold); false: `otherwise` applies
    where: tuple[int, frozenset[str]] | None = field(default=None, hash=False, compare=False)
    otherwise: "Rule | None" = field(default=None, hash=False, compare=False)
    beneath: "Rule | None" = field(default=None, hash=False, compare=False)  # the packaged field rule it overrides


@dataclass(frozen=True)
class Datatype:
    name: str
    components: dict[int, Rule]
    default: Rule


@dataclass(frozen=True)
class QueryParameters:
    """One query's parameters (QPD-3 on) by its conformance statement: a rule per field, and the fields of
    `@SEG.n^value` pairs (QIP)."""

    fields: dict[int, Rule]
    pairs: frozenset[int] = frozenset()


QIP = "QIP"  # a query parameter of field-named pairs, in a profile's `queries`


@dataclass
class HL7Profile:
    name: str
    version: str
    fields: dict[str, Rule]
    datatypes: dict[str, Rule | Datatype]
    unknown_segment: Rule
    unlisted_datatype: Rule
    observation_values: dict[str, Rule]
    observation_ages: frozenset[str]
    observation_age_types: frozenset[str]
    observation_age_units: dict[str, float]  # unit → how many make a year
    narrative_types: frozenset[str]
    identifier_remove_types: frozenset[str]
    identifier_categories: dict[str, str]
    authorities: dict[str, str]
    key_id_field: str
    leak_guard_skip: frozenset[str] = frozenset()
    leak_guard_skip_components: dict[str, frozenset[int]] = field(default_factory=dict)
    queries: dict[str, QueryParameters] = field(default_factory=dict)  # by QPD-1.1, upper case
    subject_names: frozenset[str] = frozenset()  # SEG.n of XCN fields that name the patient queried (QRD-8)
    subject_values: frozenset[str] = frozenset()  # SEG.n whose every value is about that patient (QRF-5)
    charset: str = ""  # the codec of messages whose MSH-18 is empty (a site rules file's `charset`), else UTF-8 only
    rules_sha256: str = ""  # a site rules file's hash (fhir_transforms/site_rules.py); "" for a packaged profile
    safe_harbor_gaps: tuple = ()  # the rules that keep more than Safe Harbor allows (fhir_transforms/safe_harbor_gaps.py)
    # lookups repeat for every field of every message: each answer is worked out once
    _rules: dict[tuple[str, str, int], Rule] = field(default_factory=dict, repr=False)
    _resolved: dict[str, Rule | Datatype] = field(default_factory=dict, repr=False)  # by datatype name
    _guard: dict[tuple[str, str], dict[int, tuple[bool, frozenset[int] | None]]] = field(default_factory=dict,
                                                                                         repr=False)

    @property
    def methods(self) -> set[str]:
        """The methods the profile's rules use (in fields, datatypes and their components, observation values)."""
        rules = [*self.fields.values(), *self.observation_values.values(), self.unknown_segment, self.unlisted_datatype]
        for dt in self.datatypes.values():
            rules.extend([*dt.components.values(), dt.default] if isinstance(dt, Datatype) else [dt])
        return {r.method for r in rules if r.method}

    def rule(self, sid: str, n: int, version: str) -> Rule:
        """The rule for field `n` of segment `sid` in a standard version: listed in `fields`, else its
        datatype's in that version, else `unknown_segment` (Z-segments, fields the version does not define)."""
        found = self._rules.get((version, sid, n))
        if found is None:
            found = self.fields.get(f"{sid}.{n}")
            if found is None or found.where is not None:
                datatype = field_type(version, sid, n)
                if datatype is None:
                    by_type = self.unknown_segment
                else:
                    by_type = Rule(type=datatype) if datatype in self.datatypes else self.unlisted_datatype
                found = by_type if found is None else replace(found, otherwise=found.beneath or by_type)
            self._rules[(version, sid, n)] = found
        return found

    def datatype_of(self, sid: str, n: int, version: str) -> str | None:
        """The datatype a field's rule names, else the standard's (the leak guard skips by it)."""
        listed = self.fields.get(f"{sid}.{n}")
        return listed.type if listed is not None and listed.type else field_type(version, sid, n)

    @cached_property
    def guard_skip_segments(self) -> frozenset[str]:
        """The segment ids with a field in `leak_guard_skip`."""
        return frozenset(key.split(".")[0] for key in self.leak_guard_skip)

    def guard_readings(self, sid: str, version: str) -> dict[int, tuple[bool, frozenset[int] | None]]:
        """How the leak guard reads the fields of `sid` that `guard_reading` answered, by field number: the
        answers worked out so far (one dictionary per segment id and version, looked up once per segment)."""
        return self._guard.setdefault((version, sid), {})

    def guard_reading(self, sid: str, n: int, version: str) -> tuple[bool, frozenset[int] | None]:
        """How the leak guard reads field `n` of `sid`: (skipped whole, the components it skips when it skips
        coding systems, HD parts and table values (hl7apy's ID and IS components), else None)."""
        readings = self.guard_readings(sid, version)
        found = readings.get(n)
        if found is None:
            datatype = self.datatype_of(sid, n, version) or ""
            skip = self.leak_guard_skip_components.get(datatype, frozenset()) | table_components(version).get(
                datatype, frozenset())  # table codes (CX-5 "MR") are no person's name part ("Mr")
            found = readings[n] = (f"{sid}.{n}" in self.leak_guard_skip, skip or None)
        return found

    def datatype(self, name: str) -> Rule | Datatype:
        try:
            return self.datatypes[name]
        except KeyError:
            raise ProfileError(f"{self.name}: unknown datatype {name!r}") from None

    def resolve(self, rule: Rule) -> Rule | Datatype:
        """A method rule as it is, or the datatype a rule names (followed through datatypes that name another)."""
        if not rule.type:
            return rule  # not cached: rules compare without their options
        found = self._resolved.get(rule.type)  # the answer depends on the name alone (a str hashes once)
        if found is None:
            found, seen = rule, 0
            while isinstance(found, Rule) and found.type and seen < 8:
                found, seen = self.datatype(found.type), seen + 1
            self._resolved[rule.type] = found
        return found


def _rule(spec, where: str, datatypes: set[str]) -> Rule:
    if isinstance(spec, str):
        spec = {"method": spec} if spec in METHODS else {"type": spec}
    if "type" in spec:
        if spec["type"] not in datatypes:
            raise ProfileError(f"{where}: unknown datatype {spec['type']!r}")
        return Rule(type=spec["type"], options={k: v for k, v in spec.items() if k != "type"})
    method = spec.get("method")
    if method not in METHODS:
        raise ProfileError(f"{where}: unknown method {method!r} (known: {', '.join(sorted(METHODS))})")
    options = {k: v for k, v in spec.items() if k not in ("method", "where")}
    check_options(method, options, where, HL7V2)
    if method == "pseudonym" and options:
        _check_token_options(options, where)
    condition = spec.get("where")
    if condition is not None:
        condition = (int(condition["component"]), frozenset(str(v) for v in condition["in"]))
    return Rule(method=method, options=options, where=condition)


def _check_token_options(options: dict, where: str) -> None:
    """`pseudonym` with a `namespace` (and optionally `per_sender`, `length`) gives a keyed token, not an identifier."""
    unknown = set(options) - {"namespace", "per_sender", "length"}
    if options.get("per_sender", False) not in (True, False, "receiver"):
        raise ProfileError(f"{where}: per_sender is true, false or receiver")
    if unknown or not isinstance(options.get("namespace"), str) or not options["namespace"]:
        raise ProfileError(f"{where}: pseudonym takes namespace (text), per_sender and length; got {sorted(options)}")
    length = options.get("length", 32)
    if not isinstance(length, int) or not 16 <= length <= 64:
        raise ProfileError(f"{where}: pseudonym length must be 16 to 64 hex characters")


SECTIONS = ("fields", "datatypes")  # the rule tables a profile or site rules file merges key by key


@lru_cache(maxsize=None)
def load_hl7_profile(name: str) -> HL7Profile:
    """Read and check an HL7v2 profile by name; every method and datatype it names must be known."""
    profile = hl7_profile_from_doc(read_profile_file(MAPPINGS, name, SECTIONS), lambda *keys: f"{name}: {'.'.join(keys)}")
    return with_safe_harbor_gaps(profile) if name != SAFE_HARBOR else profile


def with_safe_harbor_gaps(profile: HL7Profile, dropped: dict[str, Iterable[str]] | None = None) -> HL7Profile:
    """The profile, knowing which of its field and datatype rules keep more than the packaged safe-harbor
    profile's (and which of those a site file dropped): outputs of a profile with gaps are not labelled Safe Harbor."""
    baseline = load_hl7_profile(SAFE_HARBOR)
    found = []
    for section in SECTIONS:
        found += gaps.compare(f"hl7v2.{section}", getattr(profile, section), getattr(baseline, section))
        found += gaps.dropped(f"hl7v2.{section}", (dropped or {}).get(section, ()), getattr(baseline, section))
    found += gaps.compare("hl7v2", {"unknown_segment": profile.unknown_segment, "unlisted_datatype": profile.unlisted_datatype},
                          {"unknown_segment": baseline.unknown_segment, "unlisted_datatype": baseline.unlisted_datatype})
    profile.safe_harbor_gaps = tuple(found)
    return profile


def hl7_site_profile(site: SiteRules) -> HL7Profile:
    """The packaged HL7v2 profile the site rules file extends, with its `hl7v2` part merged in: every field
    it rules is one some version of the standard defines, or a Z-segment's; every datatype one it defines."""
    part = site.section("hl7v2")
    problems = []
    for key in part.get("fields") or {}:
        sid, n = key.split(".")
        if not sid.startswith("Z") and (sid, int(n)) not in defined_fields():
            problems.append(f"{site.at('hl7v2', 'fields', key)}: hl7v2.fields.{key}: no version of HL7v2 "
                            f"(2.1-2.8.2) defines {sid}-{n}, and {sid} is no Z-segment")
    doc = merge(read_profile_file(MAPPINGS, site.extends, SECTIONS), part, SECTIONS)
    for key in part.get("datatypes") or {}:
        if key not in datatype_names() and key not in read_profile_file(MAPPINGS, site.extends, SECTIONS)["datatypes"]:
            problems.append(f"{site.at('hl7v2', 'datatypes', key)}: hl7v2.datatypes.{key}: no version of HL7v2 "
                            "has this datatype")
    if problems:
        raise RulesFileError("\n".join(problems))

    def where(*keys: str) -> str:
        if keys[0] in SECTIONS and keys[1] in (part.get(keys[0]) or {}):
            return f"{site.at('hl7v2', *keys)}: hl7v2.{'.'.join(keys)}"
        return f"{site.extends}: {'.'.join(keys)}"
    with as_rules_error():
        profile = hl7_profile_from_doc(doc, where, site.sha256)
    packaged = load_hl7_profile(site.extends).fields
    for key in part.get("fields") or {}:  # where its condition is false, the packaged rule of the field comes next
        rule = profile.fields.get(key)
        if rule is not None and rule.where is not None and key in packaged:
            profile.fields[key] = replace(rule, beneath=packaged[key])
    return with_safe_harbor_gaps(profile, {section: [k for k, v in (part.get(section) or {}).items() if v is None]
                                           for section in SECTIONS})


def hl7_profile_from_doc(doc: dict, where_of: Callable[..., str], rules_sha256: str = "") -> HL7Profile:
    """An HL7v2 profile from its merged YAML; `where_of(section, key, ...)` names a rule in error messages."""
    names = set(doc.get("datatypes", {}))
    datatypes: dict[str, Rule | Datatype] = {}
    for dt, spec in doc.get("datatypes", {}).items():
        where = where_of("datatypes", str(dt))
        if isinstance(spec, dict) and "method" not in spec and "type" not in spec:
            comps = {int(k): _rule(v, f"{where}.{k}", names) for k, v in spec.items() if str(k).isdigit()}
            datatypes[dt] = Datatype(dt, comps, _rule(spec.get("default", "remove"), f"{where}.default", names))
        else:
            datatypes[dt] = _rule(spec, where, names)
    fields = {}
    for path, spec in doc.get("fields", {}).items():
        if not re.fullmatch(r"[A-Z][A-Z0-9]{2}\.\d+", path):
            raise ProfileError(f"{where_of('fields', path)}: field rule {path!r} is not SEG.n")
        fields[path] = _rule(spec, where_of("fields", path), names)
    ids = doc.get("identifiers", {})
    return HL7Profile(
        name=doc["profile"],
        version=str(doc["version"]),
        fields=fields,
        datatypes=datatypes,
        unknown_segment=_rule(doc.get("unknown_segment", "text"), where_of("unknown_segment"), names),
        unlisted_datatype=_rule(doc.get("unlisted_datatype", "text"), where_of("unlisted_datatype"), names),
        observation_values={k: _rule(v, where_of("observation_values", k), names)
                            for k, v in doc.get("observation_values", {}).items()},
        observation_ages=frozenset(doc.get("observation_ages", [])),
        observation_age_types=frozenset(doc.get("observation_age_types", [])),
        observation_age_units={str(u).casefold(): float(y) for u, y in (doc.get("observation_age_units") or {}).items()},
        narrative_types=frozenset(doc.get("narrative_types", ["TX", "FT", "ST"])),
        identifier_remove_types=frozenset(ids.get("remove_types", [])),
        identifier_categories=dict(ids.get("categories", {})),
        authorities={str(k): str(v) for k, v in (doc.get("assigning_authorities") or {}).items()},
        key_id_field=str(doc.get("key_id_field", "MSH.8")),
        leak_guard_skip=frozenset(doc.get("leak_guard_skip", [])),
        leak_guard_skip_components={str(k): frozenset(int(i) for i in v)
                                    for k, v in (doc.get("leak_guard_skip_components") or {}).items()},
        queries={str(name).strip().upper(): _query(spec, where_of("queries", str(name)), names)
                 for name, spec in (doc.get("queries") or {}).items()},
        subject_names=frozenset(doc.get("subject_names", [])),
        subject_values=frozenset(doc.get("subject_values", [])),
        charset=_charset(doc.get("charset"), where_of("charset")),
        rules_sha256=rules_sha256,
    )


def _charset(name, where: str) -> str:
    """The codec a profile's `charset` names ('' for none); an unknown or ambiguous name is an error."""
    if name is None:
        return ""
    codec = charset_codec(str(name))
    if codec is None:
        raise ProfileError(f"{where}: unknown character set {str(name)[:24]!r} (HL7 table 0211: 8859/1, UNICODE UTF-8 ...)")
    return codec


def _query(spec: dict, where: str, datatypes: set[str]) -> QueryParameters:
    """A query's parameters from `queries.<name>`: field number (3 or more) → a rule, a datatype or `QIP`."""
    if not isinstance(spec, dict) or not all(str(k).isdigit() and int(k) >= 3 for k in spec):
        raise ProfileError(f"{where}: a query maps QPD field numbers (3 on) to rules")
    return QueryParameters({int(k): _rule(v, f"{where}.{k}", datatypes) for k, v in spec.items() if v != QIP},
                           frozenset(int(k) for k, v in spec.items() if v == QIP))


def identifier_system(profile: HL7Profile, namespace_id: str, universal_id: str, universal_id_type: str) -> str:
    """The FHIR Identifier.system for an assigning authority (HD), so HL7 and FHIR pseudonyms of one MRN match.

    1. `assigning_authorities` in the profile, by universal id or namespace id (a site's explicit mapping);
    2. a universal id of type ISO → `urn:oid:<id>`; of type URI/URL → the id itself; UUID → `urn:uuid:<id>`;
    3. else the namespace id as it is ("" when the authority is empty).
    """
    for k in (universal_id, namespace_id):
        if k and k in profile.authorities:
            return profile.authorities[k]
    kind = universal_id_type.upper()
    if universal_id:
        if kind == "ISO":
            return universal_id if universal_id.startswith("urn:oid:") else f"urn:oid:{universal_id}"
        if kind in ("URI", "URL"):
            return universal_id
        if kind == "UUID":
            return f"urn:uuid:{universal_id}"
    return namespace_id
