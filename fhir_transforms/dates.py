"""FHIR date, dateTime and instant values: year only, per-patient shift, age at a reference day."""
from __future__ import annotations

import re
from datetime import date, datetime, timedelta

# YYYY, YYYY-MM, YYYY-MM-DD, or YYYY-MM-DDThh:mm:ss(.fff)(Z|±hh:mm)
FHIR_DATE_RE = re.compile(
    r"^(?P<y>\d{4})(?:-(?P<m>\d{2})(?:-(?P<d>\d{2})"
    r"(?:T(?P<time>\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)(?P<tz>Z|[+-]\d{2}:\d{2})?)?)?)?$"
)


class DateFormatError(ValueError):
    """A value is not a FHIR date/dateTime/instant (message never quotes the value)."""


def parse(value: str) -> re.Match:
    m = FHIR_DATE_RE.match(value)
    if not m:
        raise DateFormatError("not a FHIR date, dateTime or instant")
    return m


def year_only(value: str) -> str:
    """`1991-07-08T01:39:26+00:00` → `1991`."""
    return parse(value).group("y")


def year_floor_instant(value: str) -> str:
    """For an instant that must stay an instant: the first instant of its year, in UTC."""
    return f"{parse(value).group('y')}-01-01T00:00:00Z"


def full_date(value: str) -> date | None:
    """The calendar day of a value with day precision, else None."""
    m = parse(value)
    if not m.group("d"):
        return None
    return date(int(m.group("y")), int(m.group("m")), int(m.group("d")))


def shift(value: str, days: int) -> str:
    """Shift by `days`, keeping the value's precision, time and time zone.

    Year-month values shift their 15th and keep month precision; year values shift 1 July and keep
    year precision, so a coarse value moves by about the same amount as a full one.
    """
    m = parse(value)
    y, mo, d = m.group("y"), m.group("m"), m.group("d")
    if d:
        shifted = date(int(y), int(mo), int(d)) + timedelta(days=days)
        rest = value[10:]
        return shifted.isoformat() + rest
    if mo:
        shifted = date(int(y), int(mo), 15) + timedelta(days=days)
        return f"{shifted.year:04d}-{shifted.month:02d}"
    shifted = date(int(y), 7, 1) + timedelta(days=days)
    return f"{shifted.year:04d}"


def age_in_years(birth: str, on: date) -> int:
    """Completed years from a FHIR birth date to `on`; a coarse birth date counts from its earliest day."""
    m = parse(birth)
    y = int(m.group("y"))
    mo = int(m.group("m") or 1)
    d = int(m.group("d") or 1)
    return on.year - y - ((on.month, on.day) < (mo, d))


def today() -> date:
    """The default clock; tests inject their own."""
    return datetime.now().date()
