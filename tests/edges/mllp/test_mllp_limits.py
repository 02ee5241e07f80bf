"""The listener's limits, over real sockets: a per-message time limit with stuck workers replaced, a lane of its
own for large messages, an optional client allow-list, and a reused MSH-10 told apart from a resend."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from adapter.mllp import listener as mllp
from adapter.mllp.listener import frame, read_ack
from tests.edges.mllp.test_mllp_listener import (HOST, IdempotentReceiver, MllpSender, _alive, adt, fake_deidentify,
                                      pseudonymize_control_id, run, running_service, wait_for)
from adapter.cli.mllp import _default_message_timeout


def _hang_on_marker(text: str) -> str:
    """A stand-in for a detector that never returns on some input."""
    if "HANG" in text:
        time.sleep(600)
    return fake_deidentify(text)


def test_a_message_that_holds_its_worker_past_the_time_limit_is_refused_and_the_worker_replaced(tmp_path):
    """Item 8: the listener does not wait on a stuck worker: AR after the limit, nothing forwarded, and the one
    worker is killed and replaced, so the next message is de-identified at once."""
    out = tmp_path / "out"
    workers = mllp.WorkerProcesses(_hang_on_marker, 1)
    stuck = workers.pids[0]
    try:
        async def scenario():
            async with running_service(tmp_path / "q.sqlite", mllp.make_target(str(out)), deidentify=_hang_on_marker,
                                       executor=workers, message_timeout=1.0) as port:
                s = MllpSender(port, ack_timeout=20)
                hung = await s.exchange(frame(adt("H-1", "HANG^ME").encode()))
                after = await s.send(adt("OK-1"))
                await wait_for(lambda: len(list(out.glob("*.hl7"))) == 1)
                await s.close()
            return hung, after

        hung, after = run(scenario())
        assert read_ack(hung) == ("AR", "H-1") and b"did not finish within 1 s" in hung
        assert after == "AA"
        assert not _alive(stuck) and workers.pids[0] != stuck
        assert [p.read_bytes().count(b"|OK-1|") for p in out.glob("*.hl7")] == [1]
    finally:
        workers.shutdown()


def test_a_batch_with_one_stuck_message_refuses_only_that_one(tmp_path):
    """Messages that shared a worker call with a stuck one are tried again alone and get through."""
    workers = mllp.WorkerProcesses(_hang_on_marker, 1)
    try:
        async def scenario():
            engine = mllp.BatchedEngine(_hang_on_marker, workers, timeout=1.0)
            calls = [adt("B-1"), adt("B-2", "HANG^ME"), adt("B-3")]  # B-2 and B-3 go to the worker together
            return await asyncio.gather(*(engine(c) for c in calls), return_exceptions=True)

        first, stuck, third = run(scenario())
    finally:
        workers.shutdown()
    assert "|B-1|" in first and "|B-3|" in third
    assert isinstance(stuck, mllp.WorkerTimeout)


def test_the_time_limit_holds_without_worker_processes():
    """In a thread (`--workers 0`) the message is refused at the limit too; the thread itself cannot be stopped."""
    release = threading.Event()

    def slow(text: str) -> str:
        release.wait(10)
        return text

    async def scenario():
        engine = mllp.BatchedEngine(slow, None, timeout=0.2)
        try:
            with pytest.raises(mllp.WorkerTimeout):
                await engine(adt("T-1"))
        finally:
            release.set()

    run(scenario())


_big_started = threading.Event()


def _slow_on_big_note(text: str) -> str:
    if "BIGNOTE" in text:
        _big_started.set()
        time.sleep(2.0)
    return fake_deidentify(text)


def test_a_short_message_is_acked_while_two_big_ones_are_in_work(tmp_path):
    """Item 10: big messages take their own lane; a short ADT sent after two of them is ACKed before either."""
    big = "OBX|1|TX|NOTE||BIGNOTE " + "lorem ipsum " * 30_000 + "\r"  # ~360 KB, over the large-message size
    _big_started.clear()

    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port),
                                   deidentify=_slow_on_big_note) as port:
            senders = [MllpSender(port, ack_timeout=20) for _ in range(3)]
            finished: list[str] = []

            async def send(s, message):
                code = await s.send(message)
                finished.append(mllp.parse_header(message).control_id)
                return code

            bigs = [asyncio.create_task(send(senders[i], adt(f"BIG-{i}") + big)) for i in range(2)]
            await asyncio.get_running_loop().run_in_executor(None, _big_started.wait, 10)
            await asyncio.sleep(0.1)  # the second big one has arrived too
            small = await send(senders[2], adt("SMALL-1"))
            codes = [small, *await asyncio.gather(*bigs)]
            await wait_for(lambda: len(receiver.order) == 3, 20)
            for s in senders:
                await s.close()
        await receiver.stop()
        return codes, finished

    codes, finished = run(scenario())
    assert codes == ["AA"] * 3
    assert finished[0] == "SMALL-1", finished


@pytest.mark.parametrize("peer, ok", [("127.0.0.1", True), ("10.1.2.3", True), ("192.168.0.1", False),
                                      ("::ffff:10.9.9.9", True), ("::1", False), ("fd00::5", True), ("bogus", False)])
def test_allowed_addresses(peer, ok):
    networks = mllp.parse_allow(["127.0.0.1", "10.0.0.0/8", "fd00::/8"])
    assert mllp.allowed(peer, networks) is ok


def test_a_client_outside_the_allow_list_is_dropped_and_one_inside_is_served(tmp_path):
    out = tmp_path / "out"

    async def attempt(allow):
        async with running_service(tmp_path / "q.sqlite", mllp.make_target(str(out)),
                                   allow=mllp.parse_allow(allow)) as port:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(frame(adt("AL-1").encode()))
            try:
                answer = await asyncio.wait_for(reader.read(65536), 10)
            except ConnectionError:
                answer = b""
            writer.close()
        return answer

    assert run(attempt(["10.0.0.0/8"])) == b""  # closed without a word
    assert not out.exists() or not list(out.glob("*.hl7"))
    assert read_ack(run(attempt(["10.0.0.0/8", "127.0.0.0/8"]))[1:-2]) == ("AA", "AL-1")


def test_cli_rejects_a_bad_allow_entry(test_key_file):
    from tests.conftest import run_cli
    proc = run_cli("mllp", "--listen", "127.0.0.1:0", "--forward", "127.0.0.1:1", "--allow", "10.0.0.0/33",
                   key_file=test_key_file)
    assert proc.returncode == 2 and "--allow" in proc.stderr


def test_a_reused_control_id_with_other_content_is_naked_ae_and_logged_by_pseudonym(tmp_path, caplog):
    """Item 11: same sender and MSH-10 with different content is not a resend: AE (not forwarded), and a warning
    that names the control id's pseudonym only. A true resend (also one re-stamped in MSH-7) is still ACKed AA
    and not forwarded twice."""
    first = adt("RU-1")
    restamped = first.replace("|20240101120000||ADT", "|20240101120500||ADT", 1)
    other = adt("RU-1", name="ROE^JANE")

    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port),
                                   deidentify=pseudonymize_control_id) as port:
            s = MllpSender(port)
            answers = [await s.exchange(frame(m.encode())) for m in (first, restamped, other, first)]
            await s.send(adt("RU-2"))
            await wait_for(lambda: len(receiver.order) == 2)
            await asyncio.sleep(0.2)
            await s.close()
        await receiver.stop()
        return answers, receiver

    with caplog.at_level("DEBUG", logger="deid_adapter"):
        answers, receiver = run(scenario())
    assert [read_ack(a)[0] for a in answers] == ["AA", "AA", "AE", "AA"]
    assert b"already used for a different message" in answers[2]
    assert receiver.raw == ["P1-UR", "P2-UR"]
    warning = [r.getMessage() for r in caplog.records if "reuses the control id" in r.getMessage()]
    assert len(warning) == 1 and "P1-UR" in warning[0] and "RU-1" not in caplog.text and "ROE" not in caplog.text


def test_the_time_limit_grows_with_the_message_and_an_llm_stack_keeps_its_own():
    from types import SimpleNamespace

    assert _default_message_timeout(SimpleNamespace(name="no-llm", timeout_s=300.0)) == mllp.DEFAULT_MESSAGE_TIMEOUT
    assert _default_message_timeout(SimpleNamespace(name="precision-first", timeout_s=300.0)) == 300.0

    def slow(text: str) -> str:
        time.sleep(0.5)
        return text

    async def scenario():
        lane = mllp.WorkerLane(slow, None, timeout=0.3)  # 0.3 s per started 256 KiB
        with pytest.raises(mllp.WorkerTimeout):
            await lane("short")
        return await lane("x" * (mllp.LARGE_MESSAGE + 1))  # two parts: 0.6 s

    assert len(run(scenario())) == mllp.LARGE_MESSAGE + 1
