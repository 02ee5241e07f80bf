"""Read FHIR inputs (a Bundle or resource .json, an .ndjson file, a folder of those) and write outputs atomically."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import msgspec

from adapter import json_input
from fhir_transforms.errors import InputError

SUFFIXES = (".json", ".ndjson")
BOM = b"\xef\xbb\xbf"
# The R4B models hold a validated Bundle at many times its size (docs/measurements.md): a larger .json file is
# refused before any work under full validation, and left to --validate sample or off.
MAX_VALIDATED_BYTES = 50_000_000


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


def check_validation_size(inputs: list[tuple[Path, Path]]) -> None:
    """InputError for the first .json file too large to validate in full (NDJSON is validated line by line)."""
    for path, _ in inputs:
        size = path.stat().st_size if path.suffix == ".json" else 0
        if size > MAX_VALIDATED_BYTES:
            raise InputError(f"{path}: {size / 1e6:.0f} MB is more than full validation takes "
                             f"({MAX_VALIDATED_BYTES / 1e6:.0f} MB); use --validate sample or --validate off")


def read(path: Path, rel: Path) -> FhirFile:
    """Parse a file strictly (adapter/json_input.py); InputError names the path and what is wrong, never a value.

    The text is decoded only for parsing and dropped after, so a large bundle is not held twice."""
    try:
        data = path.read_bytes().removeprefix(BOM)
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    if path.suffix == ".ndjson":
        del text
        resources, lines, numbers = [], [], []
        for n, line in enumerate(data.splitlines(), 1):
            if line.strip():
                resources.append(_loads(line, f"{path}: line {n}"))
                lines.append(line)
                numbers.append(n)
        if resources and not any("resourceType" in r for r in resources):
            raise NoResources(f"{path}: holds no FHIR resources (no line has a resourceType); skipped")
        for n, r in enumerate(resources, 1):
            if "resourceType" not in r:
                raise InputError(f"{path}: resource {n} has no resourceType")
        return FhirFile(path, rel, True, resources, lines, numbers)
    doc = _loads(text, str(path))
    del text
    if "resourceType" not in doc:
        raise NoResources(f"{path}: not a FHIR resource (no resourceType); skipped")
    return FhirFile(path, rel, False, [doc], [data], [1])


def _loads(text: str | bytes, where: str) -> dict:
    try:
        doc = json_input.loads(text)
    except json_input.JsonInputError as e:
        raise InputError(f"{where}: {e}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{where}: a FHIR resource must be a JSON object")
    return doc


def serialize(resources: list[dict], ndjson: bool) -> bytes:
    """Deterministic bytes: same resources → same bytes."""
    if ndjson:
        return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in resources).encode()
    # the stdlib writes an indented document in pure Python (8x its compact C encoder); msgspec indents the
    # compact text in C, to the same bytes (json.dump(indent=2, ensure_ascii=False))
    compact = json.dumps(resources[0], ensure_ascii=False, separators=(",", ":")).encode()
    try:
        return msgspec.json.format(compact, indent=2) + b"\n"
    except msgspec.DecodeError:  # NaN or Infinity, which json writes and JSON does not have: the stdlib's bytes
        del compact
        return (json.dumps(resources[0], ensure_ascii=False, indent=2) + "\n").encode()


def check_inside(target: Path, root: Path) -> None:
    """Refuse (InputError) a target under `root` that a link inside `root` would send elsewhere, or whose
    folder cannot be made: the nearest part of its folder that exists, links followed, must be a folder
    inside `root`."""
    existing = target.parent
    while not os.path.lexists(existing):
        if existing == root or existing == existing.parent:
            return  # nothing of it exists yet, so no link can be in it
        existing = existing.parent
    if not existing.resolve().is_relative_to(root.resolve()):
        raise InputError(f"{target}: a link inside {root} leads outside it; not written")
    if not existing.is_dir():
        raise InputError(f"{target}: {existing} is not a folder; not written")


def write_atomic(path: Path, data: bytes, root: Path | None = None) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see a partial file. With `root`,
    the folder written into must lie inside it (checked before and after creating it; a link at `path`
    itself is replaced, never followed)."""
    if root is not None:
        check_inside(path, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    if root is not None:
        check_inside(path, root)
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
