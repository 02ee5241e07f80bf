"""Golden files: tests/cases/<profile>/<name>.json → <name>.expected.json under the fixed test key and day.

Compared after normalizing both through json. To regenerate after an intended change:
DEID_UPDATE_GOLDEN=1 python -m pytest tests/r4/test_golden.py, then review the diff by eye.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import CASES, make_engine

GOLDEN = sorted(p for p in CASES.glob("*/*.json") if not p.name.endswith(".expected.json") and p.parent.name != "refused")


@pytest.mark.parametrize("case", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden(case: Path, test_key):
    engine = make_engine(test_key, profile=case.parent.name)
    result = engine.deidentify(json.loads(case.read_text()), case.stem).resource
    expected_path = case.with_name(case.stem + ".expected.json")
    if os.environ.get("DEID_UPDATE_GOLDEN"):
        expected_path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    assert result == json.loads(expected_path.read_text())


@pytest.mark.parametrize("case", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_consumed_input_gives_the_same_output(case: Path, test_key):
    # the fhir command gives its parsed input up (consume=True): no copy, same bytes and findings
    engine = make_engine(test_key, profile=case.parent.name, validate=False)
    raw = case.read_text()
    kept = json.loads(raw)
    copied = engine.deidentify(kept, case.stem)
    assert kept == json.loads(raw)  # without consume the input is left as it was
    consumed = engine.deidentify(json.loads(raw), case.stem, consume=True)
    assert json.dumps(consumed.resource) == json.dumps(copied.resource)
    assert consumed.findings == copied.findings and consumed.known == copied.known
