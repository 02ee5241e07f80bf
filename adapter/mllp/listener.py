"""The MLLP edge: framing, character sets, ACKs, the asyncio listener and the forwarder.

Flow per message: frame → decode (MSH-18) → de-identify (in a worker pool) → queue durably → ACK AA.
Nothing here logs or echoes message content: logs carry counts, connection ids and MSH-10 control ids.

Responses (one per frame, in order): AA once the de-identified copy is committed to the queue (also for a
resend of an already queued message); AE when the message is HL7 but cannot be de-identified as given
(InputError), or reuses the MSH-10 of a different message; AR when it was not accepted: bad frame, no MSH,
unsupported MSH-18, too large, refused by the de-identification policy (RecordRefused) or by its time limit
(WorkerTimeout), or the queue could not be written (the sender should resend).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import hashlib
import ipaddress
import itertools
import logging
import multiprocessing
import os
import pickle
import re
import signal
import socket
import struct
import time
import weakref
from concurrent.futures import BrokenExecutor, Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Optional, Sequence, Union

from adapter.files import write_atomic
from adapter.mllp.store import QUEUED, REUSED, AsyncStore, GroupCommit, Incoming, Queued
from fhir_transforms.hl7v2 import message as er7
from fhir_transforms.hl7v2.engine import HL7Result
from fhir_transforms.errors import InputError, RecordRefused

log = logging.getLogger("deid_adapter.mllp")

VT = 0x0B
END_BLOCK = b"\x1c\r"
# Real HL7v2 traffic: ADT and ORU are almost all under 64 KiB; the big ones carry a document in OBX-5 (ED, base64),
# a few MB. 8 MiB takes a base64 PDF of about 6 MB; the engine removes such payloads without scanning them.
DEFAULT_MAX_FRAME = 8 * 1024 * 1024
# Messages from this size (characters) on are de-identified in their own lane (BatchedEngine): free text runs at
# about 2.5 MB/s through the patterns stack, so one takes 0.1 s or more, a hundred times a short ADT.
LARGE_MESSAGE = 256 * 1024
# Seconds de-identifying a message may take, per started LARGE_MESSAGE of it, before it is refused (AR) and its
# worker replaced: a short ADT takes ~1 ms, a 40 KB note ~1 s on the NER stack.
DEFAULT_MESSAGE_TIMEOUT = 10.0
OVERSIZE_HEAD = 4096  # bytes of an oversized frame kept to read its MSH, so its NAK carries the sender's MSH-10
READ_CHUNK = 256 * 1024
BLANK = b" \t\r\n\x00"

ERROR_NAMES = {100: "Segment sequence error", 102: "Data type error", 103: "Table value not found",
               104: "Value too long", 207: "Application internal error"}


# ---------------------------------------------------------------------------------------------- framing

@dataclass(frozen=True)
class BadFrame:
    """A run of bytes that was not a well-formed MLLP frame; `reason` never quotes the bytes. `head`: the start of
    an oversized frame, for its MSH (never logged)."""

    reason: str
    code: int = 100
    head: bytes = b""


class FrameDecoder:
    """Sans-IO MLLP decoder: feed bytes, get payloads and BadFrame events in arrival order.

    Every non-blank run of bytes that ends with FS CR, or is cut short by the next VT, is one frame and
    gets exactly one response, so a sender that waits for one answer per message never falls out of step.
    """

    def __init__(self, max_size: int = DEFAULT_MAX_FRAME):
        self.max_size = max_size
        self._buf = bytearray()
        self._open = False      # inside a frame (or a run of stray bytes)
        self._has_start = False
        self._oversize = False
        self._head = b""
        self._scan = 0          # where to resume searching, so big frames are scanned once

    @property
    def partial(self) -> bool:
        """A frame has started and not ended."""
        return self._open

    def feed(self, data: bytes) -> list[Union[bytes, BadFrame]]:
        self._buf += data
        events: list[Union[bytes, BadFrame]] = []
        while self._buf:
            if not self._open:
                skip = len(self._buf) - len(self._buf.lstrip(BLANK))
                del self._buf[:skip]
                if not self._buf:
                    break
                self._has_start = self._buf[0] == VT
                if self._has_start:
                    del self._buf[:1]
                self._open, self._oversize, self._scan = True, False, 0
            end = self._buf.find(END_BLOCK, self._scan)
            restart = self._buf.find(VT, self._scan, end if end >= 0 else len(self._buf))
            if restart >= 0:
                events.append(BadFrame("frame cut short by a new start block (0x0B)"))
                del self._buf[:restart]
                self._open = False
                continue
            if end < 0:
                if len(self._buf) > self.max_size:
                    if not self._oversize:
                        self._head = bytes(self._buf[:OVERSIZE_HEAD])
                    self._oversize = True
                    del self._buf[:-1]  # the last byte may be FS of the end block
                self._scan = max(0, len(self._buf) - 1)
                break
            payload = bytes(self._buf[:end])
            del self._buf[:end + 2]
            self._open = False
            if self._oversize or end > self.max_size:
                head = self._head if self._oversize else payload[:OVERSIZE_HEAD]
                events.append(BadFrame(f"message larger than the limit of {self.max_size} bytes", 104, head))
            elif not self._has_start:
                events.append(BadFrame("frame without start block (0x0B)"))
            else:
                events.append(payload)
        return events


def frame(payload: bytes) -> bytes:
    """Wrap a payload in an MLLP block."""
    return b"\x0b" + payload + END_BLOCK


# ---------------------------------------------------------------------------------------------- HL7 header

class NotAccepted(ValueError):
    """A message turned away before de-identification (answered AR); the message names no values."""

    def __init__(self, reason: str, code: int):
        super().__init__(reason)
        self.code = code


def decode_message(payload: bytes, charset: str = "") -> er7.Decoded:
    """A frame's text, read as files and HTTP bodies are (fhir_transforms/hl7v2/message.py; `charset`: the codec
    of messages whose MSH-18 is empty); a frame that does not start with MSH, or whose bytes cannot be read
    without guessing, is not accepted."""
    if not payload.removeprefix(b"\xef\xbb\xbf").startswith(b"MSH") or len(payload) < 8:
        raise NotAccepted("message does not start with an MSH segment", 100)
    try:
        return er7.read_bytes(payload, charset)
    except er7.CharsetError as e:
        raise NotAccepted(str(e), 103) from None


@dataclass(frozen=True)
class Header:
    """The MSH fields an ACK and de-duplication need. `field(n)` is MSH-n."""

    separator: str
    encoding: str
    fields: tuple[str, ...]

    def field(self, n: int) -> str:
        return self.fields[n - 1] if 2 <= n <= len(self.fields) else ""

    def component(self, n: int, c: int) -> str:
        parts = self.field(n).split(self.encoding[0] if self.encoding else "^")
        return parts[c - 1] if len(parts) >= c else ""

    @property
    def sender(self) -> str:
        return f"{self.field(3)}|{self.field(4)}"

    @property
    def control_id(self) -> str:
        return self.field(10)

    @property
    def version(self) -> str:
        return self.component(12, 1)


def parse_header(text: str) -> Header:
    """MSH of an ER7 message (segments split on CR or LF)."""
    text = text.lstrip("\ufeff")
    seg = re.split(r"[\r\n]", text, maxsplit=1)[0]
    if not seg.startswith("MSH") or len(seg) < 8:
        raise NotAccepted("message does not start with an MSH segment", 100)
    sep = seg[3]
    fields = seg.split(sep)
    return Header(sep, fields[1], tuple(fields))


def _escape(text: str, sep: str, enc: str) -> str:
    """Free text for an ACK: printable ASCII only, at most 200 characters, escaped as every value is."""
    printable = "".join(ch if " " <= ch <= "~" else "?" for ch in text)[:200]
    comp, rep, esc, sub = (enc + "^~\\&"[len(enc):])[:4]
    return er7.escape(printable, er7.Delimiters(sep, comp, rep, esc, sub))


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3]) or (2, 5)


@functools.lru_cache(maxsize=1)
def _utc_stamp(second: int) -> str:
    """MSH-7 of an ACK, worked out once per second (ACKs go out hundreds a second)."""
    return time.strftime("%Y%m%d%H%M%S+0000", time.gmtime(second))


def build_ack(header: Optional[Header], code: str, error: Optional[str] = None, error_code: int = 207) -> str:
    """An original-mode ACK: MSH with sending and receiving app/facility swapped, same version,
    MSH-9 ACK^<trigger>, MSA-2 = the sender's MSH-10, and for AE/AR an ERR that names the problem."""
    sep, enc = (header.separator, header.encoding) if header else ("|", "^~\\&")
    comp = enc[0] if enc else "^"
    h = header.field if header else (lambda n: "")
    version = (header.version if header else "") or "2.5"
    trigger = header.component(9, 2) if header else ""
    msh9 = "ACK" + (f"{comp}{trigger}" if trigger else "")
    if trigger and _version_tuple(version) >= (2, 3, 1):
        msh9 += f"{comp}ACK"
    now = _utc_stamp(int(time.time()))
    msh = ["MSH", enc, h(5), h(6), h(3), h(4), now, "", msh9, os.urandom(10).hex(), h(11) or "P", h(12) or version]
    if header and h(18).split(header.encoding[1:2] or "~")[0].strip().upper() in er7.CHARSETS:
        msh += [""] * (17 - len(msh)) + [h(18)]  # an unknown one is not copied: the ACK could not agree with it
    segments = [sep.join(msh)]
    control_id = header.control_id if header else ""
    if error is None:
        segments.append(sep.join(["MSA", code, control_id]))
    else:
        text = _escape(error, sep, enc)
        name = _escape(ERROR_NAMES.get(error_code, ERROR_NAMES[207]), sep, enc)
        sub = enc[3] if len(enc) > 3 else "&"
        if _version_tuple(version) < (2, 5):
            segments.append(sep.join(["MSA", code, control_id, text]))
            segments.append(sep.join(["ERR", comp * 3 + sub.join([str(error_code), name, "HL70357"])]))
        else:
            segments.append(sep.join(["MSA", code, control_id]))
            segments.append(sep.join(["ERR", "", "", comp.join([str(error_code), name, "HL70357"]), "E",
                                      "", "", "", text]))
    return "\r".join(segments) + "\r"


