"""A FHIR Bulk Data export in, the same layout out: two passes, resumable, on any engine that maps chunks.

Pass 1 (driver) reads every file once: it cuts the resource files into chunks at line boundaries and
indexes the patient compartment (the known identifiers of each Patient and RelatedPerson, keyed by the
patient's id pseudonym, in an encrypted temporary store). Pass 2 maps `process_chunk` over the chunks
(a process pool here, Spark in adapter/bulk/spark.py); the driver writes each chunk's output as a part
file, then a line in the checkpoint journal, and at the end joins the parts into the output files and
writes the manifest and the summary. A chunk's bytes depend only on the input, the key and the settings,
so a rerun, a resumed run and every engine write the same bytes.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import hmac
import json
import multiprocessing
import os
import re
import secrets
import shutil
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from adapter.audit import trail as audit
from adapter import files as fhir_files
from adapter import json_input, release
from fhir_transforms import known as known_ids
from fhir_transforms import safe_harbor_gaps
from fhir_transforms.r4 import references
from fhir_transforms.errors import (DetectorFailed, InputError, LeakFound, OutputInvalid, RecordRefused,
                                    UnknownModifier)
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4 import versions
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.r4.walker import age_limit
from fhir_transforms.rules import Profile
from text_deid.detectors.release import ReleaseMatcher
from text_deid.spans import KnownIdentifier
from text_deid.stack import LlmSettings, TextStack
from adapter.engines import profiles, text_stack

WORK_DIR = ".deid-bulk"  # inside OUT while a run is unfinished; removed when it completes
SUMMARY_NAME = "deid-summary.json"
MANIFEST_NAME = "manifest.json"
COMPARTMENT_TYPES = ("Patient", "RelatedPerson")
COMPARTMENT_MARKERS = tuple(f'"{t}"'.encode() for t in COMPARTMENT_TYPES)
DEFAULT_CHUNK_BYTES = 1 << 20
# A "reference" member with a string value. In a line without backslashes no string can hold a quote, so
# every match is a real member and the matched bytes are the value itself, unescaped.
REFERENCE_RE = re.compile(rb'"reference"\s*:\s*"([^"]*)"')
PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class Settings:
    """What every worker needs to build the same engine; picklable, shipped to workers, never logged."""

    secret: bytes = field(repr=False)
    profile: str
    stack: str
    today: str
    validate: str  # full | sample | off
    index_path: str
    index_key: bytes = field(repr=False)
    llm: LlmSettings | None = None  # the Ollama endpoint of the LLM stacks
    actor: str = "bulk"  # who the audit records name
    rules: str | None = None  # a site rules file over `profile` (each worker reads and checks it again)

    def profile_rules(self) -> Profile:
        """The FHIR profile these settings name: packaged, or the site rules file over it."""
        return profiles(self.profile, Path(self.rules) if self.rules else None).fhir
    fhir_version: str = versions.DEFAULT  # r4, r5 or auto (fhir_transforms/r4/versions.py)

    def engine(self, stack: TextStack | None = None) -> Deidentifier:
        """The engine these settings describe; `stack`: one already built from them (building one is costly)."""
        day = date.fromisoformat(self.today)
        key = Key(key_id_for(self.secret), self.secret)
        return Deidentifier(self.profile_rules(), Pseudonymizer(key), stack or text_stack(self.stack, self.llm),
                            lambda: day, self.validate == "full", fhir_version=self.fhir_version)


@dataclass(frozen=True)
class Chunk:
    """Lines [first_line, first_line + lines) of one resource file: bytes [offset, offset + length)."""

    seq: int
    file: str
    offset: int
    length: int
    first_line: int
    lines: int


@dataclass
class Export:
    """What pass 1 found in IN."""

    root: Path
    files: list[str]
    chunks: list[Chunk]
    skipped: list[dict]
    manifest_name: str
    manifest_fields: dict
    patients: int = 0

    @property
    def resources(self) -> int:
        return sum(c.lines for c in self.chunks)


class PatientIndex:
    """Known identifiers of the patient compartment, keyed by the patient's id pseudonym.

    An SQLite file (so memory stays flat however many patients there are) whose values are AES-GCM
    encrypted with a key held only in memory: what reaches the disk is never in clear, and it is
    unreadable once the run ends. Keys are the same pseudonyms the output carries.
    """

    def __init__(self, path: Path, key: bytes, create: bool = False):
        self.path, self._aead = Path(path), AESGCM(key)
        if create:
            self.path.unlink(missing_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        if create:
            self._db.execute("PRAGMA journal_mode=OFF")
            self._db.execute("CREATE TABLE known (patient TEXT NOT NULL, sealed BLOB NOT NULL)")
            self._db.execute("CREATE INDEX known_patient ON known (patient)")
            self._db.execute("CREATE TABLE age90 (patient TEXT PRIMARY KEY, sealed BLOB NOT NULL)")

    def add(self, patient: str, known: Iterable[KnownIdentifier]) -> None:
        nonce = secrets.token_bytes(12)
        plain = json.dumps(sorted([k.value, k.category] for k in known)).encode()
        self._db.execute("INSERT INTO known VALUES (?, ?)", (patient, nonce + self._aead.encrypt(nonce, plain, patient.encode())))

    def add_age_limit(self, patient: str, year: int) -> None:
        """A patient aged 90 or more: the year they turned 90, so every file's resources of theirs follow the rule."""
        nonce = secrets.token_bytes(12)
        sealed = nonce + self._aead.encrypt(nonce, str(year).encode(), b"age90|" + patient.encode())
        self._db.execute("INSERT OR REPLACE INTO age90 VALUES (?, ?)", (patient, sealed))

    def age_limit(self, patient: str) -> int | None:
        row = self._db.execute("SELECT sealed FROM age90 WHERE patient = ?", (patient,)).fetchone()
        return int(self._aead.decrypt(row[0][:12], row[0][12:], b"age90|" + patient.encode())) if row else None

    def commit(self) -> None:
        self._db.commit()

    def count(self) -> int:
        return self._db.execute("SELECT COUNT(DISTINCT patient) FROM known").fetchone()[0]

    def everyone(self) -> Iterator[KnownIdentifier]:
        """The known identifiers of every patient indexed: the release's."""
        for patient, sealed in self._db.execute("SELECT patient, sealed FROM known"):
            plain = self._aead.decrypt(sealed[:12], sealed[12:], patient.encode())
            yield from (KnownIdentifier(v, c) for v, c in json.loads(plain))

    def lookup(self, patient: str) -> tuple[KnownIdentifier, ...]:
        found: set[KnownIdentifier] = set()
        for (sealed,) in self._db.execute("SELECT sealed FROM known WHERE patient = ?", (patient,)):
            plain = self._aead.decrypt(sealed[:12], sealed[12:], patient.encode())
            found.update(KnownIdentifier(v, c) for v, c in json.loads(plain))
        return tuple(sorted(found, key=lambda k: (k.category, k.value)))


