"""The MLLP store-and-forward queue: SQLite in WAL mode, one connection on one thread.

Durability: a message is ACKed to its sender only after the transaction that queued it has committed with
`synchronous=FULL`, which in WAL mode fsyncs the log on every commit, so an ACKed message survives a process
kill and a power cut. Delivery marks commit with `synchronous=NORMAL` (no fsync until the next FULL commit or
checkpoint): a power cut may lose a mark, which only makes the forwarder send that message again, and the
receiver drops the resend by its MSH-10. Losing a mark is safe; losing a queued message is not.
Enqueues are group-committed (GroupCommit): every message that arrives while one commit runs is queued by the next one.

De-duplication: a message whose sender and control id were seen within the window is a resend only if its content
digest matches too; the same control id on different content is a conflict (the listener NAKs it), never dropped.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Optional, Sequence

SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- never reused: folder targets name files by it
    control_id TEXT NOT NULL,               -- MSH-10 of the de-identified copy (downstream ACKs it in MSA-2)
    charset TEXT NOT NULL,                  -- Python codec of body
    body BLOB NOT NULL,                     -- the de-identified message, encoded, as it is sent downstream
    enqueued_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS received (       -- de-duplication of sender resends: (MSH-3^MSH-4, output MSH-10)
    sender TEXT NOT NULL,
    control_id TEXT NOT NULL,
    received_at REAL NOT NULL,
    digest TEXT NOT NULL DEFAULT '',        -- content digest (see Incoming); '' in stores made before it
    PRIMARY KEY (sender, control_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS received_at ON received (received_at);
CREATE TABLE IF NOT EXISTS parked (         -- downstream answered AE/CE: kept for an operator, not resent
    id INTEGER PRIMARY KEY,
    control_id TEXT NOT NULL,
    charset TEXT NOT NULL,
    body BLOB NOT NULL,
    enqueued_at REAL NOT NULL,
    parked_at REAL NOT NULL,
    ack_code TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class Incoming:
    """A de-identified message ready to queue. `sender`/`sender_control_id` identify the original for de-dup
    (`sender_control_id`: the output's control id, a keyed pseudonym of the sender's; empty: no de-dup).
    `digest` tells a resend (same digest) from a different message that reuses the control id."""

    sender: str
    sender_control_id: str
    control_id: str
    charset: str
    body: bytes
    digest: str = ""


# What enqueue_many answers for each item.
QUEUED, RESEND, REUSED = "queued", "resend", "reused"


@dataclass(frozen=True)
class Queued:
    """A queued message, in delivery order (`id` ascending)."""

    id: int
    control_id: str
    charset: str
    body: bytes


class Store:
    """The queue itself. Not thread-safe: use it from one thread (AsyncStore does)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self._synchronous = "FULL"
        self.db.executescript(SCHEMA)
        if "digest" not in {row[1] for row in self.db.execute("PRAGMA table_info(received)")}:
            self.db.execute("ALTER TABLE received ADD COLUMN digest TEXT NOT NULL DEFAULT ''")

    def _synchronous_mode(self, synchronous: str) -> None:
        if synchronous != self._synchronous:  # a statement less per commit while it stays the same
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self._synchronous = synchronous

    def _transaction(self, synchronous: str):
        self._synchronous_mode(synchronous)
        return _Transaction(self.db)

    def enqueue_many(self, items: list[Incoming]) -> list[str]:
        """Queue each item unless its (sender, control id) was seen within the window: QUEUED, RESEND (seen with
        the same digest, or before digests were kept) or REUSED (seen with another digest; not queued).

        A batch without resends (the usual case) takes two statements, not two per item: every statement releases
        and takes back the GIL, and each time the event loop's thread holds it, this thread waits for it."""
        now = time.time()
        keys = [(it.sender, it.sender_control_id, now, it.digest) for it in items if it.sender_control_id]
        if len({key[:2] for key in keys}) == len(keys):
            try:
                with self._transaction("FULL"):
                    if self.db.executemany("INSERT OR IGNORE INTO received VALUES (?, ?, ?, ?)",
                                           keys).rowcount != len(keys):
                        raise _Resend
                    self.db.executemany("INSERT INTO queue (control_id, charset, body, enqueued_at) VALUES (?, ?, ?, ?)",
                                        [(it.control_id, it.charset, it.body, now) for it in items])
                return [QUEUED] * len(items)
            except _Resend:
                pass  # rolled back: the batch holds a resend; find it item by item
        added = []
        with self._transaction("FULL"):
            for it in items:
                if it.sender_control_id:
                    cur = self.db.execute("INSERT OR IGNORE INTO received VALUES (?, ?, ?, ?)",
                                          (it.sender, it.sender_control_id, now, it.digest))
                    if cur.rowcount == 0:
                        seen = self.db.execute("SELECT digest FROM received WHERE sender = ? AND control_id = ?",
                                               (it.sender, it.sender_control_id)).fetchone()[0]
                        added.append(RESEND if seen in ("", it.digest) else REUSED)
                        continue
                self.db.execute("INSERT INTO queue (control_id, charset, body, enqueued_at) VALUES (?, ?, ?, ?)",
                                (it.control_id, it.charset, it.body, now))
                added.append(QUEUED)
        return added

    def pending(self, after_id: int = 0, limit: int = 256, delivered: Sequence[int] = ()) -> list[Queued]:
        """The oldest queued messages after `after_id`, in delivery order; `delivered` ids are marked first."""
        if delivered:
            self.mark_delivered(delivered)
        rows = self.db.execute("SELECT id, control_id, charset, body FROM queue WHERE id > ? ORDER BY id LIMIT ?",
                               (after_id, limit)).fetchall()
        return [Queued(*r) for r in rows]

    def mark_delivered(self, ids: list[int]) -> None:
        """Drop delivered messages (NORMAL sync: a lost mark means a resend, never a loss)."""
        with self._transaction("NORMAL"):
            self.db.executemany("DELETE FROM queue WHERE id = ?", [(i,) for i in ids])

    def park(self, item: Queued, ack_code: str) -> None:
        """Move a message downstream refused (AE/CE) to `parked`, so it stops blocking the queue."""
        with self._transaction("FULL"):
            self.db.execute("INSERT OR REPLACE INTO parked SELECT id, control_id, charset, body, enqueued_at, ?, ? "
                            "FROM queue WHERE id = ?", (time.time(), ack_code, item.id))
            self.db.execute("DELETE FROM queue WHERE id = ?", (item.id,))

    def prune_received(self, older_than_s: float) -> int:
        """Forget sender control ids older than the de-dup window; returns how many."""
        with self._transaction("NORMAL"):
            return self.db.execute("DELETE FROM received WHERE received_at < ?",
                                   (time.time() - older_than_s,)).rowcount

    def counts(self) -> dict[str, int]:
        """Queued and parked message counts (for logs)."""
        q = self.db.execute("SELECT count(*) FROM queue").fetchone()[0]
        p = self.db.execute("SELECT count(*) FROM parked").fetchone()[0]
        return {"queued": q, "parked": p}

    def close(self) -> None:
        """Checkpoint the WAL into the database file and close."""
        self._synchronous_mode("FULL")
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.db.close()