def ack_bytes(ack: str) -> bytes:
    """An ACK's bytes, agreeing with its own MSH-18 as every HL7v2 output does (`er7.write_message`): it copies
    MSH-3..6 and MSH-18 of the message it answers, which may hold characters its label does not."""
    if ack.isascii():  # nearly every ACK: any label holds it, and `write_message` would write these bytes
        return ack.encode("ascii")
    try:
        return er7.write_message(er7.parse_message(ack))
    except InputError:  # delimiters of a frame that could not be read: no MSH-18 to agree with, ASCII only
        return ack.encode("ascii", "replace")


def read_ack(payload: bytes) -> tuple[str, str]:
    """(MSA-1, MSA-2) of a downstream ACK; ('', '') when there is no MSA."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = payload.decode("latin-1")
    sep = text[3] if len(text) > 3 else "|"
    for seg in re.split(r"[\r\n]+", text):
        if seg.startswith("MSA"):
            f = seg.split(sep)
            return (f[1] if len(f) > 1 else "").strip(), (f[2] if len(f) > 2 else "").strip()
    return "", ""


# ---------------------------------------------------------------------------------------------- listener

@dataclass
class Stats:
    received: int = 0
    accepted: int = 0
    duplicates: int = 0
    errors: int = 0      # AE
    rejected: int = 0    # AR, bad frames included
    delivered: int = 0
    parked: int = 0
    connections: int = 0
    dropped: int = 0     # connections from addresses not in --allow

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in vars(self).items())


class _Connection:
    def __init__(self, cid: int, task: asyncio.Task, peer: str = "?"):
        self.cid, self.task, self.busy, self.peer = cid, task, False, peer


def deidentify_each(deidentify: Callable[[str], str], texts: list[str]) -> list[tuple[bool, object]]:
    """In a worker: (True, output) or (False, the exception) for each message, so one bad message fails only itself."""
    results: list[tuple[bool, object]] = []
    for text in texts:
        try:
            results.append((True, deidentify(text)))
        except Exception as e:  # noqa: BLE001 - handed back to the listener, which answers AE or AR
            results.append((False, e))
    return results


class WorkerTimeout(RecordRefused):
    """De-identifying a message ran past the listener's time limit: refused (AR), nothing forwarded."""

    def __init__(self, limit_s: float):
        super().__init__(f"de-identification did not finish within {limit_s:g} s")


