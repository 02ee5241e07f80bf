"""The MLLP listener and forwarder in process, over real sockets on 127.0.0.1, with a stand-in de-identifier.

Also home of the test peers (MllpSender, IdempotentReceiver) that test_mllp_recovery uses.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from adapter.mllp import listener as mllp
from adapter.mllp.listener import FrameDecoder, _alive, build_ack, frame, parse_header, read_ack
from fhir_transforms.errors import InputError, RecordRefused
from adapter.mllp.store import Store
from adapter.audit.trail import AuditTrail
from adapter.cli.mllp import _audit_hook
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.keys import init_key_file
from fhir_transforms.pseudonym import Pseudonymizer
from text_deid.stack import build_stack

HOST = "127.0.0.1"


def adt(control_id: str, name: str = "DOE^JOHN", charset: str = "", version: str = "2.5.1", extra: str = "") -> str:
    return (f"MSH|^~\\&|ADMIT|NORTH|EHR|SOUTH|20240101120000||ADT^A01^ADT_A01|{control_id}|P|{version}||||||{charset}\r"
            f"EVN|A01|20240101120000\r"
            f"PID|1||{abs(hash(control_id)) % 10**8}^^^NORTH^MR||{name}||19700101|M|||1 MAIN ST^^BOSTON^MA^02101\r"
            f"PV1|1|I|W1^101^A{extra}\r")


def fake_deidentify(text: str) -> str:
    """Stand-in engine: fails like the real one on markers, otherwise masks the test names."""
    if "BADINPUT" in text:
        raise InputError("PID-5: component not parseable")
    if "REFUSEME" in text:
        raise RecordRefused("leak guard: NAME survived in OBX-5")
    return text.replace("DOE^JOHN", "XXXX^XXXX").replace("MÜLLER", "XXXXXX")


class IdempotentReceiver:
    """A downstream MLLP peer that honours MSH-10 idempotency: it ACKs every frame and keeps the first copy."""

    def __init__(self, codes: dict[str, list[str]] | None = None):
        self.raw: list[str] = []          # every control id received, resends included
        self.messages: dict[str, bytes] = {}
        self.order: list[str] = []        # first arrivals
        self.codes = codes or {}          # control id -> ACK codes to answer in turn (then AA)
        self.port = 0
        self._server = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> "IdempotentReceiver":
        self._server = await asyncio.start_server(self._serve, HOST, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        await self._server.wait_closed()

    async def _serve(self, reader, writer) -> None:
        self._writers.add(writer)
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for payload in decoder.feed(data):
                    header = parse_header(payload.decode("latin-1"))
                    cid = header.control_id
                    self.raw.append(cid)
                    pending = self.codes.get(cid) or []
                    code = pending.pop(0) if pending else "AA"
                    if code == "AA" and cid not in self.messages:
                        self.messages[cid] = payload
                        self.order.append(cid)
                    writer.write(frame(build_ack(header, code).encode("latin-1")))
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


class MllpSender:
    """A sending engine: one persistent connection, one message at a time, waits for the ACK; after a timeout
    or a lost connection it reconnects and resends the message that has no ACK yet."""

    def __init__(self, port: int, ack_timeout: float = 10.0, deadline: float = 60.0):
        self.port, self.ack_timeout = port, ack_timeout
        self.deadline = time.monotonic() + deadline
        self.acks: dict[str, list[str]] = {}   # sender's control id -> ACK codes received
        self.resends = 0
        self._conn = None
        self._decoder = FrameDecoder()
        self._answers: list = []

    async def _connect(self):
        while True:
            try:
                self._conn = await asyncio.open_connection(HOST, self.port)
                self._decoder = FrameDecoder()
                self._answers = []
                return
            except OSError:
                if time.monotonic() > self.deadline:
                    raise
                await asyncio.sleep(0.05)

    async def exchange(self, payload: bytes) -> bytes:
        """Send bytes (one frame, or nothing to collect a further answer) and return the next answer."""
        if self._conn is None:
            await self._connect()
        reader, writer = self._conn
        writer.write(payload)
        await writer.drain()
        while not self._answers:
            data = await asyncio.wait_for(reader.read(65536), self.ack_timeout)
            if not data:
                raise ConnectionError("closed")
            self._answers += self._decoder.feed(data)
        return self._answers.pop(0)

    async def send(self, message: str, encoding: str = "utf-8") -> str:
        """Deliver one message, resending as needed; returns the MSA-1 code."""
        cid = parse_header(message).control_id
        while True:
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"{cid}: no ACK before the deadline")
            try:
                answer = await self.exchange(frame(message.encode(encoding)))
            except (OSError, ConnectionError, asyncio.TimeoutError):
                self.resends += 1
                await self.close()
                continue
            code, acked = read_ack(answer)
            assert acked == cid, (acked, cid)
            self.acks.setdefault(cid, []).append(code)
            return code

    async def close(self) -> None:
        if self._conn:
            self._conn[1].transport.abort()
        self._conn = None


@contextlib.asynccontextmanager
async def running_service(store: Path, target, deidentify=fake_deidentify, **kw):
    stop = asyncio.Event()
    ready = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(mllp.serve(deidentify, (HOST, 0), target, store, stop=stop, backoff_cap=0.2,
                                          on_ready=ready.set_result, **kw))
    done, _ = await asyncio.wait({task, ready}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
    try:
        yield ready.result()[1]
    finally:
        stop.set()
        stats = await asyncio.wait_for(task, 30)
        print("service", stats.line())


async def wait_for(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.02)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_messages_are_acked_queued_and_forwarded_in_order(tmp_path):
    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port)) as port:
            senders = [MllpSender(port) for _ in range(3)]

            async def send(i, s):
                return [await s.send(adt(f"S{i}-{n:03d}")) for n in range(40)]

            codes = await asyncio.gather(*(send(i, s) for i, s in enumerate(senders)))
            await wait_for(lambda: len(receiver.order) == 120)
            for s in senders:
                await s.close()
        await receiver.stop()
        return codes, receiver

    codes, receiver = run(scenario())
    assert all(c == "AA" for cs in codes for c in cs)
    for i in range(3):
        assert [c for c in receiver.order if c.startswith(f"S{i}-")] == [f"S{i}-{n:03d}" for n in range(40)]
    assert len(receiver.raw) == 120
    body = receiver.messages["S0-000"].decode()
    assert "DOE" not in body and "XXXX^XXXX" in body and "|S0-000|" in body


def test_bad_frames_and_bad_messages_are_naked_and_the_connection_keeps_working(tmp_path):
    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port),
                                   max_frame=20_000) as port:
            s = MllpSender(port)
            answers = []
            for payload, n_answers in [
                (b"MSH|no start block DOE^JOHN\x1c\r", 1),                       # frame without VT
                (frame(adt("OK-1").encode()), 1),
                (frame(b"hello DOE^JOHN, not HL7"), 1),                           # no MSH
                (frame(adt("BAD-1", "BADINPUT^DOE").encode()), 1),               # engine: InputError
                (frame(adt("REF-1", "REFUSEME^DOE").encode()), 1),               # engine: RecordRefused
                (frame(adt("CS-1", charset="EBCDIC").encode()), 1),               # unknown MSH-18
                (frame(adt("BIG-1", extra="X" * 30_000).encode()), 1),            # over max_frame
                (b"\x0b" + adt("CUT-1").encode()[:40] + frame(adt("OK-2").encode()), 2),  # cut frame, then good
            ]:
                answers.append(await s.exchange(payload))
                for _ in range(n_answers - 1):
                    answers.append(await s.exchange(b""))
            await wait_for(lambda: len(receiver.order) == 2)
            await s.close()
        await receiver.stop()
        return answers, receiver

    answers, receiver = run(scenario())
    acks = [read_ack(a) for a in answers]
    assert acks == [("AR", ""), ("AA", "OK-1"), ("AR", ""), ("AE", "BAD-1"), ("AR", "REF-1"), ("AR", "CS-1"),
                    ("AR", "BIG-1"), ("AR", ""), ("AA", "OK-2")]
    assert b"larger than the limit of 20000 bytes" in answers[6]  # the NAK names the limit and the sender's id
    assert b"MSH-18" in answers[5] and b"EBCDIC" not in answers[5]  # ERR-8 names the field, not what it held
    for a in answers:
        assert b"DOE" not in a and b"JOHN" not in a
        if b"MSA|AA" not in a:
            assert b"\rERR|" in a
    assert receiver.order == ["OK-1", "OK-2"]


def test_resend_of_an_acked_message_is_acked_again_and_not_forwarded_twice(tmp_path):
    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port)) as port:
            s = MllpSender(port)
            first = await s.send(adt("DUP-1"))
            await s.close()
            again = await s.send(adt("DUP-1"))   # the sender lost our ACK and resends on a new connection
            await s.send(adt("DUP-2"))
            await wait_for(lambda: len(receiver.order) == 2)
            await asyncio.sleep(0.2)
            await s.close()
        await receiver.stop()
        return first, again, receiver

    first, again, receiver = run(scenario())
    assert (first, again) == ("AA", "AA")
    assert receiver.raw == ["DUP-1", "DUP-2"]


def pseudonymize_control_id(text: str) -> str:
    """Stand-in engine that, like the real one, gives MSH-10 a pseudonym (here a reversible one, for the test)."""
    text = fake_deidentify(text)
    fields = text.split("|")
    fields[9] = "P" + fields[9][::-1]
    return "|".join(fields)


def test_sender_control_ids_are_neither_stored_nor_logged(tmp_path, caplog):
    """Control ids embed dates and MRNs: the store de-duplicates by the output's id and logs number messages."""
    ids = ["MRN4471-20240101", "MRN4472-20240102", "REFUSEME-MRN4473"]

    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port),
                                   deidentify=pseudonymize_control_id) as port:
            s = MllpSender(port)
            codes = [await s.send(adt(ids[0])), await s.send(adt(ids[0])), await s.send(adt(ids[1])),
                     await s.send(adt(ids[2], "REFUSEME^DOE"))]
            await wait_for(lambda: len(receiver.order) == 2)
            await asyncio.sleep(0.2)
            await s.close()
        await receiver.stop()
        return codes, receiver

    with caplog.at_level("DEBUG", logger="deid_adapter"):
        codes, receiver = run(scenario())
    assert codes == ["AA", "AA", "AA", "AR"]  # the resend is ACKed again ...
    assert receiver.raw == ["P" + ids[0][::-1], "P" + ids[1][::-1]]  # ... and not forwarded twice
    stored = b"".join(f.read_bytes() for f in tmp_path.iterdir() if f.name.startswith("q.sqlite"))
    logged = caplog.text
    assert "refused" in logged
    for control_id in ids:
        assert control_id.encode() not in stored and control_id not in logged