class _Resend(Exception):
    """A batch holds a message already received: its transaction is rolled back and redone item by item."""


class _Transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb):
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")


class GroupCommit:
    """Items from concurrent callers, written by one function on one thread in batches: every item that arrives
    while a batch is being written goes into the next one, so N waiting callers cost one commit, not N.

    `write(items)` returns one result per item, durable when it returns, or a concurrent future of them (it
    handed its last step to another thread); a caller gets its item's result only then, or the exception the
    write raised (and nothing of a failed batch is reported as written).

    `linger`, when given, is awaited before each batch is written, and items submitted meanwhile join it (as
    PostgreSQL's commit_delay waits for sibling transactions): a commit's fixed cost (an fsync, a lock, a
    thread hand-off) is larger than a short message's whole share of it, so it pays to wait for the messages
    about to arrive rather than commit each alone. It must return soon (it bounds its own wait).
    """

    def __init__(self, write: Callable[[list], list], executor: Executor, max_batch: int = 512,
                 linger: Optional[Callable[[], Awaitable[None]]] = None):
        self.write, self.executor, self.max_batch, self.linger = write, executor, max_batch, linger
        self._waiting: list[tuple[object, asyncio.Future]] = []
        self._writing: asyncio.Task | None = None
        self.batches = 0  # batches written (or failed), for the stats line
        self.items = 0

    async def submit(self, item):
        """The write's result for `item`, once the batch holding it is durable."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((item, fut))
        if self._writing is None or self._writing.done():
            self._writing = asyncio.create_task(self._write_waiting())
        return await fut

    async def _write_waiting(self) -> None:
        while self._waiting:
            if self.linger is not None and len(self._waiting) < self.max_batch:
                await self.linger()
            batch, self._waiting = self._waiting[:self.max_batch], self._waiting[self.max_batch:]
            self.batches += 1
            self.items += len(batch)
            try:
                done: concurrent.futures.Future = concurrent.futures.Future()
                self.executor.submit(_complete, done, self.write, [it for it, _ in batch])
                results = await asyncio.wrap_future(done)
            except Exception as e:  # noqa: BLE001 - every waiter must hear of it; none may be told it was written
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            for (_, fut), result in zip(batch, results):
                if not fut.done():
                    fut.set_result(result)

    async def drain(self) -> None:
        """Until every submitted item is written (or failed)."""
        while self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)


def _complete(done: concurrent.futures.Future, write: Callable[[list], object], items: list) -> None:
    """On the commit thread: `done` gets write's results, or its exception; a write that hands its last step to
    another thread returns that step's future, and `done` follows it (the loop is woken once, at the end)."""
    if not done.set_running_or_notify_cancel():  # its callers were cancelled before it started
        return
    try:
        result = write(items)
    except BaseException as e:  # noqa: BLE001 - handed to the waiting callers
        done.set_exception(e)
        return
    if not isinstance(result, concurrent.futures.Future):
        done.set_result(result)
        return

    def follow(step: concurrent.futures.Future) -> None:
        error = step.exception()
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(step.result())
    result.add_done_callback(follow)


