"""ER7 (pipe-and-hat) HL7v2 text without loss: segments, fields, repetitions, components, escapes.

Our own tokenizer does the rewriting (python-hl7 strips whitespace at the end of a message and does not
escape what it assigns; hl7apy drops segments it does not expect). Every output is re-split on every line
break a receiver may honour (`check_output`): same segment ids, in the same order. The tests re-read every
sample output with python-hl7 and hl7apy as well.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from functools import lru_cache

from fhir_transforms.errors import InputError

SEGMENT_ID_RE = re.compile(r"^[A-Z][A-Z0-9]{2}$")
HEADERS = ("MSH", "BHS", "FHS")  # segments that carry their own delimiters in fields 1 and 2
ENVELOPE = ("FHS", "BHS", "BTS", "FTS")
HEX_RE = re.compile(r"^[0-9A-Fa-f]+$")
LINE_BREAK_RE = re.compile(r"\r\n|\r|\n")  # what ends a segment, for us and for any receiver
# HL7 table 0211 (MSH-18) → Python codec, with the Windows code page senders declare although 0211 lacks it.
# UTF-16/32 cannot be carried in byte-oriented ER7 files or MLLP frames.
CHARSETS = {
    "ASCII": "ascii", "ISO IR6": "ascii",
    "8859/1": "latin-1", "ISO IR100": "latin-1", "8859/2": "iso8859-2", "ISO IR101": "iso8859-2",
    "8859/3": "iso8859-3", "ISO IR109": "iso8859-3", "8859/4": "iso8859-4", "ISO IR110": "iso8859-4",
    "8859/5": "iso8859-5", "ISO IR144": "iso8859-5", "8859/6": "iso8859-6", "ISO IR127": "iso8859-6",
    "8859/7": "iso8859-7", "ISO IR126": "iso8859-7", "8859/8": "iso8859-8", "ISO IR138": "iso8859-8",
    "8859/9": "iso8859-9", "ISO IR148": "iso8859-9", "8859/15": "iso8859-15",
    "UNICODE UTF-8": "utf-8", "UNICODE": "utf-8", "UTF-8": "utf-8",
    "GB 18030-2000": "gb18030", "KS X 1001": "euc_kr", "BIG-5": "big5", "ISO IR87": "iso2022_jp",
    "WINDOWS-1252": "cp1252", "CP1252": "cp1252",
}
# `8859/1` as senders also spell it: ISO-8859-1, ISO_8859-1, 8859-1, and `8859` alone (always part 1 in practice)
ISO_8859_RE = re.compile(r"(?:ISO)?[-_ ]?8859(?:[-_/ ](\d{1,2}))?")


def charset_codec(name: str) -> str | None:
    """The codec of a character set's name: an HL7 table 0211 name, or an unambiguous spelling of one (`8859/1`,
    `ISO-8859-1`, `latin-1`, `UTF-8`, `8859`: Python's codec names and aliases of the 0211 charsets); else None."""
    label = name.strip().upper()
    if label in CHARSETS:
        return CHARSETS[label]
    m = ISO_8859_RE.fullmatch(label)
    if m:
        return CHARSETS.get(f"8859/{m.group(1) or 1}")
    try:
        return _CODECS.get(codecs.lookup(label).name)
    except LookupError:
        return None


_CODECS = {codecs.lookup(c).name: c for c in CHARSETS.values()}  # Python's name of each codec → ours


@dataclass(frozen=True)
class Delimiters:
    """MSH-1 and MSH-2: field, component, repetition, escape and subcomponent separators."""

    field: str = "|"
    component: str = "^"
    repetition: str = "~"
    escape: str = "\\"
    subcomponent: str = "&"

    @classmethod
    def from_header(cls, segment: str) -> Delimiters:
        if len(segment) < 8 or not SEGMENT_ID_RE.match(segment[:3]):
            raise InputError("header segment too short to hold its delimiters (MSH-1, MSH-2)")
        fs = segment[3]
        enc = segment[4:].split(fs, 1)[0]
        if len(enc) < 3 or fs.isalnum() or any(c.isalnum() for c in enc) or len(set(fs + enc[:4])) != len(fs + enc[:4]):
            raise InputError(f"{segment[:3]}-2: encoding characters missing or invalid")
        comp, rep, esc = enc[0], enc[1], enc[2]
        sub = enc[3] if len(enc) > 3 else "&"
        return cls(fs, comp, rep, esc, sub)

    @property
    def separators(self) -> str:
        return self.field + self.component + self.repetition + self.subcomponent