# The listener's ends of the worker socket pairs: a process forked later must close its copies, or a worker
# would not see its socket close when the listener closes it.
_LISTENER_ENDS: "weakref.WeakSet[socket.socket]" = weakref.WeakSet()


class WorkerSpawner:
    """Forks de-identification workers on request. It is itself forked when made, while the listener has one
    thread, and holds the engine; every worker is forked from it, so a replacement for a worker killed for running
    too long starts from that clean state, never from a fork of the listener's threaded process. It ignores
    SIGINT/SIGTERM, reaps its workers as they exit, and exits when its control socket closes."""

    PID = struct.Struct("!q")

    def __init__(self, deidentify: Callable[[str], str]):
        ours, theirs = socket.socketpair()
        self._process = multiprocessing.get_context("fork").Process(
            target=_spawn_workers, args=(theirs, deidentify, [ours, *_LISTENER_ENDS]), daemon=True,
            name="deid-spawner")
        self._process.start()
        theirs.close()
        self._control = ours
        _LISTENER_ENDS.add(ours)

    def spawn(self) -> tuple[int, socket.socket]:
        """(pid, the listener's end of its socket pair) of a new worker; BrokenExecutor when the spawner is gone."""
        try:
            self._control.sendall(b"+")
            data, fds, _, _ = socket.recv_fds(self._control, self.PID.size, 1)
        except OSError:
            data, fds = b"", []
        if len(data) < self.PID.size or not fds:
            raise BrokenExecutor("the de-identification worker spawner is gone")
        sock = socket.socket(fileno=fds[0])
        _LISTENER_ENDS.add(sock)
        return self.PID.unpack(data)[0], sock

    def close(self) -> None:
        """Stop the spawner (its workers are their pools' to stop)."""
        self._control.close()
        self._process.join(10.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def _spawn_workers(control: socket.socket, deidentify: Callable[[str], str], listener_ends: list[socket.socket]) -> None:
    """The spawner process: fork a worker for each byte read on `control`, and send back its pid and socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited workers are reaped by the kernel
    # Everything here (the engine, the modules) lives as long as the workers: frozen, it is left out of their full
    # garbage collections (~30 ms each over the engine's ~90,000 objects), which would also copy every page that
    # holds one of them (fork shares the pages until one is written).
    gc.freeze()
    for sock in listener_ends:
        sock.close()
    with control:
        while control.recv(1):
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    control.close()
                    ours.close()
                    _serve_batches(theirs, deidentify)
                    code = 0
                finally:
                    os._exit(code)
            theirs.close()
            socket.send_fds(control, [WorkerSpawner.PID.pack(pid)], [ours.fileno()])
            ours.close()


@dataclass
class _Worker:
    pid: int
    sock: socket.socket
    reader: Optional[asyncio.StreamReader] = None
    writer: Optional[asyncio.StreamWriter] = None
    expired: bool = False  # killed at its call's time limit

    def expire(self) -> None:
        """Kill the worker: its call ran past the time limit (the exchange then fails, and it is replaced)."""
        self.expired = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class WorkerProcesses:
    """Processes that de-identify batches of messages, each on its own socket pair: a batch is one length-prefixed
    pickle each way, written and read by the event loop itself. (A ProcessPoolExecutor puts a manager thread and
    its GIL hand-offs between the loop and the worker: about 0.2 ms of the listener's CPU per call, more than the
    engine spends on a short ADT.) They are forked by a WorkerSpawner (made with `engine`, or shared with another
    pool) and inherit the engine; they ignore SIGINT/SIGTERM (the listener finishes their work, then closes their
    sockets) and exit when their socket closes, also when the listener is killed. A worker that runs past a
    call's time limit is killed and replaced."""

    HEADER = struct.Struct("!Q")

    def __init__(self, engine: Union[Callable[[str], str], WorkerSpawner], count: int):
        self.count = max(1, count)
        self._own_spawner = not isinstance(engine, WorkerSpawner)
        self.spawner = WorkerSpawner(engine) if self._own_spawner else engine
        self._workers = [_Worker(*self.spawner.spawn()) for _ in range(self.count)]
        self._idle: Optional[asyncio.Queue] = None  # idle workers; None in it once one is lost

    @property
    def pids(self) -> list[int]:
        """The current workers' process ids."""
        return [w.pid for w in self._workers]

    async def run(self, texts: list[str], timeout: Optional[float] = None) -> list[tuple[bool, object]]:
        """`deidentify_each` of `texts` in the next idle worker. WorkerTimeout after `timeout` seconds (the worker
        is killed and replaced). BrokenExecutor once any worker died: the listener then stops."""
        if self._idle is None:
            self._idle = asyncio.Queue()
            for w in self._workers:
                await self._open(w)
        worker = await self._idle.get()
        if worker is None:
            self._idle.put_nowait(None)
            raise BrokenExecutor("a de-identification worker died")
        # a timer, not wait_for: no task per call on the hot path
        deadline = None if timeout is None else asyncio.get_running_loop().call_later(timeout, worker.expire)
        try:
            results = await self._exchange(worker, texts)
        except BaseException as e:  # died, or cancelled mid-exchange: its stream is out of step either way
            if deadline is not None:
                deadline.cancel()
            worker.writer.close()
            if worker.expired:
                await self._replace(worker)
                raise WorkerTimeout(timeout) from None
            self._idle.put_nowait(None)
            if isinstance(e, (OSError, EOFError, asyncio.IncompleteReadError)):
                raise BrokenExecutor("a de-identification worker died") from None
            raise
        if deadline is not None:
            deadline.cancel()
        if worker.expired:  # answered just as its time ran out, and killed all the same
            worker.writer.close()
            await self._replace(worker)
        else:
            self._idle.put_nowait(worker)
        return results

    async def _exchange(self, worker: _Worker, texts: list[str]) -> list[tuple[bool, object]]:
        data = pickle.dumps(texts, pickle.HIGHEST_PROTOCOL)
        worker.writer.write(self.HEADER.pack(len(data)) + data)
        await worker.writer.drain()
        size = self.HEADER.unpack(await worker.reader.readexactly(self.HEADER.size))[0]
        return pickle.loads(await worker.reader.readexactly(size))

    async def _open(self, worker: _Worker) -> None:
        worker.reader, worker.writer = await asyncio.open_connection(sock=worker.sock, limit=READ_CHUNK)
        self._idle.put_nowait(worker)

    async def _replace(self, worker: _Worker) -> None:
        """Put a fresh worker in the place of one killed at its time limit."""
        try:
            fresh = _Worker(*self.spawner.spawn())
        except BrokenExecutor:
            self._idle.put_nowait(None)
            raise
        self._workers[self._workers.index(worker)] = fresh
        log.warning("a de-identification worker ran past its time limit; replaced")
        await self._open(fresh)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Close every worker's socket (it exits at once), wait for the workers to be gone, stop an own spawner."""
        for w in self._workers:
            w.sock.close()
        end = time.monotonic() + (10.0 if wait else 0.0)
        for w in self._workers:
            while _alive(w.pid) and time.monotonic() < end:
                time.sleep(0.01)
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGKILL)
        if self._own_spawner:
            self.spawner.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _serve_batches(sock: socket.socket, deidentify: Callable[[str], str]) -> None:
    """A worker process: answer each batch on `sock` until it closes."""
    header = WorkerProcesses.HEADER
    with sock, sock.makefile("rb") as incoming:
        while True:
            head = incoming.read(header.size)
            if len(head) < header.size:
                return
            texts = pickle.loads(incoming.read(header.unpack(head)[0]))
            results = deidentify_each(deidentify, texts)
            try:
                data = pickle.dumps(results, pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - an exception that does not pickle still fails only its message
                data = pickle.dumps([r if r[0] else (False, RuntimeError(f"internal error ({type(r[1]).__name__})"))
                                     for r in results], pickle.HIGHEST_PROTOCOL)
            sock.sendall(header.pack(len(data)) + data)


class WorkerLane:
    """De-identification in at most `slots` concurrent calls (one per worker). A call takes a fair share of the
    messages waiting when it starts, so under load one round trip to a worker carries several messages and its
    cost is shared; an idle listener still sends each message in the turn of the event loop that read it. The
    messages read in one turn (from several connections) share the calls started at its end. The executor may be
    WorkerProcesses (the CLI's), any concurrent.futures executor, or None (the loop's default threads).

    A call that runs past its limit (`timeout` seconds per started LARGE_MESSAGE characters) fails closed: a lone
    message is refused (WorkerTimeout); the messages of a batch are tried again one at a time, so only the one
    that runs too long is refused. A worker process is killed and replaced; a thread cannot be, and runs on
    (`--workers 0`)."""

    def __init__(self, deidentify: Callable[[str], str], executor: Union[Executor, WorkerProcesses, None],
                 slots: int = 1, max_batch: int = 32, timeout: Optional[float] = None):
        self.deidentify, self.executor = deidentify, executor
        self.slots = max(1, slots)
        self.max_batch, self.timeout = max_batch, timeout
        self._calls: set[asyncio.Task] = set()
        self._waiting: list[tuple[str, asyncio.Future]] = []
        self._dispatching = False  # a dispatch is scheduled for this turn of the event loop

    def in_hand(self) -> list[asyncio.Future]:
        """The calls running and the messages waiting for one."""
        return [*self._calls, *(fut for _, fut in self._waiting)]

    async def __call__(self, text: str) -> str:
        """The output for one message, or the exception de-identifying it raised."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((text, fut))
        if not self._dispatching:
            self._dispatching = True
            asyncio.get_running_loop().call_soon(self._dispatch)
        return await fut

    def _dispatch(self) -> None:
        """At the end of a turn of the event loop: the messages read in it share the calls started now (a worker
        wake-up and exchange for a share of them, not for each)."""
        self._dispatching = False
        self._start_calls()

    def _start_calls(self) -> None:
        while self._waiting and len(self._calls) < self.slots:
            share = min(self.max_batch, -(-len(self._waiting) // self.slots))
            batch, self._waiting = self._waiting[:share], self._waiting[share:]
            call = asyncio.ensure_future(self._run(batch))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _run(self, batch: list[tuple[str, asyncio.Future]]) -> None:
        try:
            results = await self._results([text for text, _ in batch])
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - the pool broke: every message of the call hears of it
            results = [(False, e)] * len(batch)
        for (_, fut), (ok, value) in zip(batch, results):
            if fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        self._calls.discard(asyncio.current_task())  # this slot is free now, before the done callback runs
        self._start_calls()

    async def _results(self, texts: list[str]) -> list[tuple[bool, object]]:
        parts = max(1, -(-sum(map(len, texts)) // LARGE_MESSAGE))
        limit = None if self.timeout is None else self.timeout * parts
        try:
            if isinstance(self.executor, WorkerProcesses):
                return await self.executor.run(texts, limit)
            call = asyncio.get_running_loop().run_in_executor(self.executor, deidentify_each, self.deidentify, texts)
            try:
                return await asyncio.wait_for(call, limit)
            except asyncio.TimeoutError:
                raise WorkerTimeout(limit) from None
        except WorkerTimeout as e:
            if len(texts) == 1:
                return [(False, e)]
            return [result for text in texts for result in await self._results([text])]


class BatchedEngine:
    """The listener's de-identification: messages of `large_from` characters or more take their own lane, so a
    few big messages cannot hold every worker while short ones wait for their ACKs. The large lane runs on
    `large_executor`, or, when None, on the same executor in at most all but one of its slots."""

    def __init__(self, deidentify: Callable[[str], str], executor: Union[Executor, WorkerProcesses, None],
                 slots: int = 1, max_batch: int = 32, *,
                 large_executor: Union[Executor, WorkerProcesses, None] = None,
                 large_from: int = LARGE_MESSAGE, timeout: Optional[float] = None):
        slots = executor.count if isinstance(executor, WorkerProcesses) else max(1, slots)
        self.small = WorkerLane(deidentify, executor, slots, max_batch, timeout)
        if large_executor is None:
            self.large = WorkerLane(deidentify, executor, max(1, slots - 1), 1, timeout)
        else:
            large_slots = large_executor.count if isinstance(large_executor, WorkerProcesses) else 1
            self.large = WorkerLane(deidentify, large_executor, large_slots, 1, timeout)
        self.large_from = large_from

    async def settle(self, timeout: float) -> None:
        """Until the messages in de-identification now are done, or `timeout` seconds: a group commit waits for
        them, so that messages finishing close together share one audit transaction and one queue commit."""
        pending = [*self.small.in_hand(), *self.large.in_hand()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
            await asyncio.sleep(0)  # their callers run on and submit before the commit starts

    async def __call__(self, text: str) -> str:
        """The output for one message, or the exception de-identifying it raised."""
        return await (self.large if len(text) >= self.large_from else self.small)(text)


@dataclass(frozen=True)
class AuditEvent:
    """What one message's audit record says: de-identified (`output`) or refused (`reason`), from `peer`."""

    peer: str
    message: str
    output: Optional[str] = None
    reason: Optional[str] = None
    findings: Sequence = ()  # where the text stack found PHI (fhir_transforms/hl7v2/engine.py Finding)


# Writes one audit record per event, all in one transaction, durable when it returns; one result per event.
AuditHook = Callable[[list[AuditEvent]], list]


class AuditedQueue:
    """The audit records, then the queue inserts, of the messages that finish together. The audit transaction
    runs on the audit's own thread; once it is durable, that thread hands the group's queue commit straight to
    the queue's thread. The event loop hears of a group once, when its queue commit is durable (or its audit
    failed): not of the audit in between. GroupCommit writes one group at a time, so the next group's audit
    starts only then; what the audit's own thread buys is that the audit, the longer step, does not wait behind
    the forwarder's fetches on the queue's thread (both commits on that thread lowered the rate; see
    docs/measurements.md)."""

    def __init__(self, audit: AuditHook, store: AsyncStore, linger: Callable[[], Awaitable[None]]):
        self.hook, self.store = audit, store
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mllp-audit")
        self.commits = GroupCommit(self._write, self._thread, linger=linger)
        self.queue_commits = 0

    async def submit(self, event: AuditEvent, incoming: Optional[Incoming]) -> Optional[str]:
        """Audit `event`, then queue `incoming` (when given): what the queue answered (QUEUED, RESEND, REUSED), or
        None with nothing to queue. Raises what the audit or the queue raised; a failed audit queues nothing."""
        outcome = await self.commits.submit((event, incoming))
        if outcome == QUEUED:
            self.store.new_message.set()
        return outcome

    def _write(self, items: list[tuple[AuditEvent, Optional[Incoming]]]):
        """On the audit thread: the group's audit, then its queue commit handed on (a future of the outcomes)."""
        self.hook([event for event, _ in items])  # raises: nothing of the group is queued
        if all(incoming is None for _, incoming in items):
            return [None] * len(items)
        self.queue_commits += 1
        return self.store.executor.submit(self._enqueue, items)

    def _enqueue(self, items: list[tuple[AuditEvent, Optional[Incoming]]]) -> list:
        outcomes = iter(self.store.store.enqueue_many([incoming for _, incoming in items if incoming is not None]))
        return [None if incoming is None else next(outcomes) for _, incoming in items]

    async def drain(self) -> None:
        """Until every audit is written and every queue commit handed on (the queue's thread finishes those
        before the store closes)."""
        await self.commits.drain()
        self._thread.shutdown(wait=True)


class MllpListener:
    """Accepts persistent MLLP connections; each frame is answered in order, one at a time per connection
    (so queue order is each connection's order); connections run concurrently."""

    COMMIT_DELAY_S = 0.004  # 2 ms: ~3.9 messages a commit at 8 connections; 4 ms: ~5, and more messages/s (docs/measurements.md)

    def __init__(self, deidentify: Callable[[str], str], store: AsyncStore,
                 executor: Union[Executor, WorkerProcesses, None] = None, parallel: int = 1,
                 *, max_frame: int = DEFAULT_MAX_FRAME, partial_timeout: float = 60.0, stats: Optional[Stats] = None,
                 on_fatal: Callable[[], None] = lambda: None, audit: Optional[AuditHook] = None,
                 large_executor: Union[Executor, WorkerProcesses, None] = None, large_from: int = LARGE_MESSAGE,
                 message_timeout: Optional[float] = DEFAULT_MESSAGE_TIMEOUT, allow: Sequence[IPNetwork] = (),
                 charset: str = ""):
        self.charset = charset  # the codec of messages whose MSH-18 is empty ('': UTF-8 only)
        self.engine = BatchedEngine(deidentify, executor, parallel, large_executor=large_executor,
                                    large_from=large_from, timeout=message_timeout)
        self.allow = list(allow)  # empty: every client
        # The first durable step waits for the messages still in de-identification (at most COMMIT_DELAY_S), so
        # that they share its commit; the queue then commits each audited group as one.
        settle = functools.partial(self.engine.settle, self.COMMIT_DELAY_S)
        self.audit = AuditedQueue(audit, store, settle) if audit and store is not None else None
        if not audit and store is not None:
            store.enqueues.linger = settle
        self.on_fatal = on_fatal
        self.failure: Optional[str] = None  # set when the service cannot go on (its workers died)
        self.store = store
        self.max_frame = max_frame
        self.partial_timeout = partial_timeout
        self.stats = stats or Stats()
        self._server: Optional[asyncio.AbstractServer] = None
        self._conns: dict[int, _Connection] = {}
        self._ids = itertools.count(1)
        self._stopping = False

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Start listening; returns the bound address (port 0 picks a free one)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=READ_CHUNK)
        return self._server.sockets[0].getsockname()[:2]

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, let each connection finish the message in hand, then close them all."""
        self._stopping = True
        if self._server:
            self._server.close()
        for c in list(self._conns.values()):
            if not c.busy:
                c.task.cancel()
        tasks = [c.task for c in self._conns.values()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for t in late:
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._server:
            await self._server.wait_closed()
        if self.audit is not None:
            await self.audit.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopping:
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        if self.allow and not allowed(peer[0] if peer else "", self.allow):
            self.stats.dropped += 1
            log.warning("connection from %s dropped: not in --allow", peer[0] if peer else "?")
            writer.transport.abort()
            return
        cid = next(self._ids)
        conn = self._conns[cid] = _Connection(cid, asyncio.current_task(), f"{peer[0]}:{peer[1]}" if peer else "?")
        self.stats.connections += 1
        log.info("connection %d opened from %s", cid, peer[0] if peer else "?")
        decoder = FrameDecoder(self.max_frame)
        try:
            while not self._stopping:
                if decoder.partial:
                    data = await asyncio.wait_for(reader.read(READ_CHUNK), self.partial_timeout)
                else:  # no timer and no task for the wait between whole frames
                    data = await reader.read(READ_CHUNK)
                if not data:
                    break
                conn.busy = True
                for event in decoder.feed(data):
                    writer.write(frame(await self._answer(cid, event)))
                    await writer.drain()
                    if self._stopping:
                        break
                conn.busy = False
        except asyncio.TimeoutError:
            log.warning("connection %d: frame incomplete after %.0f s; closing", cid, self.partial_timeout)
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._conns.pop(cid, None)
            writer.close()
            log.info("connection %d closed", cid)

    async def _answer(self, cid: int, event: Union[bytes, BadFrame]) -> bytes:
        """The response frame payload for one frame: ACK or NAK, encoded like the message."""
        self.stats.received += 1
        # Logs name a message by its arrival number, never by MSH-10: senders build control ids from
        # timestamps, MRNs and account numbers. The sender matches its ACK (MSA-2) to its own id.
        number = self.stats.received
        if isinstance(event, BadFrame):
            self.stats.rejected += 1
            log.warning("connection %d: bad frame: %s", cid, event.reason)
            header = _header_or_none(event.head) if event.head else None
            return ack_bytes(build_ack(header, "AR", event.reason, event.code))
        header = None
        try:
            decoded = decode_message(event, self.charset)
            header = parse_header(decoded.text)
            ack = await self._accept(header, decoded, cid, number)
        except NotAccepted as e:
            header = header or _header_or_none(event)
            self.stats.rejected += 1
            log.warning("connection %d: message #%d not accepted: %s", cid, number, e)
            ack = build_ack(header, "AR", str(e), e.code)
        except InputError as e:
            self.stats.errors += 1
            log.warning("connection %d: message #%d bad input: %s", cid, number, e)
            ack = build_ack(header, "AE", f"cannot be de-identified as given: {e}", 102)
        except RecordRefused as e:
            self.stats.rejected += 1
            log.warning("connection %d: message #%d refused: %s", cid, number, e)
            ack = build_ack(header, "AR", f"refused by de-identification: {e}", 207)
            if self.audit is not None:
                try:
                    await self.audit.submit(AuditEvent(self._peer(cid), decoded.text, reason=str(e)), None)
                except Exception as audit_error:  # noqa: BLE001 - the NAK stands; the operator must see it
                    log.error("connection %d: audit of a refusal failed: %s", cid, type(audit_error).__name__)
        except BrokenExecutor:
            self.stats.rejected += 1
            self.failure = "the de-identification workers died"
            log.error("connection %d: message #%d: %s; stopping", cid, number, self.failure)
            self.on_fatal()
            ack = build_ack(header, "AR", "internal error; resend later", 207)
        except Exception as e:  # noqa: BLE001 - a bug or a full disk must not cost the connection
            self.stats.rejected += 1
            log.error("connection %d: message #%d: internal error %s", cid, number, type(e).__name__)
            ack = build_ack(header, "AR", f"internal error ({type(e).__name__}); resend later", 207)
        return ack_bytes(ack)

    def _peer(self, cid: int) -> str:
        conn = self._conns.get(cid)
        return conn.peer if conn else "?"

    async def _accept(self, header: Header, decoded: er7.Decoded, cid: int = 0, number: int = 0) -> str:
        result = await self.engine(decoded.text)
        # the engine's HL7Result (output and findings), or the output alone (a caller's own de-identifier)
        out, findings = (result.text, result.findings) if isinstance(result, HL7Result) else (result, ())
        # in the character set the output's MSH-18 names (the engine made it one that holds the text)
        body, codec = er7.encode(out), er7.output_codec(out)
        out_control_id = parse_header(out).control_id
        # resends are recognized by the output's control id, a keyed pseudonym of (sender, MSH-10): the
        # store never holds the sender's own id
        incoming = Incoming(header.sender, header.control_id and out_control_id, out_control_id, codec, body,
                            content_digest(header, decoded.text))
        if self.audit is not None:  # durable before the message is queued and ACKed; a failure NAKs (AR)
            outcome = await self.audit.submit(AuditEvent(self._peer(cid), decoded.text, output=out, findings=findings),
                                              incoming)
        else:
            outcome = await self.store.enqueue(incoming)
        if outcome == REUSED:
            # Forwarded, it would reach downstream under the pseudonym of a control id downstream has already
            # seen, and a receiver that honours MSH-10 would drop it: a NAK is the only answer that loses nothing.
            self.stats.errors += 1
            log.warning("connection %d: message #%d reuses the control id (pseudonym %s) of a different message "
                        "received within the de-duplication window; answered AE, not forwarded",
                        cid, number, _cid_text(out_control_id))
            return build_ack(header, "AE", "MSH-10 was already used for a different message; not forwarded", 207)
        if outcome == QUEUED:
            self.stats.accepted += 1
        else:
            self.stats.duplicates += 1
        return build_ack(header, "AA")


def content_digest(header: Header, text: str) -> str:
    """SHA-256 of a message less MSH-7, which some senders stamp anew on a resend: a resend has the digest of
    the original, a different message under the same MSH-10 another one."""
    body = text.lstrip("\ufeff")
    msh = header.separator.join(header.fields)
    kept = header.separator.join(header.fields[:6] + header.fields[7:])
    return hashlib.sha256((kept + body[len(msh):]).encode("utf-8", "surrogatepass")).hexdigest()


IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


def parse_allow(texts: Sequence[str]) -> list[IPNetwork]:
    """CIDRs (or single addresses) → networks; ValueError names the one that is not."""
    networks = []
    for text in texts:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{text!r} is not an IP address or CIDR network") from None
    return networks


def allowed(host: str, networks: Sequence[IPNetwork]) -> bool:
    """Whether a peer address is in one of `networks` (an IPv4-mapped IPv6 peer counts as its IPv4 address)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


