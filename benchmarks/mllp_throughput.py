"""MLLP throughput on loopback: end to end next to the raw MLLP echo rate of the same socket code.

End to end: `deid-adapter mllp` as a process (HL7v2 engine, patterns stack, worker processes, audit trail and
SQLite queue with FULL sync, forwarder) between senders and a downstream MLLP receiver that live in this process.
Echo: the same listener socket loop and framing, answering each frame with an ACK at once (no engine, no queue).
Two mixes, each message sent with a fresh MSH-10: `adt`, a short ADT^A01 (about 300 bytes, a typical real-time
ADT feed), and `samples`, the shared HL7v2 samples the engine accepts (0.2-35 KB, long ORUs and ADTs with many
IN1/NK1). The engine alone (one process, in-process calls) is timed too, to show where the time goes.

Run: .venv/bin/python benchmarks/mllp_throughput.py [--adt 3000] [--samples 300] [--connections 8] [--workers N]
     [--no-audit]
Prints messages/s for each and the ratio end to end / echo (target: at least 1,000 messages/s end to end), and
the CPU time the listener and its workers spend per message, which does not depend on what else the machine runs.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's packages, as the listener's `-m` run uses

from adapter.mllp.listener import (FrameDecoder, MllpListener, MllpTarget, build_ack, frame, loop_factory,
                                   parse_header, read_ack, serve)
from fhir_transforms.hl7v2.message import decode_bytes, parse_text
from adapter.cli.mllp import _hl7_engine
from fhir_transforms.errors import InputError, RecordRefused

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "data" / "hl7v2"
HOST = "127.0.0.1"


class CpuUse(NamedTuple):
    """CPU seconds over one run: the listener process's event loop thread and its other threads (queue and audit
    commits), its worker processes, and this process (senders and downstream)."""

    loop: float
    threads: float
    workers: float
    bench: float

    @property
    def listener(self) -> float:
        return self.loop + self.threads

    @property
    def service(self) -> float:
        return self.listener + self.workers

    def __sub__(self, other: "CpuUse") -> "CpuUse":
        return CpuUse(*(a - b for a, b in zip(self, other)))


def run(coroutine):
    """Run on the event loop the listener uses (uvloop where installed), so echo, edge and end to end compare alike."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coroutine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def load_messages(key_file: Path) -> list[str]:
    """The shared sample messages the engine de-identifies without refusal (MSH-10 replaced per send)."""
    engine = _hl7_engine(key_file, "safe-harbor", "patterns")
    out = []
    for path in sorted(SAMPLES.glob("*.hl7")):
        for item in parse_text(decode_bytes(path.read_bytes())):
            if item.envelope:
                continue
            text = item.to_er7()
            try:
                engine(text)
            except (InputError, RecordRefused):
                continue
            out.append(text)
    return out


def adt_message(n: int) -> str:
    return (f"MSH|^~\\&|ADMIT|NORTH|EHR|SOUTH|20240101120000||ADT^A01^ADT_A01|A{n}|P|2.5.1\r"
            f"EVN|A01|20240101120000\r"
            f"PID|1||{100000 + n}^^^NORTH^MR||DOE^JOHN^Q||19700101|M|||1 MAIN ST^^BOSTON^MA^02101||555-555-0100\r"
            f"PV1|1|I|W1^101^A|||||||MED\r")


def with_control_id(message: str, control_id: str) -> str:
    seg, rest = message.split("\r", 1)
    sep = seg[3]
    fields = seg.split(sep)
    fields += [""] * (10 - len(fields))
    fields[9] = control_id
    return sep.join(fields) + "\r" + rest


async def send_all(port: int, payloads: list[bytes], connections: int) -> float:
    """Send every payload (split over connections, one in flight per connection); seconds until all ACKed."""
    async def one(chunk: list[bytes]) -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        decoder = FrameDecoder()
        for p in chunk:
            writer.write(frame(p))
            await writer.drain()
            answers: list = []
            while not answers:
                data = await asyncio.wait_for(reader.read(65536), 30)
                if not data:
                    raise ConnectionError("listener closed the connection")
                answers = decoder.feed(data)
            code, _ = read_ack(answers[0])
            if code != "AA":
                raise RuntimeError(f"answer {code}")
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one(payloads[i::connections]) for i in range(connections)))
    return time.perf_counter() - start


