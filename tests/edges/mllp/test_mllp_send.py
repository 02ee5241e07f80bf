"""`deid-adapter mllp send` against a real `deid-adapter mllp` listener that forwards to a test receiver; the
listener's start line, its port-in-use and unresolvable-forward messages."""
from __future__ import annotations

import os
import re
import socket
import socketserver
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

EXAMPLES = sorted((ROOT / "examples" / "hl7").glob("*.hl7"))
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+) \(profile (\S+), stack (\S+), key (k-[0-9a-f]+)\)")
# values of the example messages that no output may hold
PHI = ["Brennan", "Marguerite", "MRN4471093", "123-45-6789", "Larkspur", "555-0143", "19480922", "Castellano",
       "MRN5580214", "Okafor"]


class Receiver(socketserver.ThreadingTCPServer):
    """A downstream MLLP peer: records each message and answers it `code` (MSA-2 = its MSH-10)."""

    daemon_threads = allow_reuse_address = True

    def __init__(self, code: str = "AA", port: int = 0):
        self.code, self.messages = code, []
        super().__init__(("127.0.0.1", port), _ReceiverHandler)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _ReceiverHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        buffer = b""
        while data := self.request.recv(65536):
            buffer += data
            while b"\x1c\r" in buffer:
                block, buffer = buffer.split(b"\x1c\r", 1)
                message = block.lstrip(b"\x0b")
                self.server.messages.append(message)
                msh = message.split(b"\r", 1)[0].split(b"|")
                ack = f"MSH|^~\\&|RCV|RCV|SND|SND|20250101||ACK|A{len(self.server.messages)}|P|2.5.1\rMSA|" \
                      f"{self.server.code}|{msh[9].decode()}\r"
                self.request.sendall(b"\x0b" + ack.encode() + b"\x1c\r")


@contextmanager
def receiver(code: str = "AA", port: int = 0):
    server = Receiver(code, port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def listener(tmp_path: Path, forward: str, key_file: Path, listen: str = "127.0.0.1:0"):
    """`deid-adapter mllp` on a port of the system's choosing; yields (its HOST:PORT, its process, its log)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    log = tmp_path / "listener.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "adapter.cli", "mllp", "--listen", listen, "--forward", forward, "--store",
             str(tmp_path / "queue.sqlite"), "--key-file", str(key_file), "--stack", "patterns", "--workers", "1",
             "--retry-max-delay", "0.5", "--audit", "off"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (found := LISTENING.search(log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        yield f"127.0.0.1:{found.group(1)}", proc, log
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def send(*args: str) -> subprocess.CompletedProcess:
    return run_cli("mllp", "send", *args)


def test_send_gets_aa_for_each_example_and_the_de_identified_copies_are_forwarded(tmp_path, test_key_file):
    with receiver() as downstream, listener(tmp_path, downstream.address, test_key_file) as (address, proc, log):
        done = send(*map(str, EXAMPLES), "--to", address)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [f"{p}: AA" for p in EXAMPLES]
        assert done.stderr.strip() == f"{len(EXAMPLES)} message(s) sent to {address}: {len(EXAMPLES)} AA"
        deadline = time.monotonic() + 30
        while len(downstream.messages) < len(EXAMPLES):
            assert time.monotonic() < deadline, "not forwarded"
            time.sleep(0.05)
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    forwarded = b"\n".join(downstream.messages).decode()
    assert [m.split(b"|")[8].split(b"^")[0] for m in downstream.messages] == [b"ADT", b"ADT", b"ORU"]
    assert not [v for v in PHI if v in forwarded]
    assert not [m for m in downstream.messages if b"\n" in m]  # the files' LF line ends went as CR
    started, stopped = LISTENING.search(log.read_text()), log.read_text().splitlines()[-1]
    assert started.groups()[1:] == ("safe-harbor", "patterns", "k-c271300f3a22")  # the test key's id
    assert "received=3 accepted=3" in stopped and "delivered=3" in stopped
    assert not [v for v in PHI + ["MSG00001"] if v in done.stdout + done.stderr + log.read_text()]


def test_send_reads_lf_crlf_and_several_messages_a_file(tmp_path, test_key_file):
    text = EXAMPLES[0].read_text()
    second = text.replace("MSG00001", "MSG00009")
    batch = tmp_path / "batch.hl7"
    batch.write_bytes(("\ufeff" + text + "\n" + second).replace("\n", "\r\n").encode())
    with receiver() as downstream:
        done = send(str(batch), "--to", downstream.address)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{batch} #1: AA", f"{batch} #2: AA"]
    assert [m.count(b"\r") for m in downstream.messages] == [text.count("\n")] * 2
    assert not [m for m in downstream.messages if b"\n" in m or m.startswith(b"\xef")]


@pytest.mark.parametrize("code", ["AE", "AR"])
def test_a_message_answered_ae_or_ar_is_exit_1(tmp_path, code):
    with receiver(code) as downstream:
        done = send(str(EXAMPLES[0]), "--to", downstream.address)
    assert done.returncode == 1 and done.stdout.strip() == f"{EXAMPLES[0]}: {code}"
    assert "Brennan" not in done.stdout + done.stderr


def test_no_answer_is_exit_1_and_the_rest_is_not_sent(tmp_path):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        done = send(*map(str, EXAMPLES), "--to", f"127.0.0.1:{silent.getsockname()[1]}", "--timeout", "0.5")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [f"{EXAMPLES[0]}: - (no answer within 0.5 s)"]
    assert done.stderr.strip().endswith(f"1 unanswered; {len(EXAMPLES) - 1} not sent")


def test_bad_peers_and_files_are_named(tmp_path):
    unresolvable = send(str(EXAMPLES[0]), "--to", "no-such-host.invalid:2575")
    assert unresolvable.returncode == 2 and "no-such-host.invalid does not resolve" in unresolvable.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    refused = send(str(EXAMPLES[0]), "--to", f"127.0.0.1:{closed_port}")
    assert refused.returncode == 1 and "refused the connection" in refused.stderr
    (tmp_path / "note.txt").write_text("Brennan, Marguerite: not HL7\n")
    not_hl7 = send(str(tmp_path / "note.txt"), "--to", "127.0.0.1:2575")
    assert not_hl7.returncode == 2 and "does not start with an MSH segment" in not_hl7.stderr
    assert "Brennan" not in not_hl7.stderr


def test_a_port_in_use_is_exit_2_naming_it(tmp_path, test_key_file):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("mllp", "--listen", f"127.0.0.1:{port}", "--forward", str(tmp_path / "out"), "--store",
                       str(tmp_path / "q.sqlite"), "--workers", "0", "--audit", "off", key_file=test_key_file)
    assert proc.returncode == 2 and f"port {port} is in use" in proc.stderr, proc.stderr


def test_the_forwarder_names_a_host_that_does_not_resolve(tmp_path, test_key_file):
    with listener(tmp_path, "no-such-host.invalid:2575", test_key_file) as (address, proc, log):
        assert send(str(EXAMPLES[0]), "--to", address).returncode == 0  # queued durably, then AA
        deadline = time.monotonic() + 30
        while "does not resolve" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
    assert "no-such-host.invalid:2575: the host no-such-host.invalid does not resolve" in log.read_text()
    assert "unavailable (no answer)" not in log.read_text()
