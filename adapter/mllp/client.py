"""A small MLLP client (`deid-adapter mllp send`): each message framed, sent, and its ACK awaited before the next.

It reports ACK codes only: never a message's content, nor the control ids (MSH-10 may carry an MRN or a date).
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Iterator, Optional

from adapter.mllp.listener import READ_CHUNK, BadFrame, FrameDecoder, frame, read_ack

LINE_END = re.compile(rb"\r\n|\r|\n")
ENVELOPE = (b"FHS", b"BHS", b"BTS", b"FTS")  # batch segments: MLLP carries the messages one at a time


class NotSent(Exception):
    """Nothing could be sent to the peer (it does not resolve, refuses the connection, or is unreachable)."""


def messages_of(data: bytes) -> list[bytes]:
    """The messages of an ER7 file as MLLP carries them: each segment ended by CR (LF and CR LF line ends of a
    file too), a UTF-8 BOM, blank lines and batch envelope segments left out; a message starts at each MSH.
    ValueError when the file holds no message or something before its first MSH."""
    messages: list[list[bytes]] = []
    for segment in LINE_END.split(data.removeprefix(b"\xef\xbb\xbf")):
        if not segment.strip() or segment[:3] in ENVELOPE:
            continue
        if segment.startswith(b"MSH"):
            messages.append([])
        elif not messages:
            raise ValueError("does not start with an MSH segment")
        messages[-1].append(segment)
    if not messages:
        raise ValueError("holds no HL7v2 message")
    return [b"\r".join(segments) + b"\r" for segments in messages]


def control_id(message: bytes) -> str:
    """MSH-10 of a message (compared with the ACK's MSA-2, never shown)."""
    msh = message.split(b"\r", 1)[0]
    fields = msh.split(msh[3:4]) if len(msh) > 3 else []
    return fields[9].decode("latin-1").strip() if len(fields) > 9 else ""


@dataclass
class Answer:
    code: str  # MSA-1 (AA, AE, AR, CA, CE, CR), or "" when there was none
    problem: Optional[str] = None  # why there is no usable answer: no ACK in time, connection closed, ...


def send(messages: list[bytes], host: str, port: int, timeout: float = 30.0) -> Iterator[Answer]:
    """Send each message on one connection and yield its answer; after a message without one, the rest are not
    sent (a late ACK could be misread as the next message's). NotSent when no connection can be made."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror:
        raise NotSent(f"{host} does not resolve") from None
    except ConnectionRefusedError:
        raise NotSent(f"{host}:{port} refused the connection") from None
    except OSError as e:
        raise NotSent(f"{host}:{port} is unreachable ({e.strerror or type(e).__name__})") from None
    decoder = FrameDecoder()
    with sock:
        for message in messages:
            try:
                sock.sendall(frame(message))
                answer = _read_frame(sock, decoder)
            except socket.timeout:
                yield Answer("", f"no answer within {timeout:g} s")
                return
            except OSError as e:
                yield Answer("", f"connection lost ({e.strerror or type(e).__name__})")
                return
            if answer is None:
                yield Answer("", "the connection was closed without an answer")
                return
            if isinstance(answer, BadFrame):
                yield Answer("", "the answer was not an MLLP frame")
                return
            code, acked = read_ack(answer)
            if not code:
                yield Answer("", "the answer holds no MSA segment")
                return
            if acked != control_id(message):
                yield Answer(code, "the ACK answers another message (MSA-2 is not this message's MSH-10)")
                return
            yield Answer(code)


def _read_frame(sock: socket.socket, decoder: FrameDecoder):
    while True:
        data = sock.recv(READ_CHUNK)
        if not data:
            return None
        events = decoder.feed(data)
        if events:
            return events[0]
