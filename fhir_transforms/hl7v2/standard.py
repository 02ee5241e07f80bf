"""The HL7v2 standard's field datatypes per version, from the tables hl7apy ships (2.1 to 2.8.2).

Each version's table is built once, at the first message of that version: (segment id, field number) →
datatype name (`CM_MSG`-style composites of v2.1-2.4 keep hl7apy's name). A field the version does not
define, or defines without a datatype (withdrawn), has none: the profile rules it by value.
"""
from __future__ import annotations

import importlib
import re
from functools import lru_cache

SUPPORTED = ("2.1", "2.2", "2.3", "2.3.1", "2.4", "2.5", "2.5.1", "2.6", "2.7", "2.8", "2.8.1", "2.8.2")
DEFAULT_VERSION = "2.5.1"  # no or an unreadable MSH-12: the version most messages in use follow


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
    message), else None."""
    for v in SUPPORTED[SUPPORTED.index(version):]:
        found = field_types(v).get((sid, n))
        if found:
            return found
    return None


@lru_cache(maxsize=None)
def defined_fields() -> frozenset[tuple[str, int]]:
    """Every (segment id, field number) some supported version defines with a datatype (site rules are checked
    against it)."""
    return frozenset(k for v in SUPPORTED for k in field_types(v))


@lru_cache(maxsize=None)
def datatype_names() -> frozenset[str]:
    """Every datatype some supported version gives a field."""
    return frozenset(t for v in SUPPORTED for t in field_types(v).values())