def decode(raw: str, d: Delimiters) -> tuple[str, list[tuple[int, int, str]]]:
    """Unescape a leaf value: the text, and (start, end, raw) for each escape sequence in text offsets.

    `\\.br\\`, `\\.sp\\` and `\\.ce\\` become a line break, an indent or a skip (`\\.in\\`, `\\.ti\\`, `\\.sk\\`) a
    space; `\\Xhh\\` its bytes (UTF-8, else Latin-1); other formatting commands (`\\H\\`, `\\.fi\\`, ...) and unknown
    sequences become nothing. Every escape is written back as it was.
    """
    esc = d.escape
    if esc not in raw:
        return raw, []
    out, escapes, i = [], [], 0
    pos = 0  # length of the text so far
    while i < len(raw):
        j = raw.find(esc, i)
        k = raw.find(esc, j + 1) if j >= 0 else -1
        if j < 0 or k < 0:
            out.append(raw[i:])
            break
        out.append(raw[i:j])
        pos += j - i
        seq = raw[j + 1:k]
        text = _unescape_one(seq, d)
        escapes.append((pos, pos + len(text), raw[j:k + 1]))
        out.append(text)
        pos += len(text)
        i = k + 1
    return "".join(out), escapes


FORMATTING_BREAK_RE = re.compile(r"\.(?:br|sp|ce|in|ti|sk)[+-]?\d*")


def _unescape_one(seq: str, d: Delimiters) -> str:
    simple = {"F": d.field, "S": d.component, "T": d.subcomponent, "R": d.repetition, "E": d.escape}
    if seq in simple:
        return simple[seq]
    if FORMATTING_BREAK_RE.fullmatch(seq):  # a line break, a blank line, an indent, a skip: a word break
        return " " if seq[1:3] in ("in", "ti", "sk") else "\n"
    if seq[:1] == "X" and len(seq) > 1 and len(seq) % 2 == 1 and HEX_RE.match(seq[1:]):
        data = bytes.fromhex(seq[1:])
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data.decode("latin-1")
    return ""


@lru_cache(maxsize=64)
def _escapes(d: Delimiters) -> tuple[re.Pattern, dict[int, str]]:
    e = d.escape
    table = {d.escape: f"{e}E{e}", d.field: f"{e}F{e}", d.component: f"{e}S{e}", d.subcomponent: f"{e}T{e}",
             d.repetition: f"{e}R{e}", "\r": f"{e}X0D{e}", "\n": f"{e}.br{e}"}
    return re.compile(f"[{re.escape(''.join(table))}]"), str.maketrans(table)


def escape(text: str, d: Delimiters) -> str:
    """Escape a new value for writing: delimiters as \\F\\ \\S\\ \\T\\ \\R\\ \\E\\, line breaks as \\.br\\."""
    special, table = _escapes(d)
    return text.translate(table) if special.search(text) else text  # most values hold none: translate is slow


def to_leaf_separators(raw: str, d: Delimiters, separator: str) -> str:
    """`raw` with its repetition, component and subcomponent separators turned into `separator` (three
    str.replace calls: many times faster than str.translate)."""
    return raw.replace(d.repetition, separator).replace(d.component, separator).replace(d.subcomponent, separator)


def rewrite(raw: str, d: Delimiters, spans: list[tuple[int, int, str]]) -> str:
    """Replace disjoint (start, end, replacement) ranges of the decoded text; every other character and
    escape sequence is written back exactly as it was."""
    if not spans:
        return raw
    text, escapes = decode(raw, d)
    units: list[tuple[int, int, str]] = []  # (start, end, raw) in decoded offsets
    pos = 0
    for start, end, seq in escapes:
        units.extend((i, i + 1, text[i]) for i in range(pos, start))
        units.append((start, end, seq))
        pos = end
    units.extend((i, i + 1, text[i]) for i in range(pos, len(text)))
    spans = sorted(spans)
    out, si = [], 0
    for start, end, piece in units:
        while si < len(spans) and spans[si][0] <= start:
            out.append(escape(spans[si][2], d))
            si += 1
        a, b = (spans[si - 1][0], spans[si - 1][1]) if si else (0, 0)
        covered = (start < b and a < end) if start < end else (a < start < b)
        if not covered:
            out.append(piece)
    out.extend(escape(s[2], d) for s in spans[si:])
    return "".join(out)