class AsyncStore:
    """Store on its own thread, for the event loop. Concurrent enqueues share one commit (group commit)."""

    MAX_BATCH = 512

    def __init__(self, path: Path):
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mllp-store")
        self.store = self._thread.submit(Store, path).result()
        self.enqueues = GroupCommit(self.store.enqueue_many, self._thread, self.MAX_BATCH)
        self.new_message = asyncio.Event()

    @property
    def executor(self) -> Executor:
        """The one thread that uses `store` (a caller may hand it a commit of `store.enqueue_many` directly)."""
        return self._thread

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def enqueue(self, item: Incoming) -> str:
        """Queue one message durably; returns once committed: QUEUED, RESEND or REUSED (see Store.enqueue_many)."""
        outcome = await self.enqueues.submit(item)
        if outcome == QUEUED:
            self.new_message.set()
        return outcome

    async def pending(self, after_id: int = 0, limit: int = 256, delivered: Sequence[int] = ()) -> list[Queued]:
        return await self._call(self.store.pending, after_id, limit, delivered)

    async def mark_delivered(self, ids: list[int]) -> None:
        await self._call(self.store.mark_delivered, ids)

    async def park(self, item: Queued, ack_code: str) -> None:
        await self._call(self.store.park, item, ack_code)

    async def prune_received(self, older_than_s: float) -> int:
        return await self._call(self.store.prune_received, older_than_s)

    async def counts(self) -> dict[str, int]:
        return await self._call(self.store.counts)

    async def close(self) -> None:
        """Wait for pending commits, checkpoint, close, stop the thread."""
        await self.enqueues.drain()
        await self._call(self.store.close)
        self._thread.shutdown(wait=True)
