"""The audit trail: one append-only, hash-chained, HMAC-signed record per de-identification, refusal, review
decision and re-identification, stored with SQLAlchemy (SQLite by default, PostgreSQL by URL).

A record holds who, when, what operation, SHA-256 of input and output, profile, rules version, stack and
detector versions, the pseudonym key id, and where PHI was found (path, offsets, category, detector,
confidence). It never holds covered text, an original value or a key. Each record holds the hash of the one
before it; a signed head checkpoint names the last record, so a truncated tail is found too; and a signed line in
an anchor file outside the store (adapter/audit/anchor.py) names it again, so a store rolled back whole to an
earlier consistent head is found as well. Appends are
serialized (SQLite `BEGIN IMMEDIATE`, PostgreSQL `SELECT … FOR UPDATE` on the head row) and committed
(fsync) before the caller is answered, so any number of threads and processes keep one chain.
"""
from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import os
import socket
import sqlite3
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from json.encoder import encode_basestring  # how json.dumps(ensure_ascii=False) writes a string
from pathlib import Path
from functools import lru_cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Iterable, Iterator, NamedTuple, Optional, Sequence

from urllib.parse import quote

from adapter import settings
from adapter.audit.anchor import Anchor, AnchorError, AnchoredHead, default_path
from fhir_transforms import keys

if TYPE_CHECKING:
    from sqlalchemy import MetaData
    from sqlalchemy.engine import Connection, Engine

AUDIT_ENV = "DEID_ADAPTER_AUDIT"
AUDIT_KEY_ENV = "DEID_ADAPTER_AUDIT_KEY_FILE"
ACTOR_ENV = "DEID_ADAPTER_ACTOR"
GENESIS = "0" * 64
OFF = "off"
# The fields a record's hash covers, in this order. `seq` is only the storage order: the chain is the hashes.
HASHED = ("time", "actor", "channel", "operation", "data_format", "input_sha256", "output_sha256", "profile",
          "rules_version", "stack", "versions", "key_id", "findings", "detail", "audit_key_id", "prev_hash")
SQLITE_TIMEOUT_S = 120  # how long a writer waits for SQLite's write lock
PG_SCHEMA_LOCK = 0x6465_6964_6175_64  # pg_advisory_xact_lock id taken while creating tables: "deidaud"