def _header_or_none(payload: bytes) -> Optional[Header]:
    """The MSH of a frame that was not accepted, for its NAK: read as UTF-8 where it is, else byte for byte."""
    try:
        return parse_header(payload.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    except NotAccepted:
        return None
    try:
        return parse_header(payload.decode("latin-1"))
    except NotAccepted:
        return None


# ---------------------------------------------------------------------------------------------- forwarding

DELIVERED, PARK, RETRY = "delivered", "park", "retry"
DOES_NOT_RESOLVE = "does not resolve"  # the reason of a RETRY when the downstream host name has no address


class MllpTarget:
    """A downstream MLLP peer: one persistent connection, one message in flight, waits for its ACK."""

    def __init__(self, host: str, port: int, ack_timeout: float = 30.0, connect_timeout: float = 10.0):
        self.host, self.port = host, port
        self.ack_timeout, self.connect_timeout = ack_timeout, connect_timeout
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._decoder = FrameDecoder()

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    async def deliver(self, item: Queued) -> tuple[str, str]:
        """(DELIVERED|PARK|RETRY, ack code). AA/CA delivered; AE/CE parked; AR/CR, no answer, a wrong MSA-2
        or a closed connection: retried (the connection is dropped, so a late ACK cannot be misread)."""
        try:
            if self._writer is None:
                self._reader, self._writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, limit=READ_CHUNK), self.connect_timeout)
                self._decoder = FrameDecoder()
            self._writer.write(frame(item.body))
            await self._writer.drain()
            answer = await asyncio.wait_for(self._read_frame(), self.ack_timeout)
        except socket.gaierror:
            await self.close()
            return RETRY, DOES_NOT_RESOLVE
        except (OSError, asyncio.TimeoutError, EOFError, ConnectionError):
            await self.close()
            return RETRY, ""
        code, acked_id = read_ack(answer) if isinstance(answer, bytes) else ("", "")
        if acked_id != item.control_id or code not in ("AA", "CA", "AE", "CE", "AR", "CR"):
            await self.close()
            return RETRY, code
        return (DELIVERED if code in ("AA", "CA") else PARK if code in ("AE", "CE") else RETRY), code

    async def _read_frame(self):
        while True:
            data = await self._reader.read(READ_CHUNK)
            if not data:
                raise EOFError
            events = self._decoder.feed(data)
            if events:
                return events[0]

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (OSError, ConnectionError):
                pass
        self._reader = self._writer = None