async def send_encoded(tmp_path: Path, messages: list[tuple[str, str]], deidentify=fake_deidentify):
    """Send each (message, encoding) through a running service; (the ACK codes, the receiver once every message
    was delivered)."""
    receiver = await IdempotentReceiver().start()
    async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port), deidentify) as port:
        s = MllpSender(port)
        codes = [await s.send(m, enc) for m, enc in messages]
        await wait_for(lambda: len(receiver.order) == len(messages))
        await s.close()
    await receiver.stop()
    return codes, receiver

def test_non_ascii_and_large_messages_keep_their_charset(tmp_path):
    note = "OBX|1|TX|NOTE||" + "lorem ipsum " * 600_000 + "\r"  # about 7 MB
    messages = [(adt("U-1", "MÜLLER^JOSÉ", charset="UNICODE UTF-8"), "utf-8"),
                (adt("L-1", "MÜLLER^JOSÉ", charset="8859/1"), "latin-1"),
                (adt("N-1", "MÜLLER^JOSÉ"), "utf-8"),
                (adt("B-1") + note, "utf-8")]

    codes, receiver = run(send_encoded(tmp_path, messages))
    assert codes == ["AA"] * 4
    for message, enc in messages:
        cid = parse_header(message).control_id
        assert receiver.messages[cid] == fake_deidentify(message).encode(enc)