class EchoListener(MllpListener):
    """The listener's socket loop and framing; every frame is answered AA at once."""

    async def _answer(self, cid: int, event) -> bytes:
        return build_ack(parse_header(event.decode("latin-1")), "AA").encode("latin-1")


def run_echo(port: int) -> None:
    async def main():
        listener = EchoListener(None, None)
        await listener.start(HOST, port)
        await asyncio.Event().wait()

    run(main())


async def wait_listening(port: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            _, w = await asyncio.open_connection(HOST, port)
            w.close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.1)


def run_edge_only(port: int, downstream_port: int, store: Path) -> None:
    """The whole edge (listener, queue, forwarder) with an identity de-identifier, in this forked process."""
    run(serve(str, (HOST, port), MllpTarget(HOST, downstream_port), store))


async def end_to_end(payloads: list[bytes], connections: int, workers: int, key_file: Path, tmp: Path,
                     edge_only: bool = False, audit: tuple[str, ...] = ("--audit", "off")):
    """(seconds until all ACKed, seconds until all delivered, CPU seconds of the listener and its workers)."""
    received: set[str] = set()
    done = asyncio.Event()

    async def downstream(reader, writer):
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for p in decoder.feed(data):
                    header = parse_header(p.decode("latin-1"))
                    received.add(header.control_id)
                    writer.write(frame(build_ack(header, "AA").encode("latin-1")))
                    if len(received) == len(payloads):
                        done.set()
                await writer.drain()
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(downstream, HOST, 0)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    if edge_only:
        proc = multiprocessing.get_context("fork").Process(
            target=run_edge_only, args=(port, server.sockets[0].getsockname()[1], tmp / "edge.sqlite"), daemon=True)
        proc.start()
    else:
        proc = subprocess.Popen([sys.executable, "-m", "adapter.cli", "mllp", "--listen", f"{HOST}:{port}",
                                 "--forward", f"{HOST}:{server.sockets[0].getsockname()[1]}",
                                 "--store", str(tmp / "queue.sqlite"), "--key-file", str(key_file),
                                 "--stack", "patterns", "--workers", str(workers), *audit],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "listener.log", "wb"))
    try:
        await wait_listening(port)
        before = cpu_use(proc.pid)
        start = time.perf_counter()
        acked = await send_all(port, payloads, connections)
        await asyncio.wait_for(done.wait(), 120)
        delivered = time.perf_counter() - start
        cpu = cpu_use(proc.pid) - before
    finally:
        if edge_only:
            os.kill(proc.pid, signal.SIGTERM)
            proc.join(30)
        else:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        server.close()
    return acked, delivered, cpu, (0, 0) if edge_only else commits(tmp / "listener.log")


def _ticks(stat_path: str) -> float:
    stat = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) of a process and its children so far, from /proc (0 elsewhere)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return _ticks(f"/proc/{pid}/stat") + sum(cpu_seconds(int(c)) for c in children)
    except OSError:
        return 0.0


def cpu_use(pid: int) -> CpuUse:
    """CPU seconds so far of the listener `pid` (its main thread runs the event loop), its children, and this process."""
    try:
        process = _ticks(f"/proc/{pid}/stat")
        loop = _ticks(f"/proc/{pid}/task/{pid}/stat")
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return CpuUse(0.0, 0.0, 0.0, time.process_time())
    return CpuUse(loop, process - loop, sum(cpu_seconds(int(c)) for c in children), time.process_time())


def commits(log: Path) -> tuple[int, int]:
    """(queue commits, audit commits) from the listener's last log line; (0, 0) when it does not say."""
    try:
        last = log.read_text().strip().splitlines()[-1]
    except (OSError, IndexError):
        return 0, 0
    queue = re.search(r"(\d+) queue commits", last)
    audit = re.search(r"(\d+) audit commits", last)
    return int(queue.group(1)) if queue else 0, int(audit.group(1)) if audit else 0