Field = list  # repetitions → components → subcomponents (lists of raw strings)


@dataclass
class Segment:
    """One segment as raw field strings; `field(n)` follows HL7 numbering (MSH-1 is the field separator)."""

    sid: str
    parts: list[str]  # parts[0] is the segment id; for MSH/BHS/FHS parts[1] is MSH-2

    def index(self, n: int) -> int:
        return n - 1 if self.sid in HEADERS else n

    def numbers(self) -> range:
        """Field numbers present, excluding the delimiter fields of header segments."""
        return range(3, len(self.parts) + 1) if self.sid in HEADERS else range(1, len(self.parts))

    def get(self, n: int) -> str:
        i = self.index(n)
        return self.parts[i] if 0 < i < len(self.parts) else ""

    def set(self, n: int, raw: str) -> None:
        self.parts[self.index(n)] = raw


def split_field(raw: str, d: Delimiters) -> Field:
    return [[c.split(d.subcomponent) for c in r.split(d.component)] for r in raw.split(d.repetition)]


def join_field(f: Field, d: Delimiters) -> str:
    sub, comp = d.subcomponent, d.component
    return d.repetition.join([comp.join([sub.join(c) for c in r]) for r in f])  # lists: join reads them faster


@dataclass
class Message:
    """One message (MSH first) or one envelope segment (FHS/BHS/BTS/FTS) with the delimiters it uses."""

    segments: list[Segment]
    delimiters: Delimiters
    envelope: bool = False

    def ids(self) -> list[str]:
        return [s.sid for s in self.segments]

    def first(self, sid: str) -> Segment | None:
        return next((s for s in self.segments if s.sid == sid), None)

    def to_er7(self) -> str:
        fs = self.delimiters.field
        return "".join(fs.join(s.parts) + "\r" for s in self.segments)


class CharsetError(InputError):
    """Bytes that cannot be read as text without guessing: an unknown MSH-18, or bytes that fit neither UTF-8
    nor the charset MSH-18 declares (or MSH-18 declares none)."""


@dataclass(frozen=True)
class Decoded:
    text: str
    codec: str  # how the bytes were read, and how an answer to them is written


def msh18(data: bytes) -> str:
    """MSH-18's first repetition, upper-case, read from the bytes before they are decoded ('' if none)."""
    m = re.search(rb"MSH(.)(.)?(.)?", data)
    if not m:
        return ""
    msh = data[m.start():].split(b"\r", 1)[0].split(b"\n", 1)[0].split(m.group(1))
    return msh[17].split(m.group(3) or b"~")[0].decode("ascii", "replace").strip().upper() if len(msh) > 17 else ""


def read_bytes(data: bytes, default: str = "") -> Decoded:
    """The one way HL7v2 bytes become text, for files, MLLP frames and HTTP bodies alike. A BOM is dropped.
    Valid UTF-8 is read as UTF-8 (senders often declare ASCII or 8859/1 and send UTF-8); other bytes are read
    in the charset MSH-18 declares, or where MSH-18 is empty in `default` (a channel's charset: a codec of
    `charset_codec`). Anything else is a CharsetError: characters are never replaced or guessed, because a
    garbled name is one the detectors cannot find."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    label = msh18(data)
    codec = charset_codec(label) if label else default or None
    if label and codec is None:
        # not repeated: an answer (an ACK's ERR-8, an HTTP diagnostic) quotes nothing a sender wrote
        raise CharsetError("MSH-18: not a character set of HL7 table 0211 or one of its unambiguous spellings")
    try:
        return Decoded(data.decode("utf-8"), "utf-8")
    except UnicodeDecodeError:
        pass
    if codec in (None, "utf-8", "ascii"):
        raise CharsetError("not UTF-8 text, and MSH-18 declares no other character set (--charset names the "
                           "channel's)" if not label else
                           f"the bytes are not valid in the character set MSH-18 declares ({label})")
    try:
        return Decoded(data.decode(codec), codec)
    except UnicodeDecodeError:
        raise CharsetError(f"the bytes are not valid in the character set MSH-18 declares ({label})" if label else
                           f"the bytes are not valid in the channel's character set ({codec})") from None


def decode_bytes(data: bytes, default: str = "") -> str:
    """The text of HL7v2 bytes (see `read_bytes`)."""
    return read_bytes(data, default).text


def _lines(text: str) -> list[str]:
    """`text` split on CR, LF and CR LF (str.split where it holds no LF, as our own output: many times faster)."""
    return text.split("\r") if "\n" not in text else LINE_BREAK_RE.split(text)


def parse_segment(line: str, d: Delimiters, where: str) -> Segment:
    _check_segment(line, d, where)
    return Segment(line[:3], line.split(d.field))


def _check_segment(line: str, d: Delimiters, where: str) -> None:
    if not SEGMENT_ID_RE.match(line[:3]) or (len(line) > 3 and line[3] != d.field):
        raise InputError(f"{where}: not an HL7v2 segment (expected a three-character segment id)")


@dataclass(frozen=True)
class Item:
    """Where one message, or one envelope segment, lies in a file's text (`scan_text`); `segments` reads it."""

    start: int
    end: int
    delimiters: Delimiters
    envelope: bool
    count: int  # its segments


