"""The HL7v2 standard's field datatypes per version, from the tables hl7apy ships (2.1 to 2.8.2).

Each version's table is built once, at the first message of that version: (segment id, field number) →
datatype name (`CM_MSG`-style composites of v2.1-2.4 keep hl7apy's name). A field the version does not
define has the type of the first later version that does, else of the last earlier one (QRD in v2.7+); a
field a version withdrew (`WD`: PID-2 from v2.7) has the type of the last version that defined it; and a
v2.1/2.2 field has the v2.3 type where v2.3 makes it an identifier, a name, an address or a phone: the
values are the same, typed as text, a number, a code or a `CM` composite there (PID-4, PID-6, ORC-2/3,
OBR-2/3, PV1-19), or as the old PN, AD, TN, CN and CK, whose components the X types kept in place.
"""
from __future__ import annotations

import importlib
import re
from functools import lru_cache

SUPPORTED = ("2.1", "2.2", "2.3", "2.3.1", "2.4", "2.5", "2.5.1", "2.6", "2.7", "2.8", "2.8.1", "2.8.2")
DEFAULT_VERSION = "2.5.1"  # no or an unreadable MSH-12: the version most messages in use follow
OLDEST = ("2.1", "2.2")  # the versions that typed identifiers and names as ST, NM, ID, CM or PN, AD, TN, CN, CK
# the v2.3 types that replace the type of a field of v2.1/2.2 (`field_type`)
PERSON_TYPES = frozenset({"CX", "EI", "EIP", "XPN", "XCN", "XAD", "XTN", "XON", "PL"})
TABLE_VALUES = ("ID", "IS")  # the datatypes of coded table values (HL7 tables 0203, 0200...)


def standard_version(msh12: str) -> str:
    """The hl7apy table for a message's MSH-12 (first component): itself, else the nearest earlier one
    (2.0 → 2.1, 2.3.2 → 2.3.1, 2.9 → 2.8.2), else the default."""
    v = msh12.strip()
    if v in SUPPORTED:
        return v
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", v)
    if not m:
        return DEFAULT_VERSION
    wanted = tuple(int(x or 0) for x in m.groups())
    earlier = [s for s in SUPPORTED if _number(s) <= wanted]
    return earlier[-1] if earlier else SUPPORTED[0]


def _number(version: str) -> tuple[int, int, int]:
    parts = [int(x) for x in version.split(".")] + [0, 0]
    return parts[0], parts[1], parts[2]


@lru_cache(maxsize=None)
def field_types(version: str) -> dict[tuple[str, int], str]:
    """(segment id, field number) → datatype name, for every segment the version defines."""
    package = "hl7apy.v" + version.replace(".", "_")
    segments = importlib.import_module(package + ".segments").SEGMENTS
    fields = importlib.import_module(package + ".fields").FIELDS
    table: dict[tuple[str, int], str] = {}
    for sid, ref in segments.items():
        for child in (ref[1] if len(ref) > 1 else ()):  # withdrawn segments (v2.7 QRD) list no fields
            name = child[0]
            ref = fields.get(name)
            if ref and len(ref) > 2 and ref[2] and ref[2] != "varies":
                table[(sid, int(name.rsplit("_", 1)[1]))] = ref[2]
    return table


@lru_cache(maxsize=65536)
def field_type(version: str, sid: str, n: int) -> str | None:
    """The datatype of field `n` of segment `sid` in `version` (a `standard_version`), else in the first
    later version that defines it (senders use later segments and fields: PRT or ORC-24 in a v2.3
    message), else in the last earlier one, else None; a withdrawn field and the oldest versions' untyped
    identifiers are typed as the module says."""
    at = SUPPORTED.index(version)
    for v in SUPPORTED[at:]:
        found = field_types(v).get((sid, n))
        if found and found.upper() == "WD":  # hl7apy's v2.6 tables spell it `wd`
            return _last_defined(at, sid, n) or "WD"
        if found:
            if version in OLDEST:
                later = field_types("2.3").get((sid, n))
                return later if later in PERSON_TYPES else found
            return found
    return _last_defined(at, sid, n)


def _last_defined(before: int, sid: str, n: int) -> str | None:
    """The type the last version before `SUPPORTED[before]` gave a field, a withdrawn one's skipped."""
    for v in reversed(SUPPORTED[:before]):
        found = field_types(v).get((sid, n))
        if found and found.upper() != "WD":
            return found
    return None


@lru_cache(maxsize=None)
def table_components(version: str) -> dict[str, frozenset[int]]:
    """datatype name → its components that hold table values (ID, IS: identifier types, name types, use codes),
    for every composite datatype of `version`: codes, which the leak guard does not compare with names."""
    structs = importlib.import_module("hl7apy.v" + version.replace(".", "_") + ".datatypes").DATATYPES_STRUCTS
    found = {}
    for name, children in structs.items():
        coded = frozenset(i for i, child in enumerate(children, 1) if child[1][0] == "leaf" and child[1][2] in TABLE_VALUES)
        if coded:
            found[name] = coded
    return found


def defines(version: str, sid: str, n: int) -> bool:
    """Whether `version` itself defines field `n` of `sid` (not a later or earlier version, as `field_type` reads)."""
    return (sid, n) in field_types(version)


@lru_cache(maxsize=None)
def defined_fields() -> frozenset[tuple[str, int]]:
    """Every (segment id, field number) some supported version defines with a datatype (site rules are checked
    against it)."""
    return frozenset(k for v in SUPPORTED for k in field_types(v))


@lru_cache(maxsize=None)
def datatype_names() -> frozenset[str]:
    """Every datatype some supported version gives a field."""
    return frozenset(t for v in SUPPORTED for t in field_types(v).values())