def discover(root: Path) -> tuple[list[str], list[dict], str, dict]:
    """Resource files, skipped files (with why), the manifest's name and what the output manifest keeps."""
    if not root.is_dir():
        raise InputError(f"{root}: not a folder (a bulk export is a folder of .ndjson files)")
    files, skipped, manifest_name, fields = [], [], MANIFEST_NAME, {}
    found = sorted(p for p in root.rglob("*") if p.is_file() or fhir_files.is_dangling(p))
    fhir_files.check_links(root, [p for p in found if p.suffix in fhir_files.SUFFIXES])
    for path in found:
        rel = path.relative_to(root).as_posix()
        if path.name.startswith(".") or path.suffix not in fhir_files.SUFFIXES:
            continue
        if path.suffix == ".json":
            doc = _json_or_none(path.read_bytes())
            if isinstance(doc, dict) and isinstance(doc.get("output"), list):
                manifest_name = rel
                fields = {k: doc[k] for k in ("transactionTime", "request") if isinstance(doc.get(k), str)}
                continue
            skipped.append({"file": rel, "reason": "not part of a bulk export (only .ndjson resources and the manifest are)"})
            continue
        first = _first_object(path)
        if first is not None and "resourceType" not in first:
            skipped.append({"file": rel, "reason": "no FHIR resources (a bulk client log); not copied"})
            if "transactionTime" not in fields:
                fields.update(_log_fields(path))
            continue
        files.append(rel)
    if "request" in fields:
        fields["request"] = fields["request"].split("?", 1)[0]  # query criteria may name people
    return files, skipped, manifest_name, fields


