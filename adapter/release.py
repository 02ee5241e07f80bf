"""A release: the records of one export, each de-identified knowing the identifiers of every patient in it.

A name of another patient of the release is still a name in a note (text_deid/detectors/release.py). The
identifiers are gathered in a first pass over the people of the release: `deid-adapter bulk` indexes them
while it cuts its chunks (adapter/bulk/job.py); `deid-adapter fhir` reads its NDJSON inputs once before.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from adapter import files as fhir_files
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
    """The release of these NDJSON files: the known identifiers of every Patient and RelatedPerson they hold. A
    file that is bad input gives the people before its fault (the file is reported when its turn comes)."""
    known: set[KnownIdentifier] = set()
    validate, engine.validate = engine.validate, False  # (each record is validated when its turn comes)
    for path in paths:
        try:
            for n, raw, res in fhir_files.ndjson_records(path):
                if any(m in raw for m in PEOPLE_MARKERS) and known_ids.is_one_of(res.get("resourceType"), PEOPLE_TYPES):
                    known.update(person_known(engine, res, f"{path}: line {n}"))
        except InputError:
            continue
    engine.validate = validate
    return ReleaseMatcher(known)
