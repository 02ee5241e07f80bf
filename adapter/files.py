"""Read FHIR inputs (a Bundle or resource .json, an .ndjson file, a folder of those) and write outputs atomically."""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

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
    found = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and (p.is_file() or is_dangling(p)))
    check_links(root, found)
    return [(p, p.relative_to(root)) for p in found]


def is_dangling(path: Path) -> bool:
    return path.is_symlink() and not path.exists()


def check_links(root: Path, found: list[Path]) -> None:
    """InputError for a link among the inputs that leads nowhere: a file meant for the run would be missing from
    it without a word (its name is relative to the input folder, as the user gave it)."""
    dangling = [p for p in found if is_dangling(p)]
    if dangling:
        raise InputError(f"{root}: {len(dangling)} link(s) lead nowhere, first {dangling[0].relative_to(root)}; "
                         "remove or mend them")


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


def ndjson_records(path: Path, skip: frozenset[int] = frozenset()) -> Iterator[tuple[int, bytes, dict]]:
    """(line number, the line's bytes as read, its JSON) of each line of an NDJSON file that is not blank nor in
    `skip`, read a line at a time: the file is never held. Lines and their numbers are those of `read` (ended by
    LF, CR LF or CR); InputError as `read` says it, for the first line at fault."""
    try:
        with path.open("rb") as f:
            n = 0
            for i, chunk in enumerate(f):  # (a chunk ends with LF: a CR LF is never split)
                for line in (chunk.removeprefix(BOM) if i == 0 else chunk).splitlines():
                    n += 1
                    if n in skip or not line.strip():
                        continue
                    try:
                        line.decode("utf-8")
                    except UnicodeDecodeError:
                        raise InputError(f"{path}: not UTF-8 text") from None
                    yield n, line, _loads(line, f"{path}: line {n}")
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None


class LinesWriter:
    """An NDJSON output a line at a time, into a temporary file beside its target; `publish` renames it into
    place (readers never see a partial file), `discard` leaves nothing behind."""

    def __init__(self, target: Path, root: Path | None = None) -> None:
        make_folder(target, root)
        fd, self.tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        self.out = os.fdopen(fd, "wb")

    def add(self, line: bytes) -> None:
        self.out.write(line + b"\n")

    def publish(self, target: Path) -> None:
        """Into place at `target`, a name in the folder of the target it was opened for."""
        self.out.flush()
        os.fsync(self.out.fileno())
        self.out.close()
        os.replace(self.tmp, target)
        self.tmp = None

    def discard(self) -> None:
        self.out.close()
        if self.tmp is not None:
            os.unlink(self.tmp)
            self.tmp = None


@dataclass
class BundleText:
    """A .json Bundle read for entry-by-entry work (fhir_transforms/r4/stream.py): its text, its members but
    `entry`, the keys before `entry`, where each entry starts, and the SHA-256 of its bytes as read (the audit's
    input hash), so that neither the bytes nor the parsed entries are held."""

    text: str
    header: dict
    before: list[str]
    starts: list[int]
    digest: object

    def entries(self):
        return json_input.entries_at(self.text, self.starts)


