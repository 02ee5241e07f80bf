"""HL7v2 files de-identified as they are written: memory for a window of segments, not for the whole message.

`write_file` writes exactly the bytes `encode(deidentify_file(text).text)` would. A message of up to `WINDOW`
segments is de-identified whole, as `deidentify_file` does. A longer one is read twice from the text: first
walked for its known identifiers (its rules record them; nothing is kept of its segments), then walked again a
window of segments at a time, each window's notes searched with all of the message's known identifiers,
written back and guarded. A window ends only where no run of OBX or NTE lines (one text for the stack) goes on.
The MSH is written last, when the whole message shows which character set its MSH-18 must name; the rest
waits in a temporary file.
"""
from __future__ import annotations

import io
import shutil
import tempfile
from typing import BinaryIO, Iterator, NamedTuple

from fhir_transforms.errors import RecordRefused
from fhir_transforms.hl7v2 import message as er7
from fhir_transforms.hl7v2.engine import (Finding, HL7Deidentifier, HL7Result, MessageWalk, _value_and_category, guard,
                                          refuse_leaks)
from text_deid.spans import KnownIdentifier

WINDOW = 2_000  # segments walked, searched and guarded at a time


class Written(NamedTuple):
    """What `write_file` wrote: its messages, and where the text stack found PHI (as `HL7Result.findings`)."""

    messages: int
    findings: tuple[Finding, ...]


def write_file(deid: HL7Deidentifier, text: str, out: BinaryIO, window: int = WINDOW) -> Written:
    """Every message and envelope segment of a file, de-identified, written to `out` in order as bytes.
    InputError, RecordRefused or LeakFound as `deidentify_file` (the same error for the same file); what was
    written before is then the caller's to discard (nothing of a refused file may be kept)."""
    items = er7.scan_text(text)
    found: list[list[Finding]] = [[] for _ in items]
    wrapped: set[KnownIdentifier] = set()
    envelopes: list[tuple[int, int, str]] = []  # (item, where its output goes in `sink`, the codec before it)
    with tempfile.TemporaryFile() as spool:
        # an envelope reads the known identifiers of every message of the file: the messages are written first
        # (into `spool` when there are envelopes), the envelopes then put in their places
        sink = spool if any(item.envelope for item in items) else out
        codec, n = "utf-8", 0  # an envelope segment is written in the character set of the message before it
        for i, item in enumerate(items):
            if item.envelope:
                envelopes.append((i, sink.tell(), codec))
                continue
            n += 1
            where = f"message {n}"
            if item.count <= window:
                message = er7.Message(list(er7.segments(text, item)), item.delimiters)
                written, guarded = deid._deidentified(message, where, found[i], where + "/")
                codec = er7.output_codec(written)
                sink.write(er7.encode(written))
            else:
                codec, guarded = _write_streamed(deid, text, item, where, where + "/", found[i], sink, window)
            wrapped.update(guarded)
        if envelopes:
            _put_envelopes(deid, text, items, envelopes, wrapped, found, spool, out)
    return Written(n, tuple(f for item_found in found for f in item_found))


def deidentify_message(deid: HL7Deidentifier, message: str, window: int = WINDOW) -> HL7Result:
    """`deid.deidentify_with_findings(message)`, a long message a window at a time: memory for its text and its
    output, not for its parse (the MLLP listener's lane for large messages)."""
    items = er7.scan_text(message)
    if len(items) != 1 or items[0].envelope or items[0].count <= window:
        return deid.deidentify_with_findings(message)  # and its errors: one message is expected
    out, findings = io.BytesIO(), []
    codec, _ = _write_streamed(deid, message, items[0], "message", "", findings, out, window)
    return HL7Result(out.getvalue().decode(codec), tuple(findings))


def _put_envelopes(deid: HL7Deidentifier, text: str, items: list[er7.Item], envelopes: list[tuple[int, int, str]],
                   wrapped: set[KnownIdentifier], found: list[list[Finding]], spool: BinaryIO, out: BinaryIO) -> None:
    """The envelope segments, read with every message's known identifiers, written to `out` in their places
    between the messages' output in `spool`."""
    linked = tuple(sorted(wrapped, key=_value_and_category))
    written = []
    for i, _, codec in envelopes:
        message = er7.Message(list(er7.segments(text, items[i])), items[i].delimiters, envelope=True)
        where = f"envelope {message.segments[0].sid}"
        written.append(er7.encode(deid._deidentified(message, where, found[i], where + "/", linked)[0], codec))
    spool.seek(0)
    done = 0
    for (_, offset, _), data in zip(envelopes, written):
        out.write(spool.read(offset - done))
        out.write(data)
        done = offset
    shutil.copyfileobj(spool, out)


