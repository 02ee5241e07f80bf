"""A release: the records of one export, each de-identified knowing the identifiers of every patient in it.

A name of another patient of the release is still a name in a note (text_deid/detectors/release.py). The
identifiers are gathered in a first pass over the people of the release: `deid-adapter bulk` indexes them
while it cuts its chunks (adapter/bulk/job.py); `deid-adapter fhir` reads its NDJSON inputs once before.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from adapter import files as fhir_files, json_input
from fhir_transforms import known as known_ids
from fhir_transforms.errors import InputError, RecordRefused
from fhir_transforms.r4.record import Deidentifier
from text_deid.detectors.release import ReleaseMatcher
from text_deid.spans import KnownIdentifier

PEOPLE_TYPES = ("Patient", "RelatedPerson")  # the patient compartment's people
PEOPLE_MARKERS = tuple(f'"{t}"'.encode() for t in PEOPLE_TYPES)  # a line without one holds none of them


def person_known(engine: Deidentifier, res: dict, where: str) -> set[KnownIdentifier]:
    """A person's known identifiers as the engine collects them de-identifying the resource; a resource it
    refuses (reported when its turn comes) still gives those of its structured fields."""
    release, engine.release = engine.release, None
    try:
        return set(engine.deidentify(res, where).known)
    except (InputError, RecordRefused):
        return known_ids.collect([res])
    finally:
        engine.release = release


def gathered(paths: Iterable[Path], engine: Deidentifier) -> ReleaseMatcher:
    """The release of these NDJSON files: the known identifiers of every Patient and RelatedPerson they hold.
    Only the lines that name one of those types are parsed; a line that is bad input is left to the file's own
    reading, which reports it."""
    known: set[KnownIdentifier] = set()
    validate, engine.validate = engine.validate, False  # (each record is validated when its turn comes)
    try:
        for path in paths:
            for n, line in _lines(path):
                if not any(m in line for m in PEOPLE_MARKERS):
                    continue
                try:
                    res = json_input.loads(line)
                except InputError:
                    continue
                if isinstance(res, dict) and known_ids.is_one_of(res.get("resourceType"), PEOPLE_TYPES):
                    known.update(person_known(engine, res, f"{path}: line {n}"))
    finally:
        engine.validate = validate
    return ReleaseMatcher(known)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line of a file, numbered as `adapter.files.ndjson_records` numbers them; an
    unreadable file gives none (its own reading reports it)."""
    try:
        with path.open("rb") as f:
            n = 0
            for i, chunk in enumerate(f):
                for line in (chunk.removeprefix(fhir_files.BOM) if i == 0 else chunk).splitlines():
                    n += 1
                    yield n, line
    except OSError:
        return