class FolderTarget:
    """A folder: each message becomes `<queue id>.hl7`, written atomically and fsynced; a resend after a
    crash rewrites the same name, so the folder holds each message once."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def __str__(self) -> str:
        return str(self.folder)

    async def deliver(self, item: Queued) -> tuple[str, str]:
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._write, item)
        except OSError as e:
            log.error("forward: cannot write to %s: %s", self.folder, e.strerror)
            return RETRY, ""
        return DELIVERED, ""

    def _write(self, item: Queued) -> None:
        write_atomic(self.folder / f"{item.id:016d}.hl7", item.body)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself must be durable before the queue forgets the message
        finally:
            os.close(fd)

    async def close(self) -> None:
        return None


class Forwarder:
    """Delivers queued messages in queue order; retries with capped exponential backoff while the target
    is down. A message is marked delivered only after the target has it, so nothing is lost.

    Marks are committed behind the delivery, not before the next one (a mark waiting behind an enqueue's
    fsync would otherwise cap delivery at one message per fsync): they go with the next fetch of queued
    messages, in the same call to the queue's thread, or in one commit of their own once half of MAX_UNMARKED
    pile up, or after MARK_LINGER_S when no message comes. After a crash, the messages the target had ACKed in
    the last moments before it (at most MAX_UNMARKED) are sent again; receivers drop them by MSH-10.
    """

    MAX_UNMARKED = 64
    FETCH = 256  # queued messages per fetch
    MARK_LINGER_S = 0.05  # how long marks wait, while no message comes, for a fetch to go with

    def __init__(self, store: AsyncStore, target, *, backoff_initial: float = 0.1, backoff_cap: float = 30.0,
                 stats: Optional[Stats] = None):
        self.store, self.target = store, target
        self.backoff_initial, self.backoff_cap = backoff_initial, backoff_cap
        self.stats = stats or Stats()
        self._stop = asyncio.Event()
        self._unmarked: list[int] = []
        self._marking: Optional[asyncio.Task] = None

    async def run(self) -> None:
        after = 0  # queue ids only grow: everything up to here is delivered or parked, marked or not yet
        backoff = self.backoff_initial
        try:
            while not self._stop.is_set():
                self.store.new_message.clear()
                marks, self._unmarked = self._unmarked, []
                batch = await self.store.pending(after, self.FETCH, delivered=marks)
                if not batch:
                    await _wait(self.store.new_message, 1.0)
                    continue
                for item in batch:
                    while True:
                        outcome, code = await self.target.deliver(item)
                        if outcome == DELIVERED:
                            await self._mark(item.id)
                            self.stats.delivered += 1
                            backoff = self.backoff_initial
                            break
                        if outcome == PARK:
                            await self.store.park(item, code)
                            self.stats.parked += 1
                            log.warning("forward: %s answered %s for message %s; parked", self.target, code,
                                        _cid_text(item.control_id))
                            break
                        if self._stop.is_set():
                            return
                        if code == DOES_NOT_RESOLVE:
                            log.warning("forward: %s: the host %s does not resolve; retry in %.1f s", self.target,
                                        getattr(self.target, "host", ""), backoff)
                        else:
                            log.info("forward: %s unavailable (%s); retry in %.1f s", self.target,
                                     code or "no answer", backoff)
                        await _wait(self._stop, backoff)
                        backoff = min(self.backoff_cap, backoff * 2)
                    after = item.id
                    if self._stop.is_set():
                        return
                if len(batch) < self.FETCH and not self.store.new_message.is_set():
                    await self._wait_caught_up()
        finally:
            await self._flush_marks()

    async def _wait_caught_up(self) -> None:
        """The last fetch came back short and nothing was queued since (the event is cleared before each fetch):
        another fetch now would come back empty, a thread hop for nothing. Wait for the next message instead, and
        let its fetch carry the marks; marks still waiting after MARK_LINGER_S go with a fetch of their own."""
        await _wait(self.store.new_message, self.MARK_LINGER_S if self._unmarked else 1.0)

    async def _mark(self, item_id: int) -> None:
        if self._marking is not None and self._marking.done():
            self._marking.result()  # a failed mark stops the forwarder rather than pass unseen
        self._unmarked.append(item_id)
        if len(self._unmarked) >= self.MAX_UNMARKED:
            await self._flush_marks()
        elif len(self._unmarked) >= self.MAX_UNMARKED // 2 and (self._marking is None or self._marking.done()):
            self._marking = asyncio.create_task(self._flush_marks())

    async def _flush_marks(self) -> None:
        """Commit every pending mark (one transaction for all that piled up meanwhile)."""
        if self._marking is not None and not self._marking.done() and self._marking is not asyncio.current_task():
            await self._marking
        while self._unmarked:
            ids, self._unmarked = self._unmarked, []
            await self.store.mark_delivered(ids)

    async def stop(self) -> None:
        """Finish the delivery in hand, then stop."""
        self._stop.set()
        self.store.new_message.set()  # wakes an idle wait



async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Until `event` is set or `timeout` seconds have passed."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass


def _cid_text(control_id: str) -> str:
    return repr(control_id[:40])


# ---------------------------------------------------------------------------------------------- service

def loop_factory() -> Optional[Callable[[], asyncio.AbstractEventLoop]]:
    """uvloop's event loop where uvloop is installed, else None (asyncio's own). The listener's process spends most
    of its time in event loop machinery (callbacks, futures, socket and thread wake-ups); uvloop's is in C and costs
    about a quarter less CPU per message there."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [::1]:PORT) → (host, port); ValueError otherwise."""
    m = re.fullmatch(r"\[?([^\[\]/\\]+?)\]?:(\d{1,5})", text.strip())
    if not m or not 0 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return m.group(1), int(m.group(2))