def test_downstream_ae_parks_and_ar_is_retried(tmp_path):
    async def scenario():
        receiver = await IdempotentReceiver({"P-1": ["AE"], "R-1": ["AR", "AR"]}).start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port)) as port:
            s = MllpSender(port)
            for cid in ("P-1", "R-1", "OK-1"):
                await s.send(adt(cid))
            await wait_for(lambda: len(receiver.order) == 2)
            await s.close()
        await receiver.stop()
        return receiver

    receiver = run(scenario())
    assert receiver.order == ["R-1", "OK-1"]
    assert receiver.raw == ["P-1", "R-1", "R-1", "R-1", "OK-1"]
    import sqlite3
    db = sqlite3.connect(tmp_path / "q.sqlite")
    assert db.execute("SELECT control_id, ack_code FROM parked").fetchall() == [("P-1", "AE")]


def test_folder_target_writes_each_message_once_atomically(tmp_path):
    out = tmp_path / "out"

    async def scenario():
        async with running_service(tmp_path / "q.sqlite", mllp.make_target(str(out))) as port:
            s = MllpSender(port)
            for n in range(10):
                await s.send(adt(f"F-{n}"))
            await wait_for(lambda: len(list(out.glob("*.hl7"))) == 10)
            await s.close()

    run(scenario())
    files = sorted(out.glob("*.hl7"))
    assert [parse_header(f.read_text()).control_id for f in files] == [f"F-{n}" for n in range(10)]
    assert not list(out.glob(".*.tmp"))


