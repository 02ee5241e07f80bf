"""The audit chain on SQLite and on a real PostgreSQL: it verifies; every kind of tampering, made with plain
SQL, is found at the record where it was made; concurrent writers (processes and threads) keep one chain."""
from __future__ import annotations

import hashlib
import hmac
import json
import multiprocessing
import threading

import pytest
from sqlalchemy import create_engine, text

from adapter.audit.trail import AuditEntry, AuditError, AuditTrail, _record_hash
from tests.support import audit_key, store_url  # noqa: F401 — fixture
from adapter.audit.trail import database_url

N = 20


def entry(n: int, writer: int = 0) -> AuditEntry:
    return AuditEntry("deidentify", f"writer-{writer}", "cli", "fhir", f"{n:064x}", f"{n + 1:064x}", "safe-harbor",
                      "2026.1", "patterns", {"deid-adapter": "0.1.0"}, "k-test", [["Patient.text.div", 0, 4, "NAME",
                                                                                      "known", 1.0]],
                      {"writer": writer, "n": n})


@pytest.fixture
def trail(store_url):  # noqa: F811
    t = AuditTrail(store_url, [audit_key()])
    t.append([entry(n) for n in range(1, 6)])  # a batch
    for n in range(6, N + 1):  # and single appends
        t.append([entry(n)])
    yield t
    t.close()


def sql(trail: AuditTrail, *statements: str, **params) -> None:
    with trail.engine.connect() as conn:
        for s in statements:
            conn.execute(text(s), params)
        conn.commit()


def row(trail: AuditTrail, seq: int) -> dict:
    with trail.engine.connect() as conn:
        return dict(conn.execute(text("SELECT * FROM deid_audit_record WHERE seq = :s"), {"s": seq}).one()._mapping)


def insert_row(trail: AuditTrail, values: dict) -> None:
    cols = ", ".join(values)
    sql(trail, f"INSERT INTO deid_audit_record ({cols}) VALUES ({', '.join(':' + c for c in values)})", **values)


def shift_from(trail: AuditTrail, seq: int) -> None:
    """Make room for a record at `seq` (two steps, so the primary key never collides)."""
    sql(trail, "UPDATE deid_audit_record SET seq = seq + 1000 WHERE seq >= :s",
        "UPDATE deid_audit_record SET seq = seq - 999 WHERE seq >= 1000", s=seq)


def test_chain_verifies(trail):
    report = trail.verify()
    assert report.ok, report.broken
    assert (report.records, report.head_seq) == (N, N)


def test_changed_field(trail):
    sql(trail, "UPDATE deid_audit_record SET actor = 'mallory' WHERE seq = 7")
    assert (trail.verify().broken.seq, trail.verify().broken.kind) == (7, "changed")


def test_changed_field_with_recomputed_hash_is_a_wrong_signature(trail):
    forged = row(trail, 7) | {"actor": "mallory"}
    sql(trail, "UPDATE deid_audit_record SET actor = 'mallory', record_hash = :h WHERE seq = 7", h=_record_hash(forged))
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (7, "wrong-signature")


def test_wrong_signature(trail):
    sql(trail, "UPDATE deid_audit_record SET signature = :s WHERE seq = 12", s="ab" * 32)
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (12, "wrong-signature")


def test_deleted_record(trail):
    sql(trail, "DELETE FROM deid_audit_record WHERE seq = 9")
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (9, "deleted")


def test_deleted_first_record(trail):
    sql(trail, "DELETE FROM deid_audit_record WHERE seq = 1")
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (1, "deleted")


def test_deleted_and_renumbered(trail):
    sql(trail, "DELETE FROM deid_audit_record WHERE seq = 9", "UPDATE deid_audit_record SET seq = seq - 1 WHERE seq > 9")
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (9, "deleted")


def test_inserted_forged_record(trail):
    forged = row(trail, 3) | {"actor": "mallory"}
    shift_from(trail, 5)
    insert_row(trail, forged | {"seq": 5})
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (5, "inserted")


def test_inserted_copy_of_a_signed_record(trail):
    copy = row(trail, 3)
    shift_from(trail, 5)
    insert_row(trail, copy | {"seq": 5})
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (5, "inserted")
    assert "copy of record 3" in broken.message


