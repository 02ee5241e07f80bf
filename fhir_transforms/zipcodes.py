"""ZIP codes under Safe Harbor: the first three digits, or 000 where that area is too small."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml
import mappings

DATA = Path(mappings.__file__).resolve().parent / "data" / "restricted-zip3.yaml"
US_ZIP_RE = re.compile(r"^\s*(\d{3})\d{2}(?:-?\d{4})?\s*$")


@lru_cache(maxsize=None)
def restricted_prefixes() -> frozenset[str]:
    return frozenset(str(p) for p in yaml.safe_load(DATA.read_text())["prefixes"])


@lru_cache(maxsize=None)
def restricted_list_version() -> str:
    return str(yaml.safe_load(DATA.read_text())["version"])


def zip3(value: str) -> str | None:
    """`01801-1234` → `018`; a restricted prefix → `000`; a value that is not a US ZIP → None (remove it)."""
    m = US_ZIP_RE.match(value)
    if not m:
        return None
    prefix = m.group(1)
    return "000" if prefix in restricted_prefixes() else prefix