def test_downstream_down_at_start_then_up(tmp_path):
    async def scenario():
        receiver = IdempotentReceiver()
        await receiver.start()
        port_down = receiver.port
        await receiver.stop()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, port_down)) as port:
            s = MllpSender(port)
            for n in range(5):
                assert await s.send(adt(f"D-{n}")) == "AA"   # ACKed while downstream is down: queued
            await asyncio.sleep(0.5)
            receiver.port = port_down
            await receiver.start()
            await wait_for(lambda: len(receiver.order) == 5)
            await s.close()
        await receiver.stop()
        return receiver

    receiver = run(scenario())
    assert receiver.order == [f"D-{n}" for n in range(5)]


@pytest.mark.parametrize("text, ok", [("127.0.0.1:2575", True), ("[::1]:2575", True), ("out/dir", False),
                                      ("/var/spool/hl7", False)])
def test_forward_target_kind(tmp_path, text, ok):
    target = mllp.make_target(text if ok else str(tmp_path / text))
    assert isinstance(target, mllp.MllpTarget if ok else mllp.FolderTarget)


def test_stop_finishes_the_message_in_hand_and_keeps_it_queued(tmp_path):
    async def scenario():
        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        def slow_deidentify(text: str) -> str:
            loop.call_soon_threadsafe(started.set)
            time.sleep(0.5)
            return fake_deidentify(text)

        stop = asyncio.Event()
        ready = loop.create_future()
        target = mllp.MllpTarget(HOST, 9, ack_timeout=0.2, connect_timeout=0.2)  # discard port: never answers
        task = asyncio.create_task(mllp.serve(slow_deidentify, (HOST, 0), target, tmp_path / "q.sqlite",
                                              stop=stop, backoff_cap=0.2, on_ready=ready.set_result))
        port = (await ready)[1]
        s = MllpSender(port)
        sending = asyncio.create_task(s.send(adt("INFLIGHT-1")))
        await started.wait()
        stop.set()  # what SIGTERM does: arrives while the message is being de-identified
        code = await sending
        stats = await asyncio.wait_for(task, 10)
        with pytest.raises(OSError):
            await asyncio.open_connection(HOST, port)  # no longer accepting
        await s.close()
        return code, stats

    code, stats = run(scenario())
    assert code == "AA" and stats.accepted == 1
    assert [q.control_id for q in Store(tmp_path / "q.sqlite").pending()] == ["INFLIGHT-1"]


