"""MLLP framing, MSH-18 decoding and ACK building: pure functions, no sockets."""
from __future__ import annotations

import pytest

from adapter.mllp.listener import (DEFAULT_MAX_FRAME, BadFrame, FrameDecoder, NotAccepted, build_ack, decode_message, frame,
                                   parse_header, read_ack)

MSG = ("MSH|^~\\&|LAB|NORTH|EHR|SOUTH|20240101120000||ORU^R01^ORU_R01|CTRL-1|P|2.5.1\r"
       "PID|1||12345^^^H^MR||DOE^JOHN\r")


def feed_all(decoder: FrameDecoder, chunks) -> list:
    return [e for c in chunks for e in decoder.feed(c)]


def test_frame_split_at_every_byte_boundary():
    data = frame(MSG.encode()) + b"\r\n" + frame(b"MSH|^~\\&|X")
    for cut in range(len(data) + 1):
        events = feed_all(FrameDecoder(), [data[:cut], data[cut:]])
        assert events == [MSG.encode(), b"MSH|^~\\&|X"], cut


def test_one_byte_at_a_time_and_pipelined():
    data = b"".join(frame(f"MSH|^~\\&|{i}".encode()) for i in range(50))
    events = feed_all(FrameDecoder(), [data[i:i + 1] for i in range(len(data))])
    assert events == [f"MSH|^~\\&|{i}".encode() for i in range(50)]


@pytest.mark.parametrize("data, expected", [
    (b"garbage\x1c\r" + frame(b"MSH|ok"), ["frame without start block (0x0B)", b"MSH|ok"]),
    (b"\x0bMSH|cut" + frame(b"MSH|ok"), ["frame cut short by a new start block (0x0B)", b"MSH|ok"]),
    (b"junk" + frame(b"MSH|ok"), ["frame cut short by a new start block (0x0B)", b"MSH|ok"]),
    (b"\r\n \x00" + frame(b"MSH|ok") + b"\n", [b"MSH|ok"]),
])
def test_bad_frames_are_one_event_each_and_the_stream_resyncs(data, expected):
    events = FrameDecoder().feed(data)
    assert [e.reason if isinstance(e, BadFrame) else e for e in events] == expected


def test_oversize_frame_is_skipped_and_next_frame_read():
    decoder = FrameDecoder(max_size=1000)
    events = feed_all(decoder, [b"\x0b" + b"A" * 700, b"A" * 700, b"A" * 5000 + b"\x1c", b"\r" + frame(b"MSH|ok")])
    assert isinstance(events[0], BadFrame) and events[0].code == 104
    assert events[1:] == [b"MSH|ok"]
    assert len(decoder._buf) == 0


def test_large_frame_in_many_chunks():
    body = b"MSH|^~\\&|" + b"x" * 20_000_000
    data = frame(body)
    events = feed_all(FrameDecoder(max_size=32 * 1024 * 1024), [data[i:i + 65536] for i in range(0, len(data), 65536)])
    assert events == [body]


def test_the_default_limit_takes_a_document_message_and_names_itself_when_exceeded():
    """8 MiB: a message with a ~6 MB base64 PDF passes; a larger one is one BadFrame that names the limit and
    keeps the start of the message, so its NAK can carry the sender's MSH-10."""
    assert DEFAULT_MAX_FRAME == 8 * 1024 * 1024
    document = MSG.encode() + b"OBX|1|ED|PDF||^application^pdf^Base64^" + b"QUJD" * 2_000_000 + b"\r"
    assert FrameDecoder().feed(frame(document)) == [document]
    events = FrameDecoder().feed(frame(document + b"QUJD" * 200_000))
    assert len(events) == 1 and events[0].code == 104 and "8388608 bytes" in events[0].reason
    assert parse_header(events[0].head.decode("latin-1")).control_id == "CTRL-1"


@pytest.mark.parametrize("msh18, raw, codec", [
    ("", "DÖE".encode("utf-8"), "utf-8"),
    ("8859/1", "DÖE".encode("latin-1"), "latin-1"),
    ("UNICODE UTF-8", "DÖE 李".encode("utf-8"), "utf-8"),
    ("ASCII", "DÖE".encode("utf-8"), "utf-8"),          # mislabelled, as senders often do
    ("8859/5", "ИВАНОВ".encode("iso8859-5"), "iso8859-5"),
    ("WINDOWS-1252", "DÖE – Müller".encode("cp1252"), "cp1252"),
])
def test_charset_from_msh18(msh18, raw, codec):
    payload = b"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5||||||" + msh18.encode() + b"\rPID|1||||" + raw + b"\r"
    decoded = decode_message(payload)
    assert decoded.codec == codec
    assert decoded.text.encode(codec) == payload


@pytest.mark.parametrize("msh18, raw", [
    ("", "MÜLLER".encode("latin-1")),               # undeclared and not UTF-8: never guessed
    ("UNICODE UTF-8", "MÜLLER".encode("latin-1")),  # declared UTF-8, and it is not
])
def test_bytes_that_cannot_be_read_without_guessing_are_not_accepted(msh18, raw):
    payload = b"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5||||||" + msh18.encode() + b"\rPID|1||||" + raw + b"\r"
    with pytest.raises(NotAccepted) as e:
        decode_message(payload)
    assert e.value.code == 103 and "LLER" not in str(e.value)


def test_unknown_charset_and_non_hl7_are_not_accepted():
    with pytest.raises(NotAccepted) as e:
        decode_message(b"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5||||||EBCDIC\r")
    assert e.value.code == 103
    with pytest.raises(NotAccepted):
        decode_message(b"PID|1||12345\r")


def test_ack_swaps_routing_and_echoes_control_id():
    ack = build_ack(parse_header(MSG), "AA")
    msh, msa = ack.rstrip("\r").split("\r")
    f = msh.split("|")
    assert f[2:6] == ["EHR", "SOUTH", "LAB", "NORTH"]
    assert f[8] == "ACK^R01^ACK" and f[10:12] == ["P", "2.5.1"]
    assert msa == "MSA|AA|CTRL-1"
    assert read_ack(ack.encode()) == ("AA", "CTRL-1")


def test_ack_for_v23_has_no_structure_and_err_in_old_layout():
    msg = MSG.replace("ORU^R01^ORU_R01", "ADT^A01").replace("2.5.1", "2.3")
    ack = build_ack(parse_header(msg), "AE", "PID-5: bad | value ^ here", 102)
    msh, msa, err = ack.rstrip("\r").split("\r")
    assert msh.split("|")[8] == "ACK^A01"
    assert msa.startswith("MSA|AE|CTRL-1|PID-5: bad \\F\\ value \\S\\ here")
    assert err == "ERR|^^^102&Data type error&HL70357"


def test_nak_without_header_and_err_never_quotes_message():
    ack = build_ack(None, "AR", "frame without start block (0x0B)", 100)
    assert "MSA|AR|\r" in ack and "ERR|||100^Segment sequence error^HL70357|E||||frame without" in ack
    assert "DOE" not in build_ack(parse_header(MSG), "AR", "refused", 207)


def test_custom_delimiters_and_msh18_are_kept_in_the_ack():
    msg = "MSH#*~\\&#A#B#C#D#2024##ADT*A04#X9#P#2.4######8859/1\rPID#1\r"
    ack = build_ack(parse_header(msg), "AA")
    f = ack.split("\r")[0].split("#")
    assert f[1] == "*~\\&" and f[8] == "ACK*A04*ACK" and f[17] == "8859/1"
    assert ack.split("\r")[1] == "MSA#AA#X9"