def make_target(forward: str, ack_timeout: float = 30.0):
    """`HOST:PORT` → MllpTarget; anything else (a path) → FolderTarget."""
    try:
        host, port = parse_address(forward)
    except ValueError:
        return FolderTarget(Path(forward))
    return MllpTarget(host, port, ack_timeout)


async def serve(deidentify: Callable[[str], str], listen: tuple[str, int], target, store_path: Path, *,
                executor: Union[Executor, WorkerProcesses, None] = None, parallel: int = 1,
                stop: Optional[asyncio.Event] = None,
                max_frame: int = DEFAULT_MAX_FRAME, backoff_cap: float = 30.0, dedupe_window_s: float = 86400.0,
                stats_every_s: float = 30.0, on_ready: Optional[Callable[[tuple[str, int]], None]] = None,
                audit: Optional[AuditHook] = None, large_executor: Union[Executor, WorkerProcesses, None] = None,
                large_from: int = LARGE_MESSAGE, message_timeout: Optional[float] = DEFAULT_MESSAGE_TIMEOUT,
                allow: Sequence[IPNetwork] = (), charset: str = "", about: str = "") -> Stats:
    """Run listener and forwarder until `stop` is set: then stop accepting, finish in-flight messages and the
    delivery in hand, and checkpoint the queue. RuntimeError when it had to stop (its workers died). `about`
    (profile, stack, key id) is said in the line that says where it listens."""
    stop = stop or asyncio.Event()
    stats = Stats()
    store = AsyncStore(store_path)
    pruned = await store.prune_received(dedupe_window_s)
    listener = MllpListener(deidentify, store, executor, parallel, max_frame=max_frame, stats=stats,
                            on_fatal=stop.set, audit=audit, large_executor=large_executor, large_from=large_from,
                            message_timeout=message_timeout, allow=allow, charset=charset)
    forwarder = Forwarder(store, target, backoff_cap=backoff_cap, stats=stats)
    try:
        address = await listener.start(*listen)
    except OSError:
        await store.close()
        raise
    counts = await store.counts()
    log.info("listening on %s:%d%s, forwarding to %s; %d queued, %d parked, %d old control ids forgotten",
             address[0], address[1], f" ({about})" if about else "", target, counts["queued"], counts["parked"], pruned)
    if on_ready:
        on_ready(address)
    forwarding = asyncio.create_task(forwarder.run())
    last_stats = time.monotonic()
    try:
        while not stop.is_set():
            await _wait(stop, min(stats_every_s, 60.0))
            if forwarding.done():
                forwarding.result()  # surfaces a crash of the forwarder instead of queuing forever
            if time.monotonic() - last_stats >= stats_every_s:
                last_stats = time.monotonic()
                log.info("stats %s", stats.line())
                await store.prune_received(dedupe_window_s)
    finally:
        log.info("stopping: no new connections; finishing messages in hand")
        await listener.stop()
        await forwarder.stop()
        if not forwarding.done():
            await asyncio.wait_for(forwarding, 60.0)
        await target.close()
        counts = await store.counts()
        await store.close()
        log.info("stopped: %s; %d still queued, %d parked; %d queue commits%s", stats.line(), counts["queued"],
                 counts["parked"], store.enqueues.batches + (listener.audit.queue_commits if listener.audit else 0),
                 f", {listener.audit.commits.batches} audit commits" if listener.audit is not None else "")
    if listener.failure:
        raise RuntimeError(listener.failure)
    return stats