def test_inserted_after_the_head(trail):
    insert_row(trail, row(trail, 4) | {"seq": N + 1, "actor": "mallory"})
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (N + 1, "inserted")


def test_reordered(trail):
    sql(trail, "UPDATE deid_audit_record SET seq = -1 WHERE seq = 10",
        "UPDATE deid_audit_record SET seq = 10 WHERE seq = 11",
        "UPDATE deid_audit_record SET seq = 11 WHERE seq = -1")
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (10, "reordered")


def test_truncated_tail(trail):
    sql(trail, "DELETE FROM deid_audit_record WHERE seq > 16")
    broken = trail.verify().broken
    assert (broken.seq, broken.kind) == (17, "truncated")


def test_truncated_tail_with_rewound_head(trail):
    h = row(trail, 16)["record_hash"]
    sql(trail, "DELETE FROM deid_audit_record WHERE seq > 16",
        "UPDATE deid_audit_head SET seq = 16, record_hash = :h", h=h)
    broken = trail.verify().broken
    assert broken.kind == "head"


def test_deleted_head(trail):
    sql(trail, "DELETE FROM deid_audit_head")
    assert trail.verify().broken.kind == "head"
    with pytest.raises(AuditError, match="head checkpoint"):
        trail.append([entry(99)])


def test_forged_head_stops_appends(trail):
    sql(trail, "UPDATE deid_audit_head SET signature = :s", s="00" * 32)
    with pytest.raises(AuditError, match="signature"):
        trail.append([entry(99)])


def test_unknown_key_is_named(store_url):  # noqa: F811
    old = AuditTrail(store_url, [audit_key(1)])
    old.append([entry(1)])
    old.close()
    rotated = AuditTrail(store_url, [audit_key(2), audit_key(1)])  # the new key signs, the retired one still verifies
    rotated.append([entry(2)])
    assert rotated.verify().ok
    rotated.close()
    without_old = AuditTrail(store_url, [audit_key(2)])
    broken = without_old.verify().broken
    assert (broken.seq, broken.kind) == (1, "unknown-key")
    without_old.close()


AWKWARD = "Zoë \"quoted\" back\\slash\ttab\nnewline\u2028 \U0001f600 \x01"


def test_awkward_text_round_trips_and_verifies(store_url):  # noqa: F811
    """Quotes, backslashes, tabs, newlines, control and non-BMP characters in every text field: stored as given
    (also through PostgreSQL's COPY) and hashed exactly as verify recomputes them."""
    t = AuditTrail(store_url, [audit_key()])
    odd = AuditEntry("review", AWKWARD, "cli", "fhir", "a" * 64, "", "p" + AWKWARD, AWKWARD, "s", AWKWARD, "k",
                     [("Patient.text.div" + AWKWARD, 0, 4, "NAME", AWKWARD, 0.5)], {"reason": AWKWARD, "n": [1, 2.5]})
    t.append([odd, entry(1)])
    t.append([odd])
    assert t.verify().ok
    stored = row(t, 1)
    assert stored["actor"] == AWKWARD and json.loads(stored["detail"]) == {"reason": AWKWARD, "n": [1, 2.5]}
    assert stored["record_hash"] == _record_hash(stored)
    t.close()


def _record_as_first_written(secret: bytes, seq: int, prev: str, **fields) -> dict:
    """A record made the way the first release of the trail made it (json.dumps of the hashed fields, hmac.new),
    independently of adapter.audit.trail: the record format must not drift."""
    values = {"time": "2026-01-02T03:04:05.678901+00:00", "actor": "alice@host", "channel": "cli",
              "operation": "deidentify", "data_format": "fhir", "input_sha256": "1" * 64, "output_sha256": "2" * 64,
              "profile": "safe-harbor", "rules_version": "2026.1", "stack": "patterns",
              "versions": '{"deid-adapter":"0.1.0"}', "key_id": "k-test", "findings": '[["Patient.name",0,3,"NAME",'
              '"known",1.0]]', "detail": "{}", "audit_key_id": audit_key().key_id, "prev_hash": prev, **fields}
    body = json.dumps([values[name] for name in ("time", "actor", "channel", "operation", "data_format",
                                                 "input_sha256", "output_sha256", "profile", "rules_version", "stack",
                                                 "versions", "key_id", "findings", "detail", "audit_key_id",
                                                 "prev_hash")], ensure_ascii=False, separators=(",", ":"))
    record_hash = hashlib.sha256(body.encode()).hexdigest()
    signature = hmac.new(secret, b"deid-adapter audit record\x00" + record_hash.encode(), hashlib.sha256).hexdigest()
    return {"seq": seq, **values, "record_hash": record_hash, "signature": signature}


