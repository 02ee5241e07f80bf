"""The SQLite store-and-forward queue: order, de-duplication of resends, durability across reopen."""
from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor

from adapter.mllp.store import QUEUED, RESEND, REUSED, AsyncStore, GroupCommit, Incoming, Store


def item(n: int, sender: str = "LAB|NORTH", digest: str = "d") -> Incoming:
    return Incoming(sender, f"C{n}", f"C{n}", "utf-8", f"MSH|^~\\&|{n}\r".encode(), digest)


def test_order_dedupe_and_reopen(tmp_path):
    path = tmp_path / "q.sqlite"
    store = Store(path)
    assert store.enqueue_many([item(1), item(2), item(1), item(1, "OTHER|X")]) == [QUEUED, QUEUED, RESEND, QUEUED]
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.mark_delivered([store.pending()[0].id])
    store.close()
    store = Store(path)  # a restart keeps the queue and the de-dup memory
    assert [q.control_id for q in store.pending()] == ["C2", "C1"]
    assert store.enqueue_many([item(2)]) == [RESEND]
    assert store.enqueue_many([item(9)]) == [QUEUED]


def test_a_batch_with_a_resend_queues_only_the_new_messages_once(tmp_path):
    """The two-statement path of a batch without resends is rolled back for one with a resend: nothing twice."""
    store = Store(tmp_path / "q.sqlite")
    assert store.enqueue_many([item(1), item(2)]) == [QUEUED, QUEUED]
    assert store.enqueue_many([item(3), item(2), item(4), item(5, "OTHER|X")]) == [QUEUED, RESEND, QUEUED, QUEUED]
    assert store.enqueue_many([item(6), item(7)]) == [QUEUED, QUEUED]
    assert [q.control_id for q in store.pending()] == ["C1", "C2", "C3", "C4", "C5", "C6", "C7"]
    assert store.db.execute("SELECT count(*) FROM received").fetchone()[0] == 7


def test_empty_control_id_is_never_a_duplicate(tmp_path):
    store = Store(tmp_path / "q.sqlite")
    blank = Incoming("LAB|NORTH", "", "", "utf-8", b"MSH|")
    assert store.enqueue_many([blank, blank]) == [QUEUED, QUEUED]


def test_park_and_prune(tmp_path):
    store = Store(tmp_path / "q.sqlite")
    store.enqueue_many([item(1), item(2)])
    first = store.pending()[0]
    store.park(first, "AE")
    assert store.counts() == {"queued": 1, "parked": 1}
    assert store.prune_received(-1) == 2
    assert store.enqueue_many([item(1)]) == [QUEUED]


def test_ids_never_reused_after_delivery(tmp_path):
    store = Store(tmp_path / "q.sqlite")
    store.enqueue_many([item(1)])
    first = store.pending()[0].id
    store.mark_delivered([first])
    store.enqueue_many([item(2)])
    assert store.pending()[0].id > first


def test_concurrent_enqueues_share_commits(tmp_path):
    async def run():
        store = AsyncStore(tmp_path / "q.sqlite")
        results = await asyncio.gather(*(store.enqueue(item(n % 300)) for n in range(600)))
        counts = await store.counts()
        await store.close()
        return results, counts

    results, counts = asyncio.run(run())
    assert results.count(QUEUED) == 300 and counts["queued"] == 300
    db = sqlite3.connect(tmp_path / "q.sqlite")
    assert [r[0] for r in db.execute("SELECT control_id FROM queue ORDER BY id LIMIT 3")] == ["C0", "C1", "C2"]


def test_items_submitted_while_the_commit_lingers_join_its_batch(tmp_path):
    """A lingering group commit writes the items that arrive during its wait in the same batch."""
    from concurrent.futures import ThreadPoolExecutor

    batches: list[list[int]] = []

    def write(items):
        batches.append(list(items))
        return [f"ok {i}" for i in items]

    async def run():
        arrived = asyncio.Event()
        lingered = []

        async def linger():
            lingered.append(True)
            await asyncio.wait_for(arrived.wait(), 10)

        with ThreadPoolExecutor(1) as thread:
            commit = GroupCommit(write, thread, linger=linger)
            first = asyncio.ensure_future(commit.submit(1))
            await asyncio.sleep(0.05)  # the batch writer has started and is lingering
            assert not batches
            later = [asyncio.ensure_future(commit.submit(n)) for n in (2, 3)]
            await asyncio.sleep(0)
            arrived.set()
            results = await asyncio.gather(first, *later)
            await commit.drain()
        return results, lingered

    results, lingered = asyncio.run(run())
    assert batches == [[1, 2, 3]] and results == ["ok 1", "ok 2", "ok 3"]
    assert lingered == [True]


def test_a_reused_control_id_with_other_content_is_neither_a_resend_nor_queued(tmp_path):
    """Same sender and control id: the same digest is a resend, another digest a reuse; neither is queued twice."""
    path = tmp_path / "q.sqlite"
    store = Store(path)
    assert store.enqueue_many([item(1), item(1, digest="other"), item(1)]) == [QUEUED, REUSED, RESEND]
    store.close()
    store = Store(path)  # the digest outlives a restart
    assert store.enqueue_many([item(1, digest="other"), item(1), item(2)]) == [REUSED, RESEND, QUEUED]
    assert [q.control_id for q in store.pending()] == ["C1", "C2"]


def test_a_store_made_before_digests_gets_the_column_and_its_old_ids_stay_resends(tmp_path):
    path = tmp_path / "q.sqlite"
    old = sqlite3.connect(path)
    old.executescript("CREATE TABLE received (sender TEXT NOT NULL, control_id TEXT NOT NULL, "
                      "received_at REAL NOT NULL, PRIMARY KEY (sender, control_id)) WITHOUT ROWID;"
                      "INSERT INTO received VALUES ('LAB|NORTH', 'C1', 1e12);")
    old.close()
    store = Store(path)
    assert store.enqueue_many([item(1, digest="any"), item(2)]) == [RESEND, QUEUED]


def test_delivery_marks_given_with_a_fetch_are_committed_before_it_reads(tmp_path):
    """The forwarder hands its delivered ids to its next fetch (one call to the queue's thread): they are gone
    from that fetch and from the queue after a reopen."""
    path = tmp_path / "q.sqlite"
    store = Store(path)
    store.enqueue_many([item(1), item(2), item(3)])
    first, second, _ = store.pending()
    assert [q.control_id for q in store.pending(second.id, delivered=[first.id, second.id])] == ["C3"]
    store.close()
    assert [q.control_id for q in Store(path).pending()] == ["C3"]


def test_a_group_commit_whose_write_hands_on_answers_when_the_last_step_is_done(tmp_path):
    """A write may return a concurrent future (its last step runs on another thread): callers get its results,
    or its exception, only when that step is done."""
    async def scenario(fail: bool):
        first, second = ThreadPoolExecutor(1), ThreadPoolExecutor(1)

        def last_step(items):
            if fail:
                raise OSError("disk full")
            return [f"done {i}" for i in items]

        commits = GroupCommit(lambda items: second.submit(last_step, items), first)
        try:
            return await asyncio.gather(commits.submit(1), commits.submit(2), return_exceptions=True)
        finally:
            first.shutdown()
            second.shutdown()

    assert asyncio.run(scenario(False)) == ["done 1", "done 2"]
    assert all(isinstance(r, OSError) for r in asyncio.run(scenario(True)))