def engine_rate(messages: list[str], key_file: Path) -> float:
    """Messages/s of the HL7v2 engine alone, in this process, on up to 200 of the messages."""
    engine = _hl7_engine(key_file, "safe-harbor", "patterns")
    sample = messages[:200]
    start = time.perf_counter()
    for m in sample:
        engine(m)
    return len(sample) / (time.perf_counter() - start)


def measure(name: str, messages: list[str], args, key_file: Path, tmp: Path) -> None:
    payloads = [m.encode("utf-8") for m in messages]
    n = len(payloads)
    size = sum(map(len, payloads)) / n
    echo_port = free_port()
    echo = multiprocessing.get_context("fork").Process(target=run_echo, args=(echo_port,), daemon=True)
    echo.start()
    try:
        run(wait_listening(echo_port))
        echo_s = run(send_all(echo_port, payloads, args.connections))
    finally:
        echo.terminate()
        echo.join(10)
    engine = engine_rate(messages, key_file)
    (tmp / name).mkdir()
    audit = ("--audit", "off")
    if args.audit:
        from fhir_transforms.keys import init_key_file

        init_key_file(tmp / name / "audit.key", "audit")
        audit = ("--audit", str(tmp / name / "audit.sqlite"), "--audit-key-file", str(tmp / name / "audit.key"))
    acked_s, delivered_s, cpu, (queue_commits, audit_commits) = run(end_to_end(
        payloads, args.connections, args.workers, key_file, tmp / name, audit=audit))
    _, edge_s, edge_cpu, _ = run(end_to_end(payloads, args.connections, args.workers, key_file, tmp / name,
                                            edge_only=True))
    ms = 1000 / n
    loop_name = "uvloop" if loop_factory() else "asyncio"
    print(f"\n[{name}] {n} messages, mean {size / 1024:.1f} KiB, {args.connections} connections, "
          f"{os.cpu_count()} CPUs, {args.workers} de-identification workers, {loop_name} event loop, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"  raw MLLP echo (same socket code):      {n / echo_s:8.0f} messages/s")
    print(f"  HL7v2 engine alone, one process:       {engine:8.0f} messages/s")
    print(f"  edge alone (identity de-identifier):   {n / edge_s:8.0f} messages/s, queued and delivered "
          f"({edge_cpu.service * ms:.2f} ms CPU per message)")
    audited = "on" if args.audit else "off"
    print(f"  end to end, ACKed to senders:          {n / acked_s:8.0f} messages/s (audit trail {audited})")
    print(f"  end to end, delivered downstream:      {n / delivered_s:8.0f} messages/s")
    print(f"  listener CPU per message:              {cpu.service * ms:8.2f} ms: listener process {cpu.listener * ms:.2f} "
          f"(event loop {cpu.loop * ms:.2f}, commit threads {cpu.threads * ms:.2f}) + workers {cpu.workers * ms:.2f}")
    print(f"  benchmark's own CPU per message:       {cpu.bench * ms:8.2f} ms (senders and downstream, same machine)")
    if queue_commits:
        print(f"  messages per queue commit:             {n / queue_commits:8.1f}"
              + (f" (per audit commit: {n / audit_commits:.1f})" if audit_commits else ""))
    print(f"  ratio end to end / echo:               {echo_s / delivered_s:8.3f}")
    print(f"  target >= 1000 messages/s end to end:  {'met' if n / delivered_s >= 1000 else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adt", type=int, default=3000, help="messages in the short-ADT run (0: skip)")
    parser.add_argument("--samples", type=int, default=300, help="messages in the shared-samples run (0: skip)")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--audit", action=argparse.BooleanOptionalAction, default=True,
                        help="audit trail on (as `deid-adapter mllp` by default; a store in a temporary folder) or off")
    args = parser.parse_args()

    import secrets
    from tests.conftest import write_key  # a throwaway key in the conftest format

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        key_file = write_key(tmp / "bench.key", secrets.token_bytes(32))
        if args.adt:
            measure("adt", [adt_message(n) for n in range(args.adt)], args, key_file, tmp)
        if args.samples:
            samples = load_messages(key_file)
            messages = [with_control_id(m, f"B{n:07d}") for n, m in zip(range(args.samples), itertools.cycle(samples))]
            measure("samples", messages, args, key_file, tmp)


if __name__ == "__main__":
    main()
