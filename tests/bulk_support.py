"""What the bulk tests share: the sample export, one reference run (local engine, one worker), an export with
a resource to refuse, tree comparison."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from adapter.bulk.export import deidentify_export
from tests.conftest import FIXED_TODAY, SHARED, TEST_SECRET

SAMPLE = SHARED / "fhir" / "bulk-ndjson"
TODAY = FIXED_TODAY.isoformat()
_REFERENCE: dict[str, Path] = {}


def run_bulk(out: Path, root: Path = SAMPLE, **options) -> Path:
    """A bulk run with the fixed test key and day; the log goes nowhere."""
    options.setdefault("today", TODAY)
    options.setdefault("stack", "patterns")
    deidentify_export(root, out, TEST_SECRET, tty=False, log=lambda m: None, **options)
    return out


def reference_output(tmp_path_factory) -> Path:
    """The sample de-identified once per session by the local engine with one worker (the bytes others must match)."""
    if "ref" not in _REFERENCE:
        _REFERENCE["ref"] = run_bulk(tmp_path_factory.mktemp("bulk-reference") / "out", workers=1)
    return _REFERENCE["ref"]


def refusing_export(tmp_path: Path) -> tuple[Path, str]:
    """The sample with one Condition (line 6) that must be refused (an unknown modifierExtension); and its id."""
    root = tmp_path / "in"
    shutil.copytree(SAMPLE, root)
    condition = json.loads((SAMPLE / "Condition.000.ndjson").read_text().splitlines()[5])
    condition["modifierExtension"] = [{"url": "http://example.org/unknown-modifier", "valueBoolean": True}]
    lines = (root / "Condition.000.ndjson").read_text().splitlines()
    lines[5] = json.dumps(condition)
    (root / "Condition.000.ndjson").write_text("\n".join(lines) + "\n")
    return root, condition["id"]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (hidden work files included), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_tree(actual: Path, expected: Path, context: str = "") -> None:
    a, e = tree(actual), tree(expected)
    assert sorted(a) == sorted(e), context
    differing = [name for name in e if a[name] != e[name]]
    assert not differing, f"files differ: {differing} {context}"
