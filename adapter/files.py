"""Read FHIR inputs (a Bundle or resource .json, an .ndjson file, a folder of those) and write outputs atomically."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fhir_transforms.errors import InputError

SUFFIXES = (".json", ".ndjson")


@dataclass
class FhirFile:
    """One input file: its resources (one for .json, one a line for .ndjson), and each one's bytes as read
    (the file, or its line): what the audit trail's input hash is taken of."""

    path: Path
    rel: Path
    ndjson: bool
    resources: list[dict]
    raw: list[bytes]
    lines: list[int]  # each record's line number in the file (1 for a .json file)


class NoResources(Exception):
    """A file that holds no FHIR resources (a bulk client's log.ndjson, an export manifest): skipped, not refused."""


def list_inputs(root: Path) -> list[tuple[Path, Path]]:
    """(path, path relative to the input root) for a file, or every .json/.ndjson under a folder, sorted."""
    if root.is_file():
        return [(root, Path(root.name))]
    if not root.is_dir():
        raise InputError(f"{root}: no such file or folder")
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    return [(p, p.relative_to(root)) for p in found]


def read(path: Path, rel: Path) -> FhirFile:
    """Parse a file; InputError names the path and what is wrong (JSON errors give line and column only)."""
    try:
        raw = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    if path.suffix == ".ndjson":
        resources, lines, numbers = [], [], []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                resources.append(_loads(line, f"{path}: line {n}"))
                lines.append(line.encode())
                numbers.append(n)
        if resources and not any("resourceType" in r for r in resources):
            raise NoResources(f"{path}: holds no FHIR resources (no line has a resourceType); skipped")
        for n, r in enumerate(resources, 1):
            if "resourceType" not in r:
                raise InputError(f"{path}: resource {n} has no resourceType")
        return FhirFile(path, rel, True, resources, lines, numbers)
    doc = _loads(raw, str(path))
    if "resourceType" not in doc:
        raise NoResources(f"{path}: not a FHIR resource (no resourceType); skipped")
    return FhirFile(path, rel, False, [doc], [raw.encode()], [1])


def _loads(text: str, where: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{where}: a FHIR resource must be a JSON object")
    return doc


def serialize(resources: list[dict], ndjson: bool) -> bytes:
    """Deterministic bytes: same resources → same bytes."""
    if ndjson:
        return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in resources).encode()
    return (json.dumps(resources[0], ensure_ascii=False, indent=2) + "\n").encode()


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