def test_cli_rejects_a_bad_listen_address(test_key_file):
    from tests.conftest import run_cli
    proc = run_cli("mllp", "--listen", "nowhere", "--forward", "127.0.0.1:1", key_file=test_key_file)
    assert proc.returncode == 2 and "--listen" in proc.stderr


def _die(text: str) -> str:
    os._exit(1)


def _die_on_marker(text: str) -> str:
    if "DIE" in text:
        os._exit(1)
    if "BADINPUT" in text:
        raise InputError("PID-5: component not parseable")
    return fake_deidentify(text)


def test_worker_processes_answer_batches_and_a_bad_message_fails_only_itself(tmp_path):
    """The listener's worker processes: several messages per call, each with its own result or error."""
    workers = mllp.WorkerProcesses(_die_on_marker, 2)
    try:
        async def scenario():
            batch = [adt("W-1"), adt("W-2", "BADINPUT^DOE"), adt("W-3")]
            results = await workers.run(batch)
            again = await asyncio.gather(*(workers.run([adt(f"G-{n}")]) for n in range(6)))
            return results, again

        results, again = run(scenario())
    finally:
        workers.shutdown()
    assert [ok for ok, _ in results] == [True, False, True] and isinstance(results[1][1], InputError)
    assert results[0][1] == fake_deidentify(adt("W-1")) and all(r[0][0] for r in again)
    assert not any(_alive(pid) for pid in workers.pids) and len(set(workers.pids)) == 2


async def _serve_until_the_workers_die(tmp_path, deidentify, executor, messages: list[str]) -> list[str]:
    """Send `messages` to a listener whose de-identification runs in `executor`; the service must stop."""
    stop = asyncio.Event()
    ready = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(mllp.serve(deidentify, (HOST, 0), mllp.FolderTarget(tmp_path / "out"),
                                          tmp_path / "q.sqlite", executor=executor, stop=stop,
                                          on_ready=ready.set_result))
    s = MllpSender((await ready)[1])
    codes = [await s.send(m) for m in messages]
    await s.close()
    with pytest.raises(RuntimeError, match="workers died"):
        await asyncio.wait_for(task, 10)
    return codes


def test_a_dead_worker_process_stops_the_service_and_the_message_is_not_acked_aa(tmp_path):
    workers = mllp.WorkerProcesses(_die_on_marker, 2)
    try:
        codes = run(_serve_until_the_workers_die(tmp_path, _die_on_marker, workers,
                                                 [adt("W-1"), adt("W-2", "DIE^NOW")]))
        assert codes == ["AA", "AR"]
    finally:
        workers.shutdown()


def test_dead_workers_stop_the_service_and_the_message_is_not_acked_aa(tmp_path):
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    try:
        assert run(_serve_until_the_workers_die(tmp_path, _die, pool, [adt("W-1")])) == ["AR"]
    finally:
        pool.shutdown()


def _refuse(text: str) -> str:
    if "REFUSE" in text:
        from fhir_transforms.errors import RecordRefused

        raise RecordRefused("PID-5: leak guard refused the output: NAME")
    return fake_deidentify(text)


def test_every_accepted_and_refused_message_is_audited_before_its_ack(tmp_path):
    init_key_file(tmp_path / "audit.key", "audit")
    trail = AuditTrail.open(tmp_path / "audit.sqlite", tmp_path / "audit.key")
    engine = type("Engine", (), {})()
    out = tmp_path / "out"

    async def scenario():
        async with running_service(tmp_path / "q.sqlite", mllp.make_target(str(out)), deidentify=_refuse,
                                   audit=_audit_hook(trail, engine)) as port:
            s = MllpSender(port)
            assert await s.send(adt("A-1")) == "AA"
            assert await s.send(adt("A-2", name="REFUSE^ME")) == "AR"
            await s.close()

    run(scenario())
    records = trail.export()
    records = records["records"] if isinstance(records, dict) else records
    ops = sorted((r["operation"], r["channel"]) for r in records)
    assert ops == [("deidentify", "mllp"), ("refuse", "mllp")]
    assert trail.verify().ok
    assert all(r["actor"].startswith("mllp:127.0.0.1:") for r in records)


