"""The issue's MLLP run: `deid-adapter mllp` as a real process with the real HL7v2 engine, 2,000 messages over
8 persistent connections, downstream stopped and restarted, the listener SIGKILLed and restarted mid-run.

Every message must be ACKed AA exactly once to its sender and reach the downstream receiver exactly once (the
receiver honours MSH-10 idempotency, as MLLP receivers must: a crash between its ACK and our delivery mark
makes us send that one message again), in per-connection order, none lost. The sender's ACKs echo its own
MSH-10; downstream sees (and ACKs) the keyed pseudonym of it, which is the same for every resend.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

from fhir_transforms.hl7v2.engine import HL7Deidentifier
from adapter.mllp.listener import Forwarder, parse_header
from fhir_transforms.keys import load_key
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import ROOT, TEST_SECRET, write_key
from tests.edges.mllp.test_mllp_listener import HOST, IdempotentReceiver, MllpSender, adt, wait_for
from text_deid.stack import build_stack

CONNECTIONS, PER_CONNECTION = 8, 250
NAMES = ["DOE^JOHN", "MÜLLER^JOSÉ", "NGUYEN^ANH", "SMITH^MARY"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_listener(port: int, forward: str, store, key, log) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    cmd = [sys.executable, "-m", "adapter.cli", "mllp", "--listen", f"{HOST}:{port}", "--forward", forward,
           "--store", str(store), "--key-file", str(key), "--stack", "patterns", "--retry-max-delay", "0.5",
           "--workers", "2"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


async def exited(proc: subprocess.Popen, timeout: float) -> int:
    end = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < end, "listener did not exit in time"
        await asyncio.sleep(0.05)
    return proc.returncode


def test_2000_messages_survive_downstream_restart_and_listener_sigkill(tmp_path):
    key = write_key(tmp_path / "test.key", TEST_SECRET)
    store, log_path = tmp_path / "queue.sqlite", tmp_path / "listener.log"
    port = free_port()
    events: dict[str, float] = {}

    async def scenario():
        receiver = await IdempotentReceiver().start()
        log = log_path.open("ab")
        proc = start_listener(port, f"{HOST}:{receiver.port}", store, key, log)
        senders = [MllpSender(port, ack_timeout=10.0, deadline=70.0) for _ in range(CONNECTIONS)]
        started = time.monotonic()

        async def send(c: int, sender: MllpSender):
            for n in range(PER_CONNECTION):
                assert await sender.send(adt(f"C{c}-{n:04d}", NAMES[n % len(NAMES)])) == "AA"
            await sender.close()

        def acked() -> int:
            return sum(len(s.acks) for s in senders)

        async def until_acked(n: int) -> None:
            await wait_for(lambda: acked() >= n or proc.poll() is not None, 40)
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]

        sending = asyncio.gather(*(send(c, s) for c, s in enumerate(senders)))
        try:
            await until_acked(500)
            proc.kill()  # SIGKILL: no flush, no goodbye
            await exited(proc, 10)
            events["killed_at_acked"] = acked()
            proc = start_listener(port, f"{HOST}:{receiver.port}", store, key, log)
            await until_acked(1200)
            events["downstream_stopped_at_acked"] = acked()
            await receiver.stop()
            await asyncio.sleep(1.0)
            await receiver.start()
            await asyncio.wait_for(sending, 60)
            events["all_acked_s"] = time.monotonic() - started
            await wait_for(lambda: len(receiver.order) == CONNECTIONS * PER_CONNECTION, 30)
            events["all_delivered_s"] = time.monotonic() - started
            proc.send_signal(signal.SIGTERM)
            events["exit_code"] = await exited(proc, 20)
        finally:
            if proc.poll() is None:
                proc.kill()
            sending.cancel()
            await receiver.stop()
            log.close()
        return senders, receiver

    senders, receiver = asyncio.run(asyncio.wait_for(scenario(), 85))
    print(events, "sender resends:", sum(s.resends for s in senders),
          "downstream resends:", len(receiver.raw) - len(receiver.order))

    expected = {f"C{c}-{n:04d}" for c in range(CONNECTIONS) for n in range(PER_CONNECTION)}
    acks = {cid: codes for s in senders for cid, codes in s.acks.items()}
    assert set(acks) == expected and all(codes == ["AA"] for codes in acks.values())
    # what the engine makes of each sender control id (it depends on the key, MSH-3/4 and MSH-10 only)
    engine = HL7Deidentifier.from_names("safe-harbor", Pseudonymizer(load_key(key)), build_stack("patterns"))
    original = {parse_header(engine.deidentify(adt(cid))).control_id: cid for cid in expected}
    assert len(original) == len(expected) and not set(original) & expected
    delivered = [original[x] for x in receiver.order]
    assert set(delivered) == expected and len(delivered) == len(expected)
    for c in range(CONNECTIONS):
        assert [x for x in delivered if x.startswith(f"C{c}-")] == [f"C{c}-{n:04d}" for n in range(PER_CONNECTION)]
    # Only messages downstream ACKed just before it or we went down (delivery mark not yet committed) may reach
    # it twice, and it drops them by MSH-10.
    assert len(receiver.raw) - len(receiver.order) <= 2 * Forwarder.MAX_UNMARKED
    assert events["exit_code"] == 0
    db = sqlite3.connect(store)
    assert db.execute("SELECT count(*) FROM queue").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM parked").fetchone()[0] == 0
    for body in list(receiver.messages.values())[:200]:
        text = body.decode("utf-8")
        assert "DOE" not in text and "MÜLLER" not in text and "NGUYEN" not in text
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    assert "stopped:" in log_text
    for phi in ("DOE", "JOHN", "MÜLLER", "NGUYEN", "MAIN ST", "19700101"):
        assert phi not in log_text