def _head(text: str, item: er7.Item) -> er7.Message:
    """A long message's MSH and PID segments: what its walk reads before any other (the date offset's patient,
    birth dates over 89, the sender)."""
    head = [er7.Segment(line[:3], line.split(item.delimiters.field))
            for k, (line, _, _) in enumerate(er7.segment_lines(text, item.start, item.end))
            if k == 0 or line.startswith("PID")]
    return er7.Message(head, item.delimiters)


def _known(deid: HL7Deidentifier, text: str, item: er7.Item, window: int):
    """(the walk, its known identifiers for the text stack, for the leak guard) of a long message, read a window
    at a time; the walk's `runs` then say where a window may end."""
    walk = MessageWalk(deid, _head(text, item), set())
    for start, segs in _windows(er7.segments(text, item), window, {}):
        walk.run(segs, start)
        walk.next_window(keep_open_note=True)
    walk.next_window(keep_open_note=False)
    return walk, *walk.known_identifiers()


def _windows(segs: Iterator[er7.Segment], size: int, runs: dict[int, int]):
    """(number of its first segment, its segments) of windows of `size` segments or a few more: one ends
    only where no run of lines in `runs` (first segment → last) goes on past it."""
    window: list[er7.Segment] = []
    start, runs_to = 1, 0
    for k, seg in enumerate(segs, 1):
        if len(window) >= size and runs_to < k:
            yield start, window
            window, start = [], k
        window.append(seg)
        runs_to = max(runs_to, runs.get(k, 0))
    if window:
        yield start, window


def _write_streamed(deid: HL7Deidentifier, text: str, item: er7.Item, where: str, at: str, findings: list[Finding],
                    out: BinaryIO, window: int) -> tuple[str, tuple[KnownIdentifier, ...]]:
    """A long message written a window at a time (see the module); (the codec it is written in, the known
    identifiers its guard read)."""
    walk, known_ids, guarded = _known(deid, text, item, window)
    d = item.delimiters
    notes_found: list[Finding] = []
    terms_found: list[Finding] = []
    leaks: tuple[list, list] = ([], [])
    msh: er7.Segment | None = None
    codec = "utf-8"
    ascii_only, fits = True, True
    with tempfile.TemporaryFile("w+", encoding="utf-8", newline="") as rest:
        for start, segs in _windows(er7.segments(text, item), window, walk.runs):
            before = [s.sid for s in segs]
            walk.run(segs, start)
            found = deid.write_notes(walk, known_ids, guarded, where, at)
            notes_found += found[0]
            terms_found += found[1]
            walk.remove_kept_identifiers(guarded)
            walk.finish(stamp=start == 1, msh=segs[0])
            if start == 1:
                msh, codec = segs[0], er7.message_codec(segs[0], d)
            found_leaks = guard(er7.Message(segs, d), deid.profile, walk, guarded, start)
            leaks[0].extend(found_leaks[0])
            leaks[1].extend(found_leaks[1])
            lines = [d.field.join(s.parts) + "\r" for s in segs]
            try:
                er7.check_output(before, "".join(lines), "" if start == 1 else d.field)
            except RuntimeError as e:
                raise RecordRefused(f"{where}: {e} (a bug; nothing written)") from None
            for line in lines[1:] if start == 1 else lines:
                if not line.isascii():
                    ascii_only = False
                    fits = fits and er7.fits(line, codec)
                rest.write(line)
            walk.next_window(keep_open_note=False)
        refuse_leaks(where, leaks)
        findings += notes_found + terms_found
        head = d.field.join(msh.parts) + "\r"
        if not ascii_only or not head.isascii():  # as `fit_charset` does for a whole message
            if not (fits and er7.fits(head, codec) and msh.get(18).strip()):
                er7.label_utf8(msh)
                head = d.field.join(msh.parts) + "\r"
        codec = er7.output_codec(head)
        out.write(er7.encode(head))
        rest.seek(0)
        for line in rest:  # newline="": read back line by line, each ended by its "\r"
            out.write(er7.encode(line, codec))
    return codec, guarded