def test_settle_waits_for_the_messages_in_de_identification(tmp_path):
    """BatchedEngine.settle returns once the messages in flight when it was called are done (bounded by its timeout)."""
    import threading

    release = threading.Event()

    def slow(text: str) -> str:
        release.wait(10)
        return fake_deidentify(text)

    async def scenario():
        engine = mllp.BatchedEngine(slow, None, slots=1)
        first = asyncio.ensure_future(engine(adt("S-1")))
        second = asyncio.ensure_future(engine(adt("S-2")))  # waits for the one slot
        await asyncio.sleep(0)
        await engine.settle(0.05)  # nothing done yet: returns at its timeout
        timed_out = not first.done() and not second.done()
        asyncio.get_running_loop().call_later(0.05, release.set)
        await engine.settle(10)
        return timed_out, first.done(), second.done(), await first

    timed_out, first_done, second_done, out = run(scenario())
    assert timed_out and first_done and "XXXX^XXXX" in out
    assert second_done  # it was waiting for a worker when settle began, so settle waited for it too


def test_the_listener_runs_on_uvloop_where_installed_and_on_asyncio_without(tmp_path, monkeypatch):
    """`deid-adapter mllp` takes uvloop's event loop when it is installed; without it, asyncio's (None)."""
    pytest.importorskip("uvloop")
    import uvloop

    factory = mllp.loop_factory()
    assert factory is uvloop.new_event_loop

    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port)) as port:
            s = MllpSender(port)
            codes = [await s.send(adt(f"U-{n}")) for n in range(20)]
            await wait_for(lambda: len(receiver.order) == 20)
            await s.close()
        await receiver.stop()
        return type(asyncio.get_running_loop()), codes, receiver.order

    with asyncio.Runner(loop_factory=factory) as runner:
        loop_type, codes, order = runner.run(asyncio.wait_for(scenario(), 60))
    assert loop_type is uvloop.Loop and codes == ["AA"] * 20 and order == [f"U-{n}" for n in range(20)]
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed: the import fails
    assert mllp.loop_factory() is None


def test_each_message_is_audited_before_it_is_queued_and_a_failed_audit_queues_nothing(tmp_path, monkeypatch):
    """The queue commit of a group starts only after its audit transaction returned; when the audit fails the
    sender gets AR and nothing of its group reaches the queue."""
    audited: list[str] = []
    order_broken: list[str] = []

    def audit(events):
        if any("FAILAUDIT" in e.message for e in events):
            raise RuntimeError("audit store unavailable")
        audited.extend(parse_header(e.message).control_id for e in events)
        return list(range(len(events)))

    enqueue_many = Store.enqueue_many

    def checked_enqueue_many(self, items):
        for it in items:  # the output's control id is the sender's here (the stand-in engine keeps MSH-10)
            if it.control_id not in audited:
                order_broken.append(it.control_id)
        return enqueue_many(self, items)

    monkeypatch.setattr(Store, "enqueue_many", checked_enqueue_many)
    out = tmp_path / "out"

    async def scenario():
        async with running_service(tmp_path / "q.sqlite", mllp.make_target(str(out)), audit=audit) as port:
            senders = [MllpSender(port) for _ in range(4)]

            async def send(i, s):
                return [await s.send(adt(f"Q{i}-{n}")) for n in range(15)]

            codes = await asyncio.gather(*(send(i, s) for i, s in enumerate(senders)))
            failed = await senders[0].send(adt("Q-X", name="FAILAUDIT^ME"))
            after = await senders[1].send(adt("Q-Y"))
            await wait_for(lambda: len(list(out.glob("*.hl7"))) == 61)
            for s in senders:
                await s.close()
        return codes, failed, after

    codes, failed, after = run(scenario())
    assert all(c == "AA" for cs in codes for c in cs) and failed == "AR" and after == "AA"
    assert not order_broken and len(audited) == 61
    bodies = [p.read_bytes() for p in out.glob("*.hl7")]
    assert not any(b"|Q-X|" in b for b in bodies) and sum(b"|Q-Y|" in b for b in bodies) == 1