@lru_cache(maxsize=None)
def tables() -> SimpleNamespace:
    """The store's tables (metadata, records, head). SQLAlchemy is imported here, when a store is first used, so
    a command run with `--audit off` never loads it."""
    import sqlalchemy as sa

    metadata = sa.MetaData()
    records = sa.Table(
        "deid_audit_record", metadata,
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("time", sa.String(40), nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("operation", sa.String(32), nullable=False),
        sa.Column("data_format", sa.String(32), nullable=False),
        sa.Column("input_sha256", sa.String(64), nullable=False),
        sa.Column("output_sha256", sa.String(64), nullable=False),
        sa.Column("profile", sa.String(64), nullable=False),
        sa.Column("rules_version", sa.String(64), nullable=False),
        sa.Column("stack", sa.String(64), nullable=False),
        sa.Column("versions", sa.Text, nullable=False),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("findings", sa.Text, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("audit_key_id", sa.String(40), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("record_hash", sa.String(64), nullable=False),
        sa.Column("signature", sa.String(64), nullable=False),
    )
    head = sa.Table(
        "deid_audit_head", metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("record_hash", sa.String(64), nullable=False),
        sa.Column("audit_key_id", sa.String(40), nullable=False),
        sa.Column("signature", sa.String(64), nullable=False),
    )
    return SimpleNamespace(metadata=metadata, records=records, head=head)


class AuditError(RuntimeError):
    """The audit trail cannot be written or read: the caller must not answer as if the work were accounted for."""


class TrailMissing(AuditError):
    """Opened for reading, there is no audit trail: no database file, or no audit tables in the database."""


@dataclass(frozen=True)
class AuditEntry:
    """What one record says, before the trail chains and signs it. Every field is free of PHI by construction."""

    operation: str  # deidentify | refuse | review | reidentify | reidentify-denied
    actor: str
    channel: str  # cli | service | mllp | bulk | vault
    data_format: str = ""  # fhir | hl7v2 | text
    input_sha256: str = ""
    output_sha256: str = ""
    profile: str = ""
    rules_version: str = ""
    stack: str = ""
    versions: dict | str = field(default_factory=dict)  # or its canonical JSON, when many entries share it
    key_id: str = ""
    findings: Sequence = ()  # [path, start, end, category, detector, confidence]
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Break:
    """The first place the chain does not hold: which record (its seq), what kind of break, and a sentence."""

    seq: int
    kind: str  # changed | wrong-signature | unknown-key | deleted | inserted | reordered | truncated | head | anchor
    message: str


@dataclass(frozen=True)
class VerifyReport:
    records: int
    head_seq: int
    head_hash: str
    broken: Optional[Break] = None
    anchor_seq: Optional[int] = None  # the head its anchor file names (None: no anchor)

    @property
    def ok(self) -> bool:
        return self.broken is None

    def to_json(self) -> dict:
        out = {"ok": self.ok, "records": self.records, "head_seq": self.head_seq, "head_hash": self.head_hash,
               "anchor_seq": self.anchor_seq}
        if self.broken:
            out["broken"] = {"seq": self.broken.seq, "kind": self.broken.kind, "message": self.broken.message}
        return out


# --- what goes into a record


def sha256_of(data: bytes | str | dict | list | None) -> str:
    """Hex SHA-256 of bytes as given, of str as UTF-8, of a JSON document in canonical form (sorted keys, no spaces)."""
    if data is None:
        return ""
    if hasattr(data, "hexdigest"):  # a hashlib object, fed as a large file was read or written
        return data.hexdigest()
    if isinstance(data, (dict, list)):
        data = canonical_json(data)
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 characters as they are: the form a document's hash is taken of."""
    return _canonical(value)


# Built once: json.dumps with non-default options builds a new encoder on every call.
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def default_actor() -> str:
    """DEID_ADAPTER_ACTOR, or the OS user at this host."""
    actor = settings.actor()
    if actor:
        return actor
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _adapter_version() -> str:
    from importlib import metadata as md

    try:
        return md.version("deid-adapter")
    except md.PackageNotFoundError:
        return "unknown"


_VERSION: list[str] = []


def engine_versions(engine) -> dict:
    """Profile, rules version, stack, detector/model/prompt versions and key id of a de-identifier (FHIR or HL7v2)."""
    if not _VERSION:
        _VERSION.append(_adapter_version())
    stack = getattr(engine, "stack", None)
    detectors = {}
    for d in getattr(stack, "detectors", ()):
        # only plain values: a detector's `model` may be the loaded model object itself
        detectors[d.name] = {k: str(v) for k in ("version", "model", "prompt_version")
                             if isinstance(v := getattr(d, k, None), (str, int, float)) and v != ""} or {"version": _VERSION[0]}
    profile = getattr(engine, "profile", None)
    site = getattr(profile, "rules_sha256", "")  # a site rules file: its hash marks every record made with it
    versions = {"deid-adapter": _VERSION[0], "detectors": detectors, **({"site_rules_sha256": site} if site else {})}
    # rules that keep more than Safe Harbor allows (their keys, never values): the record is not Safe Harbor's
    gaps = getattr(profile, "safe_harbor_gaps", ())
    versions["safe_harbor"] = f"no ({', '.join(g.where for g in gaps)})" if gaps else "yes"
    return {
        "profile": getattr(profile, "name", ""),
        "rules_version": str(getattr(profile, "version", "")) + (f"+site.{site[:16]}" if site else ""),
        "stack": getattr(stack, "name", ""),
        "versions": versions,
        "key_id": getattr(getattr(engine, "pseudo", None), "key_id", ""),
    }


def engine_info(engine) -> dict:
    """`engine_versions` with the versions already serialized: what every record of one de-identifier repeats."""
    info = engine_versions(engine)
    info["versions"] = canonical_json(info["versions"])
    return info


def locations(findings: Iterable, where: str = "", root: str = "") -> list[list]:
    """PHI locations of RecordResult.findings as [path, start, end, category, detector, confidence].

    `where` is the label the caller gave the record (often a file name, which may itself hold PHI): it is
    replaced by `root` (the resource type) so that only structural paths are kept.
    """
    out = []
    for f in findings:
        path = f.path
        if where and path.startswith(where):
            path = root + path[len(where):]
        s = f.span
        out.append([path, s.start, s.end, s.category, s.detector, round(float(s.confidence), 4)])
    return out


def deidentification(engine, *, actor: str, channel: str, data_format: str, input, output, findings: Iterable = (),
                     where: str = "", root: str = "", info: Optional[dict] = None) -> AuditEntry:
    """The entry for one de-identified record: `input`/`output` are bytes, text or a JSON document (hashed, never stored).

    `info` is `engine_info(engine)`, for a caller that makes many entries with one de-identifier."""
    return AuditEntry("deidentify", actor, channel, data_format, sha256_of(input), sha256_of(output),
                      findings=locations(findings, where, root), **(info or engine_versions(engine)))


def refusal(engine, *, actor: str, channel: str, data_format: str, input, reason: str, where: str = "",
            root: str = "", info: Optional[dict] = None) -> AuditEntry:
    """The entry for one refused record; `reason` is the refusal message (it names paths and categories, never values)."""
    if where:
        reason = reason.replace(where, root)
    return AuditEntry("refuse", actor, channel, data_format, sha256_of(input), detail={"reason": reason},
                      **(info or engine_versions(engine)))


def review(*, actor: str, channel: str, data_format: str, subject_sha256: str, decision: str, reason: str = "",
           findings: Iterable = ()) -> AuditEntry:
    """The entry for a reviewer's decision (accept, reject, redact more …) about a de-identified output."""
    return AuditEntry("review", actor, channel, data_format, output_sha256=subject_sha256,
                      findings=[list(f) for f in findings], detail={"decision": decision, "reason": reason})


# --- where records live


def state_dir() -> Path:
    """Where the default audit database and audit key live: $XDG_STATE_HOME/deid-adapter or ~/.local/state/deid-adapter."""
    return settings.state_dir()


def database_url(target: str | os.PathLike | None) -> str:
    """A SQLAlchemy URL from a URL, a file path (SQLite), or None (DEID_ADAPTER_AUDIT, else the default SQLite file)."""
    target = str(target or settings.audit_store() or state_dir() / "audit.sqlite")
    if "://" in target:
        if target.startswith(("postgresql://", "postgres://")):
            target = "postgresql+psycopg://" + target.split("://", 1)[1]
        return target
    path = Path(target).expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def existing_url(target: str | os.PathLike | None) -> str:
    """`database_url` for a store that must already exist: no folder is made for a SQLite path."""
    target = str(target or settings.audit_store() or state_dir() / "audit.sqlite")
    if "://" in target:
        return database_url(target)
    return f"sqlite:///{Path(target).expanduser()}"


def create_tables(conn: Connection, tables: MetaData) -> None:
    """Create a store's tables; on PostgreSQL under an advisory lock, so processes starting together do not race."""
    import sqlalchemy as sa

    if conn.engine.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_SCHEMA_LOCK})
    tables.create_all(conn)


def make_engine(url: str, read_only: bool = False) -> Engine:
    """An engine whose write transactions serialize: SQLite in WAL mode with synchronous=FULL and BEGIN IMMEDIATE.

    `read_only`: an existing SQLite file opened read-only (TrailMissing when there is none); nothing is set on it."""
    from sqlalchemy import create_engine, event

    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    if read_only:
        url = _read_only_sqlite(url)
    engine = create_engine(url, connect_args={"timeout": SQLITE_TIMEOUT_S, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # transactions are begun below, by us
        if read_only:
            return
        cur = dbapi_connection.cursor()
        _wal(cur)
        cur.execute("PRAGMA synchronous=FULL")  # a commit is on disk before it returns
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        # Writers take the write lock up front, so two appends never read the same head; readers take a snapshot.
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("audit_read") else "BEGIN IMMEDIATE")

    return engine


def _wal(cur) -> None:
    """PRAGMA journal_mode=WAL, waiting as the busy timeout would: while another connection switches a new file to
    WAL, SQLite answers "database is locked" at once, without calling its busy handler (threads opening a new store
    together hit it)."""
    deadline = time.monotonic() + SQLITE_TIMEOUT_S
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _read_only_sqlite(url: str) -> str:
    """The SQLite URL of an existing database file, opened read-only (mode=ro: no journal, no checkpoint, no schema)."""
    path = url.split(":///", 1)[1] if ":///" in url else ""
    if not path or path == ":memory:" or path.startswith("file:"):
        raise AuditError(f"audit store {url}: not a SQLite database file")
    if not Path(path).is_file():
        raise TrailMissing(f"no audit trail at {path}: the file does not exist (a mistyped path?)")
    return f"sqlite:///file:{quote(path)}?mode=ro&uri=true"


def _record_hash(row) -> str:
    return hashlib.sha256(_compact([row[name] for name in HASHED]).encode()).hexdigest()


def _middle(fields: Sequence[str]) -> str:
    """The hashed fields between `time` and `prev_hash` (all strings), as they stand inside the hashed JSON array.

    An append serializes this part before it takes the write lock; under the lock it only adds the time
    and the previous hash (hex and ISO 8601, which JSON writes as they are), giving the same bytes as
    `_record_hash`. A field that is not a string fails here (TypeError) rather than be stored as text and
    no longer verify."""
    return ",".join(map(encode_basestring, fields))


def _chained_hash(time: str, middle: str, prev: str) -> str:
    return hashlib.sha256(f'["{time}",{middle},"{prev}"]'.encode()).hexdigest()


def _mac(secret: bytes, label: bytes, message: str) -> str:
    return hmac.digest(secret, label + b"\x00" + message.encode(), "sha256").hex()


def _record_signature(secret: bytes, record_hash: str) -> str:
    return _mac(secret, b"deid-adapter audit record", record_hash)


def _head_signature(secret: bytes, seq: int, record_hash: str) -> str:
    return _mac(secret, b"deid-adapter audit head", f"{seq}:{record_hash}")


class _AppendSql(NamedTuple):
    locked_head: str
    insert: str
    copy: str  # psycopg 3 on PostgreSQL: COPY, the fastest way in for a batch; "" elsewhere
    update_head: str


def _append_sql(dialect) -> _AppendSql:
    """An append's three statements, written once for the store's driver: no expression is built or compiled per append."""
    marks = {"qmark": "?", "format": "%s", "pyformat": "%s"}
    if dialect.paramstyle not in marks:
        raise AuditError(f"audit store: unsupported database driver {dialect.driver} ({dialect.paramstyle} parameters)")
    mark, quote = marks[dialect.paramstyle], dialect.identifier_preparer.quote
    columns = ("seq", *HASHED, "record_hash", "signature")
    lock = " FOR UPDATE" if dialect.name == "postgresql" else ""  # SQLite: BEGIN IMMEDIATE holds the write lock already
    names = ", ".join(map(quote, columns))
    return _AppendSql(
        f"SELECT seq, record_hash, audit_key_id, signature FROM {quote(tables().head.name)} WHERE id = 1{lock}",
        f"INSERT INTO {quote(tables().records.name)} ({names}) VALUES ({', '.join([mark] * len(columns))})",
        f"COPY {quote(tables().records.name)} ({names}) FROM STDIN" if dialect.driver == "psycopg" else "",
        f"UPDATE {quote(tables().head.name)} SET seq = {mark}, record_hash = {mark}, audit_key_id = {mark}, signature = {mark} "
        "WHERE id = 1")


class AuditTrail:
    """One audit store and the audit key ring: append entries, verify the chain, export the accounting."""

    def __init__(self, url: str, ring: Sequence[keys.Key], engine: Optional[Engine] = None, *, read_only: bool = False,
                 anchor: str | os.PathLike | None = None):
        """`read_only`: verify and export only; the store must exist (TrailMissing names what is not there) and
        nothing is created or written, not even the genesis head. `anchor`: the store's anchor file (default:
        adapter/audit/anchor.py default_path)."""
        if not ring:
            raise AuditError("no audit key")
        self.url = url
        self.key = ring[0]  # the current key signs; the retired ones still verify
        self.ring = {k.key_id: k for k in ring}
        self.read_only = read_only
        from sqlalchemy.exc import SQLAlchemyError

        self.engine = engine or make_engine(url, read_only)
        anchor_path = Path(anchor) if anchor else default_path(url, state_dir())
        self.anchor = Anchor(anchor_path) if anchor_path else None
        self.is_postgres = self.engine.dialect.name == "postgresql"
        self._sql = _append_sql(self.engine.dialect)
        try:
            if read_only:
                self._check_tables()
            else:
                self._ensure_schema()
                if self.anchor is not None:
                    self._check_against_anchor()
        except SQLAlchemyError as e:
            raise AuditError(f"audit store {self.display_url}: {type(e).__name__}: {_short(e)}") from None

    @classmethod
    def open(cls, target: str | os.PathLike | None = None, key_file: str | os.PathLike | None = None, *,
             read_only: bool = False, anchor: str | os.PathLike | None = None) -> AuditTrail:
        """The trail at `target` (URL or SQLite path; default DEID_ADAPTER_AUDIT, else ~/.local/state/deid-adapter/audit.sqlite)
        signed with the audit key at `key_file` (default DEID_ADAPTER_AUDIT_KEY_FILE, else audit.key beside the default
        database, created on first use with mode 0600; never by a `read_only` open). `anchor`: the anchor file (default
        DEID_ADAPTER_AUDIT_ANCHOR, else beside a SQLite store or in the state folder)."""
        key_path = Path(key_file or settings.audit_key_file() or state_dir() / "audit.key")
        try:
            if not read_only and not key_file and not settings.audit_key_file() and not key_path.exists():
                key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                try:
                    keys.init_key_file(key_path, "audit")
                except FileExistsError:
                    pass  # another process made it first
            ring = [k for _, k, _ in keys.key_ring(key_path, "audit")]
        except keys.KeyError_ as e:
            raise AuditError(f"audit key: {e}") from None
        except OSError as e:
            raise AuditError(f"audit key {key_path}: {e.strerror}") from None
        return cls(existing_url(target) if read_only else database_url(target), ring, read_only=read_only,
                   anchor=anchor or settings.audit_anchor())

    @property
    def display_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def _check_tables(self) -> None:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            found = sa.inspect(conn)
            missing = [t.name for t in (tables().records, tables().head) if not found.has_table(t.name)]
        if missing:
            raise TrailMissing(f"no audit trail in {self.display_url}: table(s) {', '.join(missing)} missing "
                               "(a mistyped path or URL, or dropped tables)")

    def _ensure_schema(self) -> None:
        import sqlalchemy as sa

        records, head = tables().records, tables().head
        with self.engine.begin() as conn:
            create_tables(conn, tables().metadata)
            if conn.execute(sa.select(head.c.id)).first() is None:
                if conn.execute(sa.select(records.c.seq).limit(1)).first() is not None:
                    raise AuditError(f"audit store {self.display_url}: records without a head checkpoint (the head row "
                                     "was deleted); run `deid-adapter audit verify`")
                conn.execute(sa.insert(head).values(id=1, seq=0, record_hash=GENESIS, audit_key_id=self.key.key_id,
                                                 signature=_head_signature(self.key.secret, 0, GENESIS)))

    # --- writing

    def append(self, entries: Sequence[AuditEntry]) -> list[int]:
        """Chain, sign and commit `entries` in one transaction; returns their seqs once they are on disk."""
        if not entries:
            return []
        # Everything but the time and the chain link is serialized before the write lock is taken.
        fields = [self._fields(e) for e in entries]
        middles = [_middle(f) for f in fields]
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with self.engine.connect() as conn:
                first, last, last_hash = self._append_rows(conn.connection.dbapi_connection, fields, middles)
        except (SQLAlchemyError, self.engine.dialect.loaded_dbapi.Error) as e:
            raise AuditError(f"audit store {self.display_url}: {type(e).__name__}: {_short(e)}") from None
        if self.anchor is not None:
            try:
                self.anchor.write(self.key, last, last_hash)
            except AnchorError as e:
                raise AuditError(str(e)) from None
        return list(range(first, last + 1))

    def _append_rows(self, dbapi, fields: list[tuple], middles: list[str]) -> tuple[int, int, str]:
        """One transaction on the driver's own connection (SQLAlchemy's per-statement work is most of a small
        append): lock the head, chain and sign, insert, move the head, commit. Returns the first and last seq and
        the last record's hash."""
        secret = self.key.secret
        cur = dbapi.cursor()
        try:
            if not self.is_postgres:
                cur.execute("BEGIN IMMEDIATE")  # the write lock, before the head is read
            cur.execute(self._sql.locked_head)
            seq, prev = self._checked_head(cur.fetchone())
            first = seq + 1
            time = datetime.now(timezone.utc).isoformat(timespec="microseconds")  # one transaction, one time
            rows = []
            for f, middle in zip(fields, middles):
                seq += 1
                record_hash = _chained_hash(time, middle, prev)
                rows.append((seq, time, *f, prev, record_hash, _record_signature(secret, record_hash)))
                prev = record_hash
            if self._sql.copy:
                with cur.copy(self._sql.copy) as copy:
                    for row in rows:
                        copy.write_row(row)
            else:
                cur.executemany(self._sql.insert, rows)
            cur.execute(self._sql.update_head, (seq, prev, self.key.key_id, _head_signature(secret, seq, prev)))
            dbapi.commit()
        except BaseException:
            dbapi.rollback()
            raise
        finally:
            cur.close()
        return first, seq, prev

    def _checked_head(self, row) -> tuple[int, str]:
        """(seq, record hash) of the head checkpoint row (seq, record_hash, audit_key_id, signature) once its signature
        verifies."""
        if row is None:
            raise AuditError(f"audit store {self.display_url}: the head checkpoint is missing; run `deid-adapter audit verify`")
        seq, record_hash, key_id, signature = row
        key = self.ring.get(key_id)
        if key is None or not hmac.compare_digest(signature, _head_signature(key.secret, seq, record_hash)):
            raise AuditError(f"audit store {self.display_url}: the head checkpoint's signature does not verify; "
                             "run `deid-adapter audit verify`")
        return seq, record_hash

    def _fields(self, e: AuditEntry) -> tuple:
        """An entry's hashed fields from `actor` to `audit_key_id` (HASHED less `time` and `prev_hash`)."""
        return (e.actor, e.channel, e.operation, e.data_format, e.input_sha256, e.output_sha256, e.profile,
                e.rules_version, e.stack, e.versions if isinstance(e.versions, str) else _canonical(e.versions),
                e.key_id, _canonical(e.findings) if e.findings else "[]",
                _canonical(e.detail) if e.detail else "{}", self.key.key_id)

    def record_deidentification(self, engine, **kw) -> int:
        """Append one de-identification (see `deidentification` for the arguments); durable on return."""
        return self.append([deidentification(engine, **kw)])[0]

    def record_refusal(self, engine, **kw) -> int:
        """Append one refusal (see `refusal`); durable on return."""
        return self.append([refusal(engine, **kw)])[0]

    def record_review(self, **kw) -> int:
        """Append one review decision (see `review`); durable on return."""
        return self.append([review(**kw)])[0]

    # --- reading

    def _read(self):
        options = {"audit_read": True}
        if self.is_postgres:
            options["isolation_level"] = "REPEATABLE READ"
            options["postgresql_readonly"] = self.read_only
        return self.engine.connect().execution_options(**options)

    def verify(self) -> VerifyReport:
        """Walk the chain in one snapshot and return the first break: changed, deleted, inserted or reordered records,
        a wrong signature, a truncated tail or a bad head checkpoint."""
        from sqlalchemy.exc import SQLAlchemyError

        anchored, anchor_problem = None, None
        try:  # the anchor first: every line in it is of a committed append, so the snapshot taken next holds it
            anchored = self.anchor.lines(self.ring) if self.anchor is not None else None
        except AnchorError as e:
            anchor_problem = str(e)
        try:
            with self._read() as conn, conn.begin():
                report = self._verify(conn, anchored)
                if report.ok and anchor_problem:
                    return VerifyReport(report.records, report.head_seq, report.head_hash,
                                        Break(report.head_seq, "anchor", anchor_problem))
                return report
        except SQLAlchemyError as e:
            raise AuditError(f"audit store {self.display_url}: {type(e).__name__}: {_short(e)}") from None

    def _verify(self, conn: Connection, anchored: Optional[list[AnchoredHead]]) -> VerifyReport:
        import sqlalchemy as sa

        records, head = tables().records, tables().head
        h = conn.execute(sa.select(head).where(head.c.id == 1)).first()
        result = conn.execution_options(stream_results=True, yield_per=2000).execute(
            sa.select(records).order_by(records.c.seq))
        rows = (r._mapping for r in result)
        prev, last_seq, count = GENESIS, 0, 0
        broken = None
        for row in rows:
            problem = self._check(row)
            if problem is None and row["prev_hash"] == prev:
                prev, last_seq, count = row["record_hash"], row["seq"], count + 1
                continue
            following = next(rows, None)
            following = dict(following) if following is not None else None
            result.close()
            broken = self._classify(conn, row, problem, prev, last_seq, following, h)
            break
        head_seq = h.seq if h is not None else 0
        head_hash = h.record_hash if h is not None else ""
        if broken is None:
            broken = self._check_head(h, last_seq, prev, count)
        if broken is None:
            broken = self._check_anchor(conn, anchored, last_seq, count)
        return VerifyReport(count, head_seq, head_hash, broken, max(anchored).seq if anchored else None)

    def _check_anchor(self, conn: Connection, anchored: Optional[list[AnchoredHead]], last_seq: int,
                      count: int) -> Optional[Break]:
        """The store against its anchor: not behind it, and holding every record its last lines name."""
        if self.anchor is None:
            return None
        where = self.anchor.path
        if not anchored:
            if count == 0:
                return None
            return Break(last_seq, "anchor", f"the store holds {count} records but its anchor {where} is missing: a "
                                             "rollback cannot be ruled out (a store from before anchors gets one at "
                                             "its next append)")
        head = max(anchored)
        if head.seq > last_seq:
            return Break(last_seq + 1, "rolled-back", f"the store ends at record {last_seq} but its anchor {where} "
                                                      f"names record {head.seq}: the store was rolled back, "
                                                      f"records {last_seq + 1} to {head.seq} are gone")
        stored = self._hashes(conn, {a.seq for a in anchored})
        differing = sorted(a.seq for a in anchored if stored.get(a.seq) != a.record_hash)
        if differing:
            return Break(differing[0], "rolled-back", f"record {differing[0]} is not the one its anchor {where} "
                                                      "names: the store was rolled back and written again")
        return None

    def _hashes(self, conn: Connection, seqs: set[int]) -> dict[int, str]:
        import sqlalchemy as sa

        records = tables().records
        query = sa.select(records.c.seq, records.c.record_hash).where(records.c.seq.in_(sorted(seqs)))
        return {seq: record_hash for seq, record_hash in conn.execute(query)}

    def _check_against_anchor(self) -> None:
        """On opening a store to write: refuse one behind its anchor, or disagreeing with it (rolled back), rather
        than extend it past the records its anchor names."""
        import sqlalchemy as sa

        try:
            anchored = self.anchor.head(self.ring)
        except AnchorError as e:
            raise AuditError(f"{e}; run `deid-adapter audit verify`") from None
        if anchored is None:
            return
        records, head = tables().records, tables().head
        with self._read() as conn, conn.begin():
            seq = conn.execute(sa.select(head.c.seq).where(head.c.id == 1)).scalar() or 0
            found = conn.execute(sa.select(records.c.record_hash).where(records.c.seq == anchored.seq)).scalar()
        if seq < anchored.seq or found != anchored.record_hash:
            raise AuditError(f"audit store {self.display_url} was rolled back: its anchor {self.anchor.path} names "
                             f"record {anchored.seq}, {'which it no longer holds' if seq < anchored.seq else 'another one'}"
                             "; run `deid-adapter audit verify`")

    def _check(self, row) -> Optional[str]:
        if _record_hash(row) != row["record_hash"]:
            return "changed"
        key = self.ring.get(row["audit_key_id"])
        if key is None:
            return "unknown-key"
        if not hmac.compare_digest(row["signature"], _record_signature(key.secret, row["record_hash"])):
            return "wrong-signature"
        return None

    def _classify(self, conn: Connection, row, problem: Optional[str], prev: str, last_seq: int,
                  following: Optional[dict], h) -> Break:
        seq = row["seq"]
        if problem is not None:
            if following is not None and following["prev_hash"] == prev and self._check(following) is None:
                return Break(seq, "inserted", f"record {seq} was inserted: it is not part of the chain (record "
                                              f"{following['seq']} links to record {last_seq})")
            if h is not None and seq > h.seq:
                return Break(seq, "inserted", f"record {seq} was added after the signed head checkpoint "
                                              f"(record {h.seq}) and does not verify")
            if problem == "changed":
                return Break(seq, "changed", f"record {seq} was changed: its fields no longer match its hash")
            if problem == "unknown-key":
                return Break(seq, "unknown-key", f"record {seq} names audit key {row['audit_key_id']}, which is not in "
                                                 "the key ring (pass the retired key, or the record is forged)")
            return Break(seq, "wrong-signature", f"record {seq} has a wrong signature (its hash was recomputed "
                                                 "without the audit key, or it was signed by another key)")
        earlier_copy = self._seqs_with_hash(conn, row["record_hash"], seq, before=True)
        if earlier_copy:
            return Break(seq, "inserted", f"record {seq} was inserted: it is a copy of record {earlier_copy[0]}")
        predecessor = (self._seqs_with_hash(conn, row["prev_hash"], seq, before=False)
                       or self._seqs_with_hash(conn, row["prev_hash"], seq, before=True))
        if predecessor:
            return Break(seq, "reordered", f"record {seq} is out of order: it follows record {predecessor[0]}, "
                                           f"not record {last_seq}")
        first_missing = last_seq + 1
        return Break(first_missing, "deleted", f"record(s) deleted between record {last_seq} and record {seq}: "
                                               f"record {seq} links to a record that is no longer there")

    def _seqs_with_hash(self, conn: Connection, record_hash: str, seq: int, before: bool) -> list[int]:
        import sqlalchemy as sa

        records = tables().records
        where = records.c.seq < seq if before else records.c.seq > seq
        return list(conn.execute(sa.select(records.c.seq).where(records.c.record_hash == record_hash, where)
                                 .order_by(records.c.seq)).scalars())

    def _check_head(self, h, last_seq: int, last_hash: str, count: int) -> Optional[Break]:
        if h is None:
            return Break(last_seq + 1, "head", "the head checkpoint is missing (deleted)")
        key = self.ring.get(h.audit_key_id)
        if key is None or not hmac.compare_digest(h.signature, _head_signature(key.secret, h.seq, h.record_hash)):
            return Break(h.seq, "head", "the head checkpoint has a wrong signature")
        if h.seq == last_seq and h.record_hash == last_hash:
            return None
        if h.seq > last_seq or h.record_hash != last_hash:
            return Break(last_seq + 1, "truncated", f"the chain ends at record {last_seq} but the signed head "
                                                    f"checkpoint names record {h.seq}: the tail was truncated")
        return Break(h.seq + 1, "inserted", f"records after the signed head checkpoint (record {h.seq}) are not covered")

    def export(self, since: Optional[str] = None, until: Optional[str] = None,
               operations: Sequence[str] = ()) -> Iterator[dict]:
        """Records as dicts for an accounting of disclosures (JSON fields decoded; hashes and signatures left out)."""
        import sqlalchemy as sa

        records = tables().records
        query = sa.select(records).order_by(records.c.seq)
        if since:
            query = query.where(records.c.time >= since)
        if until:
            query = query.where(records.c.time < until)
        if operations:
            query = query.where(records.c.operation.in_(list(operations)))
        with self._read() as conn, conn.begin():
            for row in conn.execution_options(stream_results=True, yield_per=2000).execute(query):
                m = row._mapping
                out = {c: m[c] for c in ("seq", "time", "actor", "channel", "operation", "data_format", "profile",
                                         "rules_version", "stack", "key_id", "input_sha256", "output_sha256")}
                out["versions"] = json.loads(m["versions"])
                out["findings"] = [dict(zip(("path", "start", "end", "category", "detector", "confidence"), f))
                                   for f in json.loads(m["findings"])]
                out["detail"] = json.loads(m["detail"])
                yield out

    def close(self) -> None:
        self.engine.dispose()
        if self.anchor is not None:
            self.anchor.close()


def _short(e: Exception) -> str:
    """The first line of a database error without its SQL parameters (they could hold anything)."""
    orig = getattr(e, "orig", None) or e
    return str(orig).splitlines()[0][:200] if str(orig) else type(orig).__name__


class AuditSession:
    """What an edge holds while it works: the trail, who is acting, through which channel, with which de-identifier.

    Entries for the records of one output are collected and committed together (one transaction, one fsync)
    before that output is written or answered; `discard` drops them when the output is not written.
    """

    def __init__(self, trail: Optional[AuditTrail], engine, *, actor: str, channel: str, data_format: str, vault=None):
        self.trail, self.engine, self.vault = trail, engine, vault
        self.actor, self.channel, self.data_format = actor, channel, data_format
        self.pending: list[AuditEntry] = []
        self.info = engine_info(engine)  # serialized once, not per record

    def deidentified(self, input, output, findings: Iterable = (), where: str = "", root: str = "") -> None:
        if self.trail:
            self.pending.append(AuditEntry("deidentify", self.actor, self.channel, self.data_format, sha256_of(input),
                                           sha256_of(output), findings=locations(findings, where, root), **self.info))

    def refused(self, input, reason: str, where: str = "", root: str = "") -> None:
        """A refusal replaces what was pending: the output it belonged to is not written."""
        self.discard()
        if self.trail:
            if where:
                reason = reason.replace(where, root)
            self.pending.append(AuditEntry("refuse", self.actor, self.channel, self.data_format, sha256_of(input),
                                           detail={"reason": reason}, **self.info))

    def commit(self) -> None:
        """Make the pending entries (and the vault's pending pseudonyms) durable; AuditError if that fails."""
        if self.vault:
            self.vault.flush()
        if self.trail and self.pending:
            self.trail.append(self.pending)
        self.pending = []

    def discard(self) -> None:
        if self.vault:
            self.vault.discard()
        self.pending = []