SEGMENT_LINE_RE = re.compile(r"[^\r\n]+")


def scan_text(text: str) -> list[Item]:
    """Every message and envelope segment of a file, in order, as places in `text` (`segments` parses them one
    at a time, so a file read this way holds a segment at a time: `stream.py`). InputError for anything that
    is not ER7."""
    items: list[Item] = []
    message: list = []  # the message being read: [start, end, delimiters, segments]
    n = 0
    for line, start, end in segment_lines(text, 0, len(text)):
        n += 1
        sid = line[:3]
        if sid in HEADERS or sid in ENVELOPE:
            if message:
                items.append(Item(message[0], message[1], message[2], False, message[3]))
            if sid in HEADERS:
                d = Delimiters.from_header(line)
            else:  # a trailer: in the delimiters of what it closes
                d = message[2] if message else (items[-1].delimiters if items else Delimiters())
            _check_segment(line, d, f"segment {n}")
            message = [start, end, d, 1] if sid == "MSH" else []
            if not message:
                items.append(Item(start, end, d, True, 1))
            continue
        if not message:
            raise InputError(f"segment {n} ({sid if SEGMENT_ID_RE.match(sid) else '?'}) is outside a message: "
                             "every message must start with MSH")
        _check_segment(line, message[2], f"segment {n}")
        message[1] = end
        message[3] += 1
    if message:
        items.append(Item(message[0], message[1], message[2], False, message[3]))
    if not n:
        raise InputError("no HL7v2 segments")
    if not any(not m.envelope for m in items):
        raise InputError("no MSH segment: not an HL7v2 message")
    return items


def segments(text: str, item: Item):
    """The segments of a scanned item, parsed one at a time."""
    for line, _, _ in segment_lines(text, item.start, item.end):
        yield Segment(line[:3], line.split(item.delimiters.field))


def segment_lines(text: str, start: int, end: int):
    """(line, start, end) of each segment between `start` and `end`: lines ended by CR, LF or CR LF, a BOM at
    the text's start dropped, blank lines skipped."""
    if start == 0:
        while start < end and text[start] == "\ufeff":
            start += 1
    if "\n" in text:
        for m in SEGMENT_LINE_RE.finditer(text, start, end):
            line = m.group()
            if line.strip():
                yield line, m.start(), m.end()
        return
    find = text.find  # segments ended by CR alone, as our own output: a find per line is several times faster
    while start < end:
        stop = find("\r", start, end)
        stop = end if stop < 0 else stop
        line = text[start:stop]
        if line.strip():
            yield line, start, stop
        start = stop + 1


def parse_text(text: str) -> list[Message]:
    """Every message and envelope segment of a file, in order. InputError for anything that is not ER7."""
    return [Message(list(segments(text, item)), item.delimiters, item.envelope) for item in scan_text(text)]


def parse_message(text: str) -> Message:
    """Exactly one message (no envelope)."""
    items = parse_text(text)
    if len(items) != 1 or items[0].envelope:
        raise InputError(f"expected one HL7v2 message, found {sum(not m.envelope for m in items)} "
                         f"and {sum(m.envelope for m in items)} envelope segment(s)")
    return items[0]


def check_output(before: list[str], er7: str, field: str = "") -> None:
    """The output, split on CR, LF and CR LF as any receiver might, keeps the input's segment ids in count and order.

    This is what re-reading with python-hl7 checked (it validates nothing else), without building its tree.
    `field`: the field separator of segments that do not start a message (a streamed message's later windows).
    """
    lines = [s for s in _lines(er7) if s]
    if not field and (not lines or not lines[0].startswith(HEADERS)):
        raise RuntimeError("output does not start with a header segment")
    fs = field or lines[0][3]
    if [line.split(fs, 1)[0] for line in lines] != before:
        raise RuntimeError("output segment sequence differs from the input's")