def test_a_queue_failure_after_the_audit_is_answered_ar(tmp_path, monkeypatch):
    """The audit record is written, the queue commit fails: the sender hears AR (and resends), never AA."""
    enqueue_many = Store.enqueue_many

    def failing_enqueue_many(self, items):
        if any(b"FAILQUEUE" in it.body for it in items):
            raise sqlite3.OperationalError("disk I/O error")
        return enqueue_many(self, items)

    monkeypatch.setattr(Store, "enqueue_many", failing_enqueue_many)
    audited = []

    def audit(events):
        audited.extend(events)
        return list(range(len(events)))

    async def scenario():
        async with running_service(tmp_path / "q.sqlite", mllp.make_target(str(tmp_path / "out")),
                                   audit=audit) as port:
            s = MllpSender(port)
            codes = [await s.send(adt("F-1")), await s.send(adt("F-2", extra="|FAILQUEUE")), await s.send(adt("F-3"))]
            await s.close()
        return codes

    assert run(scenario()) == ["AA", "AR", "AA"]
    assert len(audited) == 3


def test_output_bytes_agree_with_the_output_msh18(tmp_path, test_key):
    """The forwarded bytes are in the character set the de-identified MSH-18 names, as the `hl7` command
    writes them: a Latin-1 message stays Latin-1, and UTF-8 bytes under an 8859/1 label (read as UTF-8)
    go out in 8859/1 too, not as UTF-8 that a receiver would read as Latin-1."""
    engine = HL7Deidentifier.from_names("safe-harbor", Pseudonymizer(test_key), build_stack("patterns"))
    note = "OBX|1|TX|NOTE||Übelkeit und Schwindel\r"
    messages = [(adt("L-1", "MÜLLER^JOSÉ", charset="8859/1") + note, "latin-1"),
                (adt("L-2", "MÜLLER^JOSÉ", charset="8859/1") + note, "utf-8")]

    codes, receiver = run(send_encoded(tmp_path, messages, engine.deidentify))
    assert codes == ["AA", "AA"]
    for cid in receiver.order:
        body = receiver.messages[cid]
        assert parse_header(body.decode("latin-1")).field(18) == "8859/1"
        text = body.decode("latin-1")
        assert "Übelkeit und Schwindel" in text and "MÜLLER" not in text


@pytest.mark.parametrize("msh18, sent, written, label, marker, code", [
    ("8859/1", "utf-8", "latin-1", "8859/1", "", "AA"),       # read as UTF-8, answered in 8859/1 as it declares
    ("8859/1", "latin-1", "latin-1", "8859/1", "BADINPUT", "AE"),
    ("ASCII", "utf-8", "utf-8", "UNICODE UTF-8", "", "AE"),   # Ü does not fit ASCII: the ACK says UTF-8 (and
    ("EBCDIC", "utf-8", "utf-8", "UNICODE UTF-8", "", "AR"),  # the output cannot be written as ASCII: AE)
])
def test_acks_and_naks_agree_with_their_own_msh18(tmp_path, msh18, sent, written, label, marker, code):
    """An ACK copies MSH-3..6 (swapped) and MSH-18 from the message it answers; its bytes are in the charset its own
    MSH-18 names, not in the codec the message was read with. An unknown MSH-18 (AR) is not copied: the NAK
    names the UTF-8 it is written in."""
    message = adt("Z-1", charset=msh18, extra=marker).replace("|NORTH|", "|ZÜRICH|", 1)

    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port)) as port:
            s = MllpSender(port)
            answer = await s.exchange(frame(message.encode(sent)))
            await s.close()
        await receiver.stop()
        return answer

    ack = run(scenario()).decode(written)
    header = parse_header(ack)
    assert read_ack(ack.encode(written))[0] == code
    assert header.field(6) == "ZÜRICH" and header.field(18) == label