def _json_or_none(raw: bytes):
    """The strictly parsed JSON (adapter/json_input.py), or None: a duplicate key or a resource nested too
    deep is a refused line, never an error that ends the run."""
    try:
        return json_input.loads(raw)
    except json_input.JsonInputError:
        return None


def _first_object(path: Path) -> dict | None:
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                doc = _json_or_none(line)
                return doc if isinstance(doc, dict) else {"resourceType": None}  # bad lines are reported in pass 2
    return None


def _log_fields(path: Path) -> dict:
    """The export's request and transaction time from a bulk client's log (kickoff and status events)."""
    fields = {}
    with path.open("rb") as f:
        for line in f:
            event = _json_or_none(line)
            detail = event.get("eventDetail") if isinstance(event, dict) else None
            if not isinstance(detail, dict):
                continue
            if isinstance(detail.get("exportUrl"), str):
                fields.setdefault("request", detail["exportUrl"])
            if isinstance(detail.get("transactionTime"), str):
                fields.setdefault("transactionTime", detail["transactionTime"])
    return fields


def scan(root: Path, files: list[str], index: PatientIndex, engine: Deidentifier, validate: str,
         chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> tuple[list[Chunk], int]:
    """Pass 1: chunk boundaries of every file, and the patient compartment into `index`. Returns (chunks, patients)."""
    chunks: list[Chunk] = []
    for rel in files:
        offset = start = 0
        n = first = 1
        count = 0
        with (root / rel).open("rb") as f:
            for line in f:
                if line.strip():
                    count += 1
                    if any(m in line for m in COMPARTMENT_MARKERS):
                        _index_person(line, rel, n, index, engine, validate)
                offset += len(line)
                n += 1
                if offset - start >= chunk_bytes:
                    chunks.append(Chunk(len(chunks), rel, start, offset - start, first, count))
                    start, first, count = offset, n, 0
        if offset > start or not any(c.file == rel for c in chunks):
            chunks.append(Chunk(len(chunks), rel, start, offset - start, first, count))
    index.commit()
    return chunks, index.count()


def _index_person(line: bytes, rel: str, n: int, index: PatientIndex, engine: Deidentifier, validate: str) -> None:
    res = _json_or_none(line.removeprefix(b"\xef\xbb\xbf"))
    if not isinstance(res, dict) or not known_ids.is_one_of(res.get("resourceType"), COMPARTMENT_TYPES):
        return
    link = res.get("patient")  # (any JSON value before validation: pass 2 reports a wrong shape)
    patient = res.get("id") if res["resourceType"] == "Patient" else \
        _reference_id(link.get("reference") if isinstance(link, dict) else None)
    if not isinstance(patient, str) or not patient:
        return
    engine.validate = _validates(validate, rel, n)
    if res["resourceType"] == "Patient" and (limit := age_limit(res.get("birthDate"), engine.clock())) is not None:
        index.add_age_limit(engine.pseudo.resource_id(patient), limit)
    index.add(engine.pseudo.resource_id(patient), release.person_known(engine, res, f"{rel}: line {n}"))


def _reference_id(reference) -> str | None:
    return references.resource_id_of(reference) if isinstance(reference, str) else None


def _validates(mode: str, rel: str, n: int) -> bool:
    """full: every resource; sample: a deterministic 1 in 20, so reruns and resumes validate the same ones."""
    return mode == "full" or (mode == "sample" and hashlib.sha256(f"{rel}:{n}".encode()).digest()[0] % 20 == 0)


def linked_patients(node, line: bytes | None = None) -> set[str]:
    """Ids of every Patient the resource points at (subject, patient, beneficiary, and any other reference).

    `line`: the resource's NDJSON line; without escapes in it, its references are found by one regex over
    the bytes instead of a walk over the parsed resource (the same ids, at a tenth of the cost).
    """
    if line is not None and b"\\" not in line:
        return {t for ref in REFERENCE_RE.findall(line) if (t := _patient_target(ref.decode()))}
    found: set[str] = set()
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            target = _patient_target(x.get("reference"))
            if target:
                found.add(target)
            stack.extend(v for v in x.values() if isinstance(v, (dict, list)))
        elif isinstance(x, list):
            stack.extend(v for v in x if isinstance(v, (dict, list)))
    return found


def _patient_target(ref) -> str | None:
    if isinstance(ref, str) and (ref.startswith(("Patient/", "urn:uuid:")) or "/Patient/" in ref):
        return references.resource_id_of(ref)
    return None


# Why a resource was not written → the reason code of the summary (first match; subclasses first).
REFUSAL_REASONS: dict[type[Exception], str] = {InputError: "invalid-resource", DetectorFailed: "detector-failed",
                                               LeakFound: "leak-guard", UnknownModifier: "unknown-modifier-extension",
                                               OutputInvalid: "output-validation"}


def refusal_reason(e: Exception) -> str:
    """A fixed reason code: summaries and logs never carry an exception's free text (it may name values)."""
    return next((reason for kind, reason in REFUSAL_REASONS.items() if isinstance(e, kind)), "refused")


@dataclass
class Worker:
    """What pass 2 runs a chunk with: the engine, the patient index and the validation mode."""

    engine: Deidentifier
    index: PatientIndex
    validate: str
    actor: str = "bulk"

    def __post_init__(self) -> None:
        self.engine.release = ReleaseMatcher(self.index.everyone())  # every patient's identifiers, in every note
        # a patient's resources sit together in a file: most lookups are of the few patients seen last
        self.linked_known = lru_cache(maxsize=4096)(self._linked_known)
        self.linked_age_limit = lru_cache(maxsize=4096)(self._linked_age_limit)

    @classmethod
    def from_settings(cls, settings: Settings, stack: TextStack | None = None) -> "Worker":
        return cls(settings.engine(stack), PatientIndex(Path(settings.index_path), settings.index_key), settings.validate,
                   settings.actor)

    def _linked_known(self, patient: str) -> tuple[KnownIdentifier, ...]:
        """The known identifiers pass 1 indexed for the patient with this (clear) id."""
        return self.index.lookup(self.engine.pseudo.resource_id(patient))

    def _linked_age_limit(self, patient: str) -> int | None:
        """The year the patient with this (clear) id turned 90, if pass 1 found them aged 90 or more."""
        return self.index.age_limit(self.engine.pseudo.resource_id(patient))


def process_chunk(root: Path, chunk: Chunk, worker: Worker) -> tuple[bytes, dict]:
    """Pass 2 for one chunk: (its output NDJSON bytes, stats: resources written per type, refusals)."""
    engine = worker.engine
    with (root / chunk.file).open("rb") as f:
        f.seek(chunk.offset)
        raw = f.read(chunk.length)
    if chunk.offset == 0:
        raw = raw.removeprefix(b"\xef\xbb\xbf")
    out: list[bytes] = []  # NDJSON lines, serialized once for the part file and the audit's output hash
    written: dict[str, int] = {}
    refusals: list[list] = []
    entries: list = []  # audit entries (hashes, locations; no PHI), appended by the driver before the part is kept
    who = {"actor": worker.actor, "channel": "bulk", "data_format": "fhir", "info": audit.engine_info(engine)}
    for n, line in enumerate(raw.splitlines(), chunk.first_line):
        if not line.strip():
            continue
        res = _json_or_none(line)
        if not isinstance(res, dict) or not isinstance(res.get("resourceType"), str):
            refusals.append([n, None, "invalid-json" if res is None else "not-a-resource"])
            continue
        own = res.get("id")  # (any JSON value before validation: the engine reports a wrong shape)
        patients = sorted(linked_patients(res, line) | ({own} if isinstance(own, str) else set()))
        linked = [k for p in patients for k in worker.linked_known(p)]
        age_limits = {p: year for p in patients if (year := worker.linked_age_limit(p)) is not None}
        engine.validate = _validates(worker.validate, chunk.file, n)
        where = f"{chunk.file}: line {n}"
        rtype, input_id = res["resourceType"], res.get("id")  # read before the record is de-identified in place
        try:
            result = engine.deidentify(res, where, linked, consume=True, linked_age_limits=age_limits)
        except (InputError, RecordRefused) as e:
            rid = engine.pseudo.resource_id(input_id) if isinstance(input_id, str) and input_id else None
            refusals.append([n, rid, refusal_reason(e)])
            entries.append(audit.refusal(engine, input=line, reason=refusal_reason(e), **who))
            continue
        out.append(fhir_files.serialize([result.resource], True))
        entries.append(audit.deidentification(engine, input=line, output=out[-1][:-1], findings=result.findings,
                                              where=where, root=rtype, **who))
        written[rtype] = written.get(rtype, 0) + 1
    return b"".join(out), {"written": written, "refusals": refusals, "audit": entries}


# --- the checkpoint journal --------------------------------------------------------------------------------

class Journal:
    """One JSON line per finished chunk (its part file's digest and its stats), appended and fsynced
    after the part file is in place; a header names the run, so a run with other input or settings
    starts over instead of mixing outputs. Each line is keyed (HMAC under a key derived from the pseudonym
    key): a part edited on disk, with its digest edited in the journal to match, fails its MAC, and the chunk
    is de-identified again instead of published."""

    def __init__(self, work: Path, run: dict, secret: bytes):
        self.work, self.path = work, work / "journal.ndjson"
        self.parts = work / "parts"
        self.run = run
        self.done: dict[int, dict] = {}
        self._mac_key = hmac.new(secret, b"deid-adapter bulk journal v1", hashlib.sha256).digest()

    def _mac(self, entry: dict) -> str:
        body = json.dumps({"run": self.run, **{k: entry[k] for k in ("seq", "sha256", "stats")}}, sort_keys=True)
        return hmac.new(self._mac_key, body.encode(), hashlib.sha256).hexdigest()

    def _previous(self) -> tuple[dict | None, list[bytes]]:
        if not self.path.exists():
            return None, []
        lines = self.path.read_bytes().splitlines()
        header = _json_or_none(lines[0]) if lines else None
        return (header if isinstance(header, dict) and header.get("run") == self.run else None), lines[1:]

    def open(self, today: str | None, default_today: Callable[[], str]) -> str:
        """Load what an earlier run of the same export and settings finished, or start afresh.

        Returns the reference day for ages: `today` if given, else the interrupted run's (so a resume
        after midnight writes the same bytes), else `default_today()`.
        """
        header, lines = self._previous()
        entries = []
        if header is not None and today in (None, header.get("today")):
            today = header["today"]
            entries = [e for e in map(_json_or_none, lines) if isinstance(e, dict) and "seq" in e]
        today = today or default_today()
        for e in entries:
            part = self.part(e["seq"])
            if not (isinstance(e.get("mac"), str) and "sha256" in e and "stats" in e
                    and hmac.compare_digest(e["mac"], self._mac(e))):
                continue  # not written by a run with this key: done again
            if part.exists() and hashlib.sha256(part.read_bytes()).hexdigest() == e["sha256"]:
                self.done[e["seq"]] = e
        if not entries:
            shutil.rmtree(self.work, ignore_errors=True)
        self.parts.mkdir(parents=True, exist_ok=True)
        # rewrite without a line a kill may have cut short, so appends start on a fresh line
        body = [json.dumps({"run": self.run, "today": today})]
        body += [json.dumps(e) for e in sorted(self.done.values(), key=lambda e: e["seq"])]
        fhir_files.write_atomic(self.path, ("\n".join(body) + "\n").encode())
        self._f = self.path.open("ab")
        return today

    def part(self, seq: int) -> Path:
        return self.parts / f"{seq:08d}.ndjson"

    def record(self, chunk: Chunk, data: bytes, stats: dict) -> None:
        fhir_files.write_atomic(self.part(chunk.seq), data)
        entry = {"seq": chunk.seq, "sha256": hashlib.sha256(data).hexdigest(), "stats": stats}
        entry["mac"] = self._mac(entry)
        self._f.write((json.dumps(entry) + "\n").encode())
        self._f.flush()
        os.fsync(self._f.fileno())
        self.done[chunk.seq] = entry

    def close(self) -> None:
        self._f.close()


# --- engines ----------------------------------------------------------------------------------------------

ChunkResults = Iterator[tuple[Chunk, bytes, dict]]
T = TypeVar("T")

_WORKER: dict = {}


def _pool_init(root: str, settings: Settings) -> None:
    _WORKER["root"], _WORKER["worker"] = Path(root), Worker.from_settings(settings)


def _pool_task(chunk: Chunk) -> tuple[Chunk, bytes, dict]:
    data, stats = process_chunk(_WORKER["root"], chunk, _WORKER["worker"])
    return chunk, data, stats


def in_completion_order(submit: Callable[[T], cf.Future], work: Iterable[T], limit: int) -> Iterator:
    """The result of each unit of work as soon as it is done, with at most `limit` units submitted and not
    yet taken: the driver journals steadily and never holds more than `limit` units' output."""
    pending = iter(work)
    running: set[cf.Future] = set()
    try:
        while True:
            for unit in pending:
                running.add(submit(unit))
                if len(running) >= limit:
                    break
            if not running:
                return
            finished, running = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                yield fut.result()
    finally:
        for fut in running:
            fut.cancel()


def run_local(root: Path, settings: Settings, todo: list[Chunk], workers: int, stack: TextStack | None = None) -> ChunkResults:
    """A process pool over the cores (in-process for one worker, with `stack` if given); at most 2 chunks
    per worker in flight."""
    if workers <= 1:
        worker = Worker.from_settings(settings, stack)
        for chunk in todo:
            yield (chunk, *process_chunk(root, chunk, worker))
        return
    ctx = multiprocessing.get_context("fork")
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_pool_init, initargs=(str(root), settings)) as pool:
        yield from in_completion_order(lambda chunk: pool.submit(_pool_task, chunk), todo, 2 * workers)


