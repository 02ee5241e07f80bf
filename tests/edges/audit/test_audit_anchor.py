"""The chain head anchored outside the store: a store rolled back to an earlier consistent head (its SQLite WAL
truncated while the service ran, a PostgreSQL database restored) still verifies on its own; against its anchor
`audit verify` finds it behind, or disagreeing, and says so without PHI."""
from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import sqlite3
from contextlib import closing

import pytest
from typer.testing import CliRunner

from adapter.audit.trail import AuditError, AuditTrail
from adapter.cli.main import app
from fhir_transforms import keys
from tests.edges.audit.test_audit_chain import entry, sql
from tests.support import audit_key, store_url  # noqa: F401 — fixture

RECORDS = 60


@pytest.fixture
def audit_key_file(tmp_path):
    path = tmp_path / "audit.key"
    keys.init_key_file(path, "audit")
    return path


def ring(key_file):
    return [k for _, k, _ in keys.key_ring(key_file, "audit")]


def _head_signature(seq: int, record_hash: str) -> str:
    return hmac.new(audit_key().secret, f"deid-adapter audit head\x00{seq}:{record_hash}".encode(),
                    hashlib.sha256).hexdigest()


def live_store(folder, key_file):
    """A store as the service leaves it while it runs: a third of its records checkpointed into the database file,
    the rest committed into the WAL."""
    path = folder / "audit.sqlite"
    trail = AuditTrail(f"sqlite:///{path}", ring(key_file))
    for n in range(RECORDS):
        trail.append([entry(n)])
        if n == RECORDS // 3:
            with closing(sqlite3.connect(path, isolation_level=None)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return trail, path


def copy_with_wal(path, to, keep: float):
    """The store's files as a crash or an attacker leaves them: the WAL cut to `keep` of its length."""
    to.mkdir()
    shutil.copy(path, to / path.name)
    anchor = path.with_name(path.name + ".anchor")
    if anchor.exists():  # (before anchors there was none: the copy was the whole store)
        shutil.copy(anchor, to / anchor.name)
    wal = path.with_name(path.name + "-wal").read_bytes()
    (to / (path.name + "-wal")).write_bytes(wal[:int(len(wal) * keep)])
    return to / path.name


def verify_cli(store, key_file, *extra):
    return CliRunner().invoke(app, ["audit", "verify", "--audit", str(store), "--audit-key-file", str(key_file),
                                    "--json", *extra])


def test_a_truncated_wal_rolls_the_store_back_and_verify_fails(tmp_path, audit_key_file):
    trail, path = live_store(tmp_path, audit_key_file)
    assert path.with_name(path.name + "-wal").stat().st_size > 0
    for keep, name in ((0.5, "half"), (0.0, "all")):
        copy = copy_with_wal(path, tmp_path / name, keep)
        run = verify_cli(copy, audit_key_file)
        report = json.loads(run.output)
        assert run.exit_code == 1, run.output
        assert report["records"] < RECORDS and report["anchor_seq"] == RECORDS  # rolled back to an earlier head
        assert report["broken"]["kind"] == "rolled-back" and "rolled back" in report["broken"]["message"]
        assert f"records {report['records'] + 1} to {RECORDS} are gone" in report["broken"]["message"]
    trail.close()


def test_a_store_restored_from_an_older_state_is_behind_its_anchor(store_url):  # noqa: F811
    """A rollback as a restore makes it: the later records gone and the head checkpoint signed as it was."""
    t = AuditTrail(store_url, [audit_key()])
    for n in range(20):
        t.append([entry(n)])
    with t.engine.connect() as conn:
        tenth = conn.exec_driver_sql("SELECT record_hash FROM deid_audit_record WHERE seq = 10").scalar()
    sql(t, "DELETE FROM deid_audit_record WHERE seq > 10",
        "UPDATE deid_audit_head SET seq = 10, record_hash = :h, signature = :s", h=tenth, s=_head_signature(10, tenth))
    broken = t.verify().broken
    assert (broken.seq, broken.kind) == (11, "rolled-back"), broken
    with pytest.raises(AuditError, match="was rolled back"):  # a writer opening it now refuses to extend it
        AuditTrail(store_url, [audit_key()])
    for n in range(20, 40):  # written again past the anchored head: the record it names is another one
        t.append([entry(n)])
    report = t.verify()
    assert report.broken is not None and report.broken.kind == "rolled-back", report
    t.close()


def test_a_missing_or_edited_anchor_is_reported(tmp_path, audit_key_file):
    path = tmp_path / "audit.sqlite"
    t = AuditTrail(f"sqlite:///{path}", ring(audit_key_file))
    t.append([entry(1)])
    t.append([entry(2)])
    t.close()
    anchor = path.with_name(path.name + ".anchor")
    lines = anchor.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["1", "2"]
    seq, record_hash, key_id, mac = lines[-1].split()
    anchor.write_text(f"{lines[0]}\n{seq} {'0' * 64} {key_id} {mac}\n")  # an edited hash
    run = verify_cli(path, audit_key_file)
    assert run.exit_code == 1 and json.loads(run.output)["broken"]["kind"] == "anchor", run.output
    anchor.unlink()
    run = verify_cli(path, audit_key_file)
    assert run.exit_code == 1 and "anchor" in json.loads(run.output)["broken"]["message"], run.output
    assert verify_cli(path, audit_key_file, "--anchor", str(tmp_path / "elsewhere.log")).exit_code == 1


def test_an_anchor_elsewhere_is_written_and_read_there(tmp_path, audit_key_file, monkeypatch):
    elsewhere = tmp_path / "anchors" / "store.anchor"
    monkeypatch.setenv("DEID_ADAPTER_AUDIT_ANCHOR", str(elsewhere))
    path = tmp_path / "audit.sqlite"
    t = AuditTrail.open(path, audit_key_file)
    t.append([entry(1)])
    t.close()
    assert elsewhere.is_file() and not path.with_name(path.name + ".anchor").exists()
    run = verify_cli(path, audit_key_file)
    assert run.exit_code == 0 and json.loads(run.output)["anchor_seq"] == 1, run.output