UTF8_LABEL = "UNICODE UTF-8"


def message_codec(msh: Segment, d: Delimiters) -> str:
    """The codec MSH-18 (first repetition) names; UTF-8 when it names none or one this module does not know."""
    label = msh.get(18).split(d.repetition)[0].strip().upper() if msh.sid == "MSH" else ""
    return (charset_codec(label) if label else None) or "utf-8"


def fit_charset(message: Message) -> str:
    """Make MSH-18 name a character set that holds the output: kept when every character fits the one it
    declares (receivers set up for that sender read it as before); else rewritten to UNICODE UTF-8, which
    holds any text (an ASCII or 8859/1 label over characters outside it, or no label over non-ASCII).
    Returns the message's ER7 as fitted (`to_er7`)."""
    msh = message.segments[0]
    text = message.to_er7()
    if msh.sid != "MSH" or text.isascii():
        return text
    if fits(text, message_codec(msh, message.delimiters)) and msh.get(18).strip():
        return text
    label_utf8(msh)
    return message.to_er7()


def fits(text: str, codec: str) -> bool:
    """Whether every character of `text` can be written in `codec`."""
    try:
        text.encode(codec)
    except UnicodeEncodeError:
        return False
    return True


def label_utf8(msh: Segment) -> None:
    """MSH-18 set to UNICODE UTF-8, the character set that holds any text."""
    while len(msh.parts) <= msh.index(18):
        msh.parts.append("")
    msh.set(18, UTF8_LABEL)


def encode(text: str, codec: str = "utf-8") -> bytes:
    """ER7 output as bytes: each message in the character set its MSH-18 names (after `fit_charset`),
    envelope segments in the one of the message before them (else `codec`: the file's text written so far
    ended in a message that names it). InputError where a character does
    not fit (the CLI counts it as bad input, MLLP answers AE, HTTP 400): nothing is written with a replacement."""
    if text.isascii():  # the same bytes in every charset of CHARSETS (all are ASCII-compatible)
        return text.encode("ascii")
    try:
        return b"\r".join(line.encode(codec) for line, codec in _line_codecs(text, codec))
    except UnicodeEncodeError:
        raise InputError("the de-identified message cannot be written in its MSH-18 character set") from None


def write_message(message: Message) -> bytes:
    """A message the caller built (an ACK) as bytes that agree with its MSH-18: `fit_charset`, then `encode`."""
    return encode(fit_charset(message))  # keeps an ASCII message as it is


def _line_codecs(text: str, codec: str = "utf-8"):
    for line in text.split("\r"):
        if line.startswith("MSH") and len(line) >= 8:
            codec = output_codec(line)
        yield line, codec


# Python codec → the name HTTP's Content-Type charset uses (IANA).
IANA_NAMES = {"ascii": "us-ascii", "latin-1": "iso-8859-1", "utf-8": "utf-8", "cp1252": "windows-1252",
              "gb18030": "gb18030", "euc_kr": "euc-kr", "big5": "big5", "iso2022_jp": "iso-2022-jp",
              **{f"iso8859-{n}": f"iso-8859-{n}" for n in (2, 3, 4, 5, 6, 7, 8, 9, 15)}}


def content_charset(text: str) -> str:
    """The IANA name of the charset `encode` writes a text in, for a Content-Type: the one of its non-ASCII lines
    (ASCII reads the same in all of them), else its first message's; '' when messages with non-ASCII text use
    different ones (no single label is true then; each MSH-18 still is)."""
    lines = list(_line_codecs(text))
    codecs = ({codec for line, codec in lines if not line.isascii()}
              or {next((codec for line, codec in lines if line.startswith("MSH")), "utf-8")})
    return IANA_NAMES[codecs.pop()] if len(codecs) == 1 else ""


def output_codec(text: str) -> str:
    """The codec `encode` writes a text's first segment in when it is an MSH: the one its MSH-18 names, else UTF-8."""
    line = text.split("\r", 1)[0]
    if not (line.startswith("MSH") and len(line) >= 8):
        return "utf-8"
    d = Delimiters.from_header(line)
    return message_codec(Segment("MSH", line.split(d.field)), d)