# --- progress ------------------------------------------------------------------------------------------------

class ProgressReport:
    """A rich bar with resources/s and ETA on a terminal; a plain line every few seconds otherwise (stderr)."""

    def __init__(self, total: int, done: int, tty: bool | None = None):
        self.total, self.done, self.start_done = total, done, done
        self.started = self.last = time.monotonic()
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._bar = None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("bulk"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=False)
            self._task = self._bar.add_task("bulk", total=total, completed=done, rate="")
            self._bar.start()

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0

    def advance(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, rate=f"{self.rate():,.0f} resources/s")
        elif time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.last = time.monotonic()
            print(self.line(), file=sys.stderr, flush=True)

    def line(self) -> str:
        rate = self.rate()
        eta = (self.total - self.done) / rate if rate > 0 else 0
        share = self.done / self.total if self.total else 1.0
        return (f"bulk: {self.done:,}/{self.total:,} resources ({share:.0%}), {rate:,.0f} resources/s, "
                f"ETA {int(eta) // 60}:{int(eta) % 60:02d}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# --- the run -------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """What the run did, for the exit code and the closing log line."""

    written: int
    refused: int
    invalid: int
    resumed_chunks: int
    stopped: bool = False


def run(export: Export, out: Path, settings: Settings, journal: Journal,
        engine_fn: Callable[[list[Chunk]], ChunkResults], *, fail_fast: bool = False, tty: bool | None = None,
        trail=None,
        log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> Outcome:
    """Pass 2 and the finish: map the unfinished chunks, journal them, then join, manifest and summary."""
    todo = [c for c in export.chunks if c.seq not in journal.done]
    if journal.done:
        log(f"bulk: resuming: {len(journal.done)} of {len(export.chunks)} chunks were finished by an earlier run")
    progress = ProgressReport(export.resources, sum(c.lines for c in export.chunks if c.seq in journal.done), tty)
    stopped = False
    try:
        for chunk, data, stats in engine_fn(todo):
            entries = stats.pop("audit", [])
            if trail is not None:
                trail.append(entries)  # durable before the chunk's output is kept
            journal.record(chunk, data, stats)
            progress.advance(chunk.lines)
            if fail_fast and stats["refusals"]:
                line, _, reason = stats["refusals"][0]
                log(f"bulk: refused {chunk.file}: line {line} ({reason}); stopping (--fail-fast)")
                stopped = True
                break
    finally:
        progress.close()
        journal.close()
    if stopped:
        return Outcome(0, 1, 0, len(journal.done), stopped=True)
    summary = finish(out, export, journal, settings)
    log(progress.line())
    shutil.rmtree(out / WORK_DIR, ignore_errors=True)
    invalid = sum(n for r, n in summary["refused"].items() if r in ("invalid-json", "not-a-resource", "invalid-resource"))
    return Outcome(sum(summary["resources"].values()), sum(summary["refused"].values()) - invalid, invalid,
                   len(journal.done) - len(todo))


def finish(out: Path, export: Export, journal: Journal, settings: Settings) -> dict:
    """Join the parts into the output files (atomically), then write the manifest and the summary."""
    by_file: dict[str, list[Chunk]] = {}
    for c in export.chunks:
        by_file.setdefault(c.file, []).append(c)
    written: dict[str, int] = {}
    refused: dict[str, int] = {}
    refusals: list[dict] = []
    outputs: list[dict] = []
    for rel in export.files:
        types: dict[str, int] = {}
        for c in by_file[rel]:
            stats = journal.done[c.seq]["stats"]
            for t, n in stats["written"].items():
                types[t] = types.get(t, 0) + n
            for line, rid, reason in stats["refusals"]:
                refused[reason] = refused.get(reason, 0) + 1
                refusals.append({"file": rel, "line": line, "id": rid, "reason": reason})
        _join(out / rel, [journal.part(c.seq) for c in by_file[rel]])
        for t, n in types.items():
            written[t] = written.get(t, 0) + n
        main_type = max(sorted(types), key=lambda t: types[t]) if types else rel.split(".", 1)[0]
        outputs.append({"type": main_type, "url": rel, "count": sum(types.values())})
    profile = settings.profile_rules()
    tags = {"keyId": key_id_for(settings.secret), "profile": safe_harbor_gaps.label(profile), "stack": settings.stack,
            **({"siteRules": profile.rules_sha256} if profile.rules_sha256 else {}),
            "safeHarbor": not profile.safe_harbor_gaps}
    manifest = {**export.manifest_fields, "requiresAccessToken": False,
                "output": [o for o in outputs if o["type"] != "OperationOutcome"],
                "error": [o for o in outputs if o["type"] == "OperationOutcome"],
                "extension": {"http://deid-adapter.org/bulk/de-identified": tags}}
    summary = {"deid-adapter": "bulk", **tags, "patients_indexed": export.patients,
               "resources": dict(sorted(written.items())), "refused": dict(sorted(refused.items())),
               "refusals": refusals, "files": outputs, "skipped": export.skipped}
    fhir_files.write_atomic(out / export.manifest_name, (json.dumps(manifest, indent=2) + "\n").encode())
    fhir_files.write_atomic(out / SUMMARY_NAME, (json.dumps(summary, indent=2) + "\n").encode())
    return summary


def _join(target: Path, parts: list[Path]) -> None:
    """Concatenate part files into `target` through a temporary file and a rename (streamed, never all in memory)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.join.tmp")
    with tmp.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, target)


def run_identity(root: Path, files: list[str], key_id: str, profile: str, stack: str, validate: str,
                 chunk_bytes: int, fhir_version: str = versions.DEFAULT) -> dict:
    """What a resumed run must share with the run it resumes: the input files (size, mtime), key id and settings."""
    inputs = [[rel, (root / rel).stat().st_size, (root / rel).stat().st_mtime_ns] for rel in files]
    return {"inputs": inputs, "key_id": key_id, "profile": profile, "stack": stack, "validate": validate,
            "chunk_bytes": chunk_bytes, "fhir_version": fhir_version}
