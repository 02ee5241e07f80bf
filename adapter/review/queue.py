"""Human review of low-confidence spans: routing by per-category thresholds, and the queue of held records.

A review-enabled run holds a record when any span is below its category's threshold; what the reviewer must see
(the original resource, each text with its spans, the de-identified candidate) is sealed with AES-256-GCM under
the review key, bound to the row's id and site, so the database alone never shows it. Metadata in the clear is
free of PHI: id, site, status, priority, resource type, span counts by category, and after release the
decisions (offsets and categories only), the reviewer and the output hash.
"""
from __future__ import annotations

import base64
import json
import os
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator, Optional, Sequence

import yaml
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from adapter.audit import trail as audit
from fhir_transforms import keys
from fhir_transforms.config import files, yaml_data
from text_deid.spans import CATEGORIES, KnownIdentifier, Span
from adapter import settings

QUEUE_ENV = "DEID_ADAPTER_REVIEW_QUEUE"
REVIEW_KEY_ENV = "DEID_ADAPTER_REVIEW_KEY_FILE"
HELD, RELEASED, DISCARDED = "held", "released", "discarded"

metadata = MetaData()
items = Table(
    "deid_review_item", metadata,
    Column("id", String(32), primary_key=True),
    Column("site", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("priority", Float, nullable=False),
    Column("resource_type", String(64), nullable=False),
    Column("suspects", Integer, nullable=False),
    Column("categories", Text, nullable=False),  # {"NAME": 3, …}: counts, never values
    Column("created", String(40), nullable=False),
    Column("review_key_id", String(40), nullable=False),
    Column("nonce", String(24), nullable=False),
    Column("ciphertext", Text, nullable=False),
    Column("reviewer", Text, nullable=False, default=""),
    Column("decided", String(40), nullable=False, default=""),
    Column("decisions", Text, nullable=False, default="[]"),  # offsets, categories, actions: no text
    Column("output_sha256", String(64), nullable=False, default=""),
    Index("deid_review_item_queue", "site", "status", "priority"),
)


class QueueError(RuntimeError):
    """The queue cannot be read or written, or a held record does not decrypt with this review key."""


@dataclass(frozen=True)
class Thresholds:
    """Per-category confidence thresholds: a span below its category's threshold sends the record to review."""

    by_category: dict[str, float] = field(default_factory=dict)
    default: float = 0.0  # categories not named are never held

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Thresholds":
        """Read `{thresholds: {NAME: 0.85, DATE: 0.6}, default: 0.0}` from a YAML or JSON file."""
        try:
            doc = yaml_data.load(files.read_config_text(path)) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise ValueError(f"review config {path}: {getattr(e, 'strerror', None) or type(e).__name__}") from None
        return cls.from_json(doc, str(path))

    @classmethod
    def from_json(cls, doc: dict, where: str = "review config") -> "Thresholds":
        table = doc.get("thresholds", {}) if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise ValueError(f"{where}: `thresholds` must map categories to numbers")
        unknown = sorted(set(table) - set(CATEGORIES))
        if unknown:
            raise ValueError(f"{where}: unknown categories {unknown} (known: {', '.join(CATEGORIES)})")
        values = {c: float(v) for c, v in table.items()}
        default = float(doc.get("default", 0.0))
        if any(not 0.0 <= v <= 1.0 for v in [*values.values(), default]):
            raise ValueError(f"{where}: thresholds must lie in [0, 1]")
        return cls(values, default)

    def threshold(self, category: str) -> float:
        return self.by_category.get(category, self.default)

    def is_suspect(self, span: Span) -> bool:
        return span.confidence < self.threshold(span.category)

    def priority(self, spans: Sequence[Span]) -> float:
        """How far the record's spans fall below their thresholds, summed: the least certain records come first."""
        return round(sum(max(0.0, self.threshold(s.category) - s.confidence) for s in spans), 6)


@dataclass
class TextUnderReview:
    """One text of a held record: where it sits, the original text, and the spans the stack found."""

    path: str
    text: str
    spans: list[Span]

    def to_json(self) -> dict:
        return {"path": self.path, "text": self.text, "spans": [s.to_json() for s in self.spans]}

    @classmethod
    def from_json(cls, doc: dict) -> "TextUnderReview":
        return cls(doc["path"], doc["text"], [Span(s["start"], s["end"], s["category"], s["detector"], s["confidence"])
                                              for s in doc["spans"]])


@dataclass
class HeldRecord:
    """What a reviewer sees of one record, decrypted: the input resource, its texts with spans, and the candidate."""

    id: str
    site: str
    status: str
    priority: float
    resource_type: str
    created: str
    resource: dict
    texts: list[TextUnderReview]
    candidate: dict
    known: list[KnownIdentifier]


@dataclass(frozen=True)
class QueueRow:
    """A queue row without its sealed content: what the list page and the export read."""

    id: str
    site: str
    status: str
    priority: float
    resource_type: str
    suspects: int
    categories: dict
    created: str
    reviewer: str
    decided: str
    decisions: list
    output_sha256: str


def queue_url(target: str | os.PathLike | None = None) -> str:
    """A SQLAlchemy URL from a URL, a SQLite path, or None (DEID_ADAPTER_REVIEW_QUEUE, else review.sqlite)."""
    return audit.database_url(target or settings.review_queue() or audit.state_dir() / "review.sqlite")


def _aad(item_id: str, site: str) -> bytes:
    # Binds a sealed record to its row: copying it to another id or site makes decryption fail.
    return f"deid-adapter review\x00{item_id}\x00{site}".encode()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ReviewQueue:
    """The review queue at one URL, sealing and opening held records with one review key."""

    def __init__(self, url: str, review_key: Optional[keys.Key]):
        self.url = url
        self.review_key = review_key
        self.engine = audit.make_engine(url)
        try:
            with self.engine.begin() as conn:
                audit.create_tables(conn, metadata)
        except SQLAlchemyError as e:
            raise QueueError(f"review queue {self.display_url}: {type(e).__name__}") from None

    @property
    def display_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def _aead(self) -> AESGCM:
        if self.review_key is None:
            raise QueueError("no review key (create one with `deid-adapter keys init --purpose review PATH`)")
        return AESGCM(self.review_key.secret)

    def hold(self, site: str, resource: dict, texts: Sequence[TextUnderReview], candidate: dict,
             known: Sequence[KnownIdentifier], thresholds: Thresholds) -> str:
        """Seal and store one held record; returns its id."""
        item_id = uuid.uuid4().hex
        spans = [s for t in texts for s in t.spans]
        suspects = [s for s in spans if thresholds.is_suspect(s)]
        counts: dict[str, int] = {}
        for s in spans:
            counts[s.category] = counts.get(s.category, 0) + 1
        body = {"resource": resource, "texts": [t.to_json() for t in texts], "candidate": candidate,
                "known": [[k.value, k.category] for k in known]}
        nonce = secrets.token_bytes(12)
        sealed = self._aead().encrypt(nonce, audit.canonical_json(body).encode(), _aad(item_id, site))
        row = {"id": item_id, "site": site, "status": HELD, "priority": thresholds.priority(spans),
               "resource_type": str(resource.get("resourceType", "")), "suspects": len(suspects),
               "categories": audit.canonical_json(counts), "created": _now(), "review_key_id": self.review_key.key_id,
               "nonce": base64.b64encode(nonce).decode(), "ciphertext": base64.b64encode(sealed).decode(),
               "reviewer": "", "decided": "", "decisions": "[]", "output_sha256": ""}
        self._write(lambda conn: conn.execute(insert(items).values(**row)))
        return item_id

    def rows(self, site: Optional[str] = None, status: Optional[str] = HELD) -> list[QueueRow]:
        """Rows of one site (or all) and status (or any), the highest priority first."""
        query = select(items).order_by(items.c.priority.desc(), items.c.created, items.c.id)
        if site is not None:
            query = query.where(items.c.site == site)
        if status is not None:
            query = query.where(items.c.status == status)
        return [_row(r._mapping) for r in self._read(query)]

    def row(self, item_id: str, site: Optional[str] = None) -> Optional[QueueRow]:
        query = select(items).where(items.c.id == item_id)
        if site is not None:
            query = query.where(items.c.site == site)
        found = self._read(query)
        return _row(found[0]._mapping) if found else None

    def open(self, item_id: str, site: str) -> Optional[HeldRecord]:
        """The decrypted record if it exists at `site`; QueueError if it does not decrypt with this review key."""
        found = self._read(select(items).where(items.c.id == item_id, items.c.site == site))
        if not found:
            return None
        r = found[0]._mapping
        body = json.loads(self.unseal(r["id"], r["site"], r["review_key_id"], r["nonce"], r["ciphertext"]))
        return HeldRecord(r["id"], r["site"], r["status"], r["priority"], r["resource_type"], r["created"],
                          body["resource"], [TextUnderReview.from_json(t) for t in body["texts"]], body["candidate"],
                          [KnownIdentifier(v, c) for v, c in body["known"]])

    def sealed(self, item_id: str) -> tuple[str, str, str]:
        """(review key id, nonce, ciphertext) of a row, as stored."""
        r = self._read(select(items.c.review_key_id, items.c.nonce, items.c.ciphertext).where(items.c.id == item_id))
        if not r:
            raise QueueError(f"no review item {item_id}")
        return r[0].review_key_id, r[0].nonce, r[0].ciphertext

    def unseal(self, item_id: str, site: str, key_id: str, nonce: str, ciphertext: str) -> bytes:
        if self.review_key is None or key_id != self.review_key.key_id:
            raise QueueError(f"review item {item_id} is sealed with review key {key_id}, not the one given")
        try:
            return self._aead().decrypt(base64.b64decode(nonce), base64.b64decode(ciphertext), _aad(item_id, site))
        except (InvalidTag, ValueError):
            raise QueueError(f"review item {item_id} does not decrypt with this review key") from None

    def close_item(self, item_id: str, site: str, status: str, reviewer: str, decisions: list,
                   output_sha256: str = "") -> bool:
        """Mark a held item released or discarded; False when it was no longer held (someone else decided first)."""
        def work(conn):
            return conn.execute(update(items).where(items.c.id == item_id, items.c.site == site,
                                                    items.c.status == HELD).values(
                status=status, reviewer=reviewer, decided=_now(), decisions=audit.canonical_json(decisions),
                output_sha256=output_sha256)).rowcount
        return self._write(work) == 1

    def _write(self, work):
        try:
            with self.engine.begin() as conn:
                return work(conn)
        except SQLAlchemyError as e:
            raise QueueError(f"review queue {self.display_url}: {type(e).__name__}") from None

    def _read(self, query) -> list:
        try:
            with self.engine.connect().execution_options(audit_read=True) as conn, conn.begin():
                return list(conn.execute(query))
        except SQLAlchemyError as e:
            raise QueueError(f"review queue {self.display_url}: {type(e).__name__}") from None

    def close(self) -> None:
        self.engine.dispose()


def _row(m) -> QueueRow:
    return QueueRow(m["id"], m["site"], m["status"], m["priority"], m["resource_type"], m["suspects"],
                    json.loads(m["categories"]), m["created"], m["reviewer"] or "", m["decided"] or "",
                    json.loads(m["decisions"] or "[]"), m["output_sha256"] or "")


def iter_sealed(queue: ReviewQueue, site: Optional[str]) -> Iterator[tuple[QueueRow, str, str, str]]:
    """Released rows with their sealed content (key id, nonce, ciphertext), for the training export."""
    for row in queue.rows(site, RELEASED):
        yield (row, *queue.sealed(row.id))