def read_bundle(path: Path) -> BundleText | None:
    """A .json file holding a Bundle with an entry array, as BundleText; None for anything else (or anything
    the strict parse refuses): `read` answers for those."""
    if path.suffix != ".json":
        return None
    try:
        data = path.read_bytes().removeprefix(BOM)
        digest = hashlib.sha256(data)
        text = data.decode("utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    del data
    parts = json_input.split_bundle(text)
    if parts is None or parts[0].get("resourceType") != "Bundle":
        return None
    return BundleText(text, *parts, digest)


class EntryWriter:
    """Writes a Bundle entry by entry, to the same bytes as `serialize` of the whole Bundle: the entries go to a
    temporary file as they come; `finish` writes the Bundle around them to a temporary file beside the target
    (hashing what it writes); `publish` renames it into place. Nothing is left behind on `discard`."""

    def __init__(self, target: Path, root: Path | None = None) -> None:
        make_folder(target, root)
        self.target, self.count, self.final = target, 0, None
        self.entries = tempfile.TemporaryFile(dir=target.parent)

    def add(self, entry) -> None:
        # an entry sits two levels down in the Bundle: `serialize` indents it by 4 more spaces (JSON strings hold no newline)
        text = serialize([entry], False)[:-1].replace(b"\n", b"\n    ")
        self.entries.write((b",\n    " if self.count else b"\n    ") + text)
        self.count += 1

    def finish(self, header: dict, before: list[str]):
        """Write the output file (not yet in place); the SHA-256 of its bytes."""
        token = secrets.token_hex(16)
        doc = {k: v for k, v in header.items() if k in before}
        if self.count:
            doc["entry"] = token
        doc.update((k, v) for k, v in header.items() if k not in before)
        head, _, tail = serialize([doc], False).partition(f'"{token}"'.encode())
        fd, self.final = tempfile.mkstemp(dir=self.target.parent, prefix=f".{self.target.name}.", suffix=".tmp")
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            parts = [head, b"["] if self.count else [head]
            for part in parts:
                out.write(part)
                digest.update(part)
            if self.count:
                self.entries.seek(0)
                while chunk := self.entries.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                tail = b"\n  ]" + tail
            out.write(tail)
            digest.update(tail)
            out.flush()
            os.fsync(out.fileno())
        self.entries.close()
        return digest

    def publish(self) -> None:
        os.replace(self.final, self.target)
        self.final = None

    def discard(self) -> None:
        self.entries.close()
        if self.final is not None:
            os.unlink(self.final)
            self.final = None


def _loads(text: str | bytes, where: str) -> dict:
    try:
        doc = json_input.loads(text)
    except json_input.JsonInputError as e:
        raise InputError(f"{where}: {e}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{where}: a FHIR resource must be a JSON object")
    return doc


def serialize(resources: list[dict], ndjson: bool) -> bytes:
    """Deterministic bytes: same resources → same bytes (those of json.dumps(ensure_ascii=False), compact a
    line for NDJSON, else indent=2)."""
    if ndjson:
        return b"".join(compact(r) + b"\n" for r in resources)
    # the stdlib writes an indented document in pure Python (8x its compact C encoder); msgspec indents the
    # compact text in C, to the same bytes (json.dump(indent=2, ensure_ascii=False))
    return msgspec.json.format(compact(resources[0]), indent=2) + b"\n"


_ENCODE = msgspec.json.Encoder().encode
# Where msgspec's compact text differs from the stdlib's (float.__repr__): a float the stdlib writes with an
# exponent, below 1e-4 or from 1e16 (msgspec: 0.00001 for 1e-05, 1e16 for 1e+16), and NaN or Infinity (msgspec:
# null). A text that may hold either is written by the stdlib: null or "0.0000" anywhere (strings included), or
# an exponent that ends a number (a digit, e, digits, then , ] } or the end: in a string the end is a quote).
# Integers of any size come out the same. (Three searches: one regex of all three is five times slower.)
_EXPONENT = re.compile(rb"0e\+?0+(?:,|$)")  # searched in the text's byte classes (_CLASSES)
# Each digit read as 0, E as e, a sign as +, ] and } as a comma (other bytes as themselves): the pattern then
# starts with a literal ("0e"), which the regex engine finds far faster than it tries a match at every "e".
_CLASSES = bytes.maketrans(b"123456789E-]}", b"000000000e+,,")


def _has_exponent(text: bytes) -> bool:
    """Whether a compact JSON text may hold a number with an exponent (a string that looks like one counts)."""
    return _EXPONENT.search(text.translate(_CLASSES)) is not None


def compact(doc) -> bytes:
    """json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False) as UTF-8, by msgspec's encoder
    (~10x): NaN or Infinity, which JSON does not have, is a ValueError, never a bare NaN written."""
    text = _ENCODE(doc)
    if b"null" in text or b"0.0000" in text or _has_exponent(text):
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return text


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


def make_folder(path: Path, root: Path | None = None) -> None:
    """Create the folder `path` is written into; with `root`, it must lie inside it (checked before and after
    creating it, so a link planted meanwhile cannot lead the write out)."""
    if root is not None:
        check_inside(path, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    if root is not None:
        check_inside(path, root)


def write_atomic(path: Path, data: bytes | BinaryIO, root: Path | None = None) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see a partial file. `data`: bytes, or
    a file read from its start. With `root`, the folder written into must lie inside it (checked before and after
    creating it; a link at `path` itself is replaced, never followed)."""
    make_folder(path, root)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data.seek(0)
                shutil.copyfileobj(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class HashingWriter:
    """A binary file that keeps the SHA-256 of what is written to it (`digest`: the audit's output hash)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.digest = out, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.out.write(data)


def text_digest(text: str, chunk: int = 1 << 20):
    """The SHA-256 of `text` as UTF-8 (the audit's input hash), without a second copy of a large text."""
    digest = hashlib.sha256()
    for i in range(0, len(text), chunk):
        digest.update(text[i:i + chunk].encode())
    return digest


NAME_TOKEN = re.compile(r"[^\W_]+")  # words of a file name or a known value (Bob965, Koepp, 1484a42d)
NAME_PART = re.compile(r"[^\W\d_]{3,}|\d{4,}")  # their letter and digit runs (Bob; 965 too short: kept apart)
# Known values whose words name the patient in a file name: names, and identifiers as whole words (an MRN, a
# uuid part). Addresses, URLs and telecom share common words ("visit", "clinic") with neutral file names.
NAMING = ("NAME",)
IDENTIFYING_WHOLE = ("MEDICAL_RECORD_NUMBER", "SOCIAL_SECURITY_NUMBER", "UNIQUE_IDENTIFIER", "ACCOUNT_NUMBER",
                     "HEALTH_PLAN_BENEFICIARY_NUMBER")


def _name_tokens(text: str) -> set[str]:
    words = NAME_TOKEN.findall(text.casefold())
    return {w for w in words if len(w) >= 3} | {p for w in words for p in NAME_PART.findall(w)}


def private_name(target: Path, known, pseudo) -> Path:
    """`target`, or where its file name holds a word of one of the record's people's names or an identifier
    (Synthea's `Given_Family_uuid.json`) a keyed pseudonym of the name with the same extension: a release's file
    names must not name its patients. The same name and key always give the same pseudonym."""
    return pseudonymous_name(target, pseudo) if names_file(_name_tokens(target.stem), known) else target


def file_name_words(target: Path) -> set[str]:
    """The words of a file's name that `names_file` compares (read once for a file whose records come one by one)."""
    return _name_tokens(target.stem)


def names_file(name_words: set[str], known) -> bool:
    """Whether the words of a file's name (`file_name_words`) hold a word of a known name or identifier."""
    if not name_words:
        return False
    words = set()
    for k in known:
        if k.category in NAMING:
            words |= _name_tokens(k.value)
        elif k.category in IDENTIFYING_WHOLE and len(k.value) >= 4:
            # with a digit: an MRN or a uuid's part, not a label such as an id's "example" or "visit"
            words |= {w for w in NAME_TOKEN.findall(k.value.casefold()) if len(w) >= 4 and any(c.isdigit() for c in w)}
    return bool(words & name_words)


def pseudonymous_name(target: Path, pseudo) -> Path:
    return target.with_name(f"record-{pseudo.token('file-name', target.name, 16)}{target.suffix}")