def test_records_written_by_the_first_release_verify_and_extend(store_url):  # noqa: F811
    t = AuditTrail(store_url, [audit_key()])
    secret = audit_key().secret
    first = _record_as_first_written(secret, 1, "0" * 64, actor="Zoë")
    second = _record_as_first_written(secret, 2, first["record_hash"], operation="refuse", detail='{"reason":"x"}')
    for r in (first, second):
        insert_row(t, r)
    head_mac = hmac.new(secret, f"deid-adapter audit head\x002:{second['record_hash']}".encode(), hashlib.sha256)
    sql(t, "UPDATE deid_audit_head SET seq = 2, record_hash = :h, signature = :s", h=second["record_hash"],
        s=head_mac.hexdigest())
    before = t.verify()  # the chain holds; written without an anchor, the store has none until its next append
    assert before.broken.kind == "anchor" and "anchor" in before.broken.message and before.records == 2
    t.append([entry(3)])  # today's writer chains onto them, and anchors the head
    report = t.verify()
    assert report.ok and report.records == 3
    assert row(t, 3)["prev_hash"] == second["record_hash"]
    t.close()


def _writer(url: str, writer: int, count: int, errors) -> None:
    """Appends `count` records, alternating one-record and nine-record transactions (each one fsync)."""
    try:
        t = AuditTrail(url, [audit_key()])
        n, size = 0, 1
        while n < count:
            t.append([entry(i, writer) for i in range(n, min(n + size, count))])
            n, size = n + size, 10 - size
        t.close()
    except Exception as e:  # noqa: BLE001 — reported to the parent
        errors.put(f"writer {writer}: {type(e).__name__}: {e}")


def _assert_one_chain(url: str, writers: int, per_writer: int) -> None:
    t = AuditTrail(url, [audit_key()])
    report = t.verify()
    assert report.ok, report.broken
    assert report.records == writers * per_writer
    assert report.anchor_seq == report.head_seq == report.records  # the anchor names the last commit, whoever made it
    seen = {(r["detail"]["writer"], r["detail"]["n"]) for r in t.export()}
    assert seen == {(w, n) for w in range(writers) for n in range(per_writer)}  # no record lost or doubled
    t.close()


WRITERS, PER_WRITER = 8, 500


def test_concurrent_processes_keep_one_chain(store_url):  # noqa: F811
    """The issue's figure: 8 writer processes × 500 records → one valid chain, nothing lost or doubled."""
    AuditTrail(store_url, [audit_key()]).close()  # tables exist before the race (the race on creating them is tested below)
    ctx = multiprocessing.get_context("fork")  # children reuse the imports; each opens its own engine
    errors = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(store_url, w, PER_WRITER, errors)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert errors.empty(), errors.get()
    assert all(p.exitcode == 0 for p in procs)
    _assert_one_chain(store_url, WRITERS, PER_WRITER)


def test_concurrent_threads_and_first_use_keep_one_chain(store_url):  # noqa: F811
    """Threads of one process, each opening the store for the first time at once (schema creation races too)."""
    errors: list[str] = []

    class ListQueue:
        def put(self, item):
            errors.append(item)

    threads = [threading.Thread(target=_writer, args=(store_url, w, 40, ListQueue())) for w in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    _assert_one_chain(store_url, 6, 40)


def test_postgres_url_spelling_is_accepted():
    assert database_url("postgresql://u@h/db").startswith("postgresql+psycopg://")
    assert create_engine(database_url("postgres://u@h/db")).dialect.name == "postgresql"
