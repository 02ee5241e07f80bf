"""Text as a reader sees it in markup (XHTML, HTML, XML, RTF): inline markup joined, block markup as a
break, character references decoded. It is built from pieces of the source, so that a span found in it
maps back to what to rewrite there; detection and the leak guard read the same text."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from fhir_transforms.errors import InputError
from text_deid.spans import Span

# everything else (span, b, a, font, ...) is inline: it joins the text either side without a separator
BLOCK_ELEMENTS = frozenset(
    "address article aside blockquote body br caption col colgroup dd div dl dt figcaption figure footer h1 h2 h3 "
    "h4 h5 h6 head header hr html img li main nav ol p pre section table tbody td tfoot th thead title tr ul".split())
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
RTF_TYPES = frozenset({"text/rtf", "application/rtf"})
XML_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}


@dataclass(frozen=True)
class Piece:
    """`text` as rendered, from `key`'s source [start:end]; a decoded reference is longer there than rendered
    and is masked whole. A piece without a key is markup: a break ("\\n") or an inline tag ("")."""

    key: Hashable | None
    start: int
    end: int
    text: str


BREAK = Piece(None, 0, 0, "\n")
JOIN = Piece(None, 0, 0, "")  # an inline tag: nothing where it stands, though the writer may have meant a space


def readings(pieces: Sequence[Piece]) -> list[tuple[str, list[int]]]:
    """The rendered text with each piece's offset in it; and where an inline tag stands between two letters
    or digits ("Zyx<span>wvut"), the same text with a space there as well: either may be what is meant."""
    joined = _render(pieces, "")
    text, offsets = joined
    if not any(0 < at < len(text) and text[at - 1].isalnum() and text[at].isalnum()
               for p, at in zip(pieces, offsets) if p is JOIN):
        return [joined]
    return [joined, _render(pieces, " ")]


def texts(pieces: Sequence[Piece]) -> list[str]:
    """The readings' texts alone (what the leak guard reads)."""
    return [text for text, _ in readings(pieces)]


def edits(pieces: Sequence[Piece], read: list[tuple[str, list[int]]], found: Sequence[Sequence[Span]]) -> dict:
    """Key → (start, end, replacement) in its source: for each span of each reading, the first piece it covers
    takes its tag and the rest of what it covers is deleted."""
    out: dict = {}
    for (_, offsets), spans in zip(read, found):
        for span in spans:
            tagged = False
            for piece, at in zip(pieces, offsets):
                if piece.key is None or at >= span.end or at + len(piece.text) <= span.start:
                    continue
                if piece.end - piece.start == len(piece.text):  # as in the source: mask only the covered part
                    start = piece.start + max(span.start - at, 0)
                    end = piece.start + min(span.end - at, len(piece.text))
                else:
                    start, end = piece.start, piece.end
                out.setdefault(piece.key, []).append((start, end, "" if tagged else f"[{span.category}]"))
                tagged = True
    return out


def apply(source: str, changes: Iterable[tuple[int, int, str]]) -> str:
    """`source` with the (possibly overlapping) changes made; overlapping changes are merged, the first tag kept."""
    merged: list[list] = []
    for start, end, repl in sorted(changes):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
            merged[-1][2] = merged[-1][2] or repl
        else:
            merged.append([start, end, repl])
    out, pos = [], 0
    for start, end, repl in merged:
        out += [source[pos:start], repl]
        pos = end
    out.append(source[pos:])
    return "".join(out)


MARKUP_RE = re.compile(r"<!--.*?(?:-->|$)|<!\[CDATA\[.*?(?:\]\]>|$)|<[!?][^>]*>?|</?([A-Za-z][\w:.-]*)([^>]*)>?", re.S)
ATTRIBUTE_RE = re.compile(r"""[^\s=/>]+\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""")
REFERENCE_RE = re.compile(r"&(#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);?")


def content_pieces(content_type: str, text: str, strict: bool = True) -> list[Piece]:
    """Pieces of a decoded attachment by its content type: HTML, XML, RTF, or plain text as it is."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in HTML_TYPES:
        return markup_pieces(text, xml=False, strict=strict)
    if media.endswith("/xml") or media.endswith("+xml"):
        return markup_pieces(text, xml=True, strict=strict)
    if media in RTF_TYPES:
        return rtf_pieces(text)
    return [Piece(0, 0, len(text), text)] if text else []


def markup_pieces(source: str, xml: bool, key: Hashable = 0, strict: bool = True) -> list[Piece]:
    """Pieces of an HTML or XML document (or XHTML div) as read: text, comments and attribute values, each
    between breaks; inline tags of HTML join, XML's every tag breaks. In XML a named entity beyond the five
    XML defines cannot be read: InputError when `strict`, else it is read as written."""
    pieces: list[Piece] = []
    pos = 0
    for m in MARKUP_RE.finditer(source):
        _text_pieces(source, pos, m.start(), key, xml, strict, pieces)
        pos = m.end()
        token = m.group(0)
        if token.startswith("<!--"):
            pieces += [BREAK, Piece(key, m.start() + 4, m.start() + 4 + len(token[4:].removesuffix("-->")),
                                    token[4:].removesuffix("-->")), BREAK]
        elif token.startswith("<![CDATA["):
            body = token[9:].removesuffix("]]>")
            pieces += [BREAK, Piece(key, m.start() + 9, m.start() + 9 + len(body), body), BREAK]
        elif m.group(1):
            name = m.group(1).rsplit(":", 1)[-1].lower()
            pieces.append(BREAK if xml or name in BLOCK_ELEMENTS else JOIN)
            for a in ATTRIBUTE_RE.finditer(m.group(2)):
                group = next(g for g in (1, 2, 3) if a.group(g) is not None)
                offset = m.start(2)
                pieces.append(BREAK)
                _text_pieces(source, offset + a.start(group), offset + a.end(group), key, xml, strict, pieces)
                pieces.append(BREAK)
        else:
            pieces.append(BREAK)
    _text_pieces(source, pos, len(source), key, xml, strict, pieces)
    return pieces


def _text_pieces(source: str, start: int, end: int, key, xml: bool, strict: bool, pieces: list[Piece]) -> None:
    pos = start
    for m in REFERENCE_RE.finditer(source, start, end):
        name = m.group(1)
        if name.startswith("#") or not xml:
            decoded = html.unescape(m.group(0))
        elif m.group(0).endswith(";") and name in XML_ENTITIES:
            decoded = XML_ENTITIES[name]
        elif strict:
            raise InputError("uses an entity that XML does not define "
                             "(only the five XML entities and character references can be read)")
        else:
            decoded = m.group(0)
        if decoded == m.group(0):
            continue  # not a reference: read as written
        if m.start() > pos:
            pieces.append(Piece(key, pos, m.start(), source[pos:m.start()]))
        pieces.append(Piece(key, m.start(), m.end(), decoded))
        pos = m.end()
    if end > pos:
        pieces.append(Piece(key, pos, end, source[pos:end]))


RTF_RE = re.compile(r"\\'([0-9a-fA-F]{2})|\\u(-?\d+) ?(?:\\'[0-9a-fA-F]{2}|\?)?|\\([{}\\])"
                    r"|\\(par|line|row|cell|sect|page|tab)\b-?\d* ?"
                    r"|\\[A-Za-z]+-?\d* ?|\\[^A-Za-z]|[{}\r\n]")


def rtf_pieces(source: str, key: Hashable = 0) -> list[Piece]:
    """Pieces of an RTF document as read: `\\'e9` and `\\u233?` decoded, paragraphs and cells as breaks,
    other control words and groups as nothing."""
    pieces: list[Piece] = []
    pos = 0
    for m in RTF_RE.finditer(source):
        if m.start() > pos:
            pieces.append(Piece(key, pos, m.start(), source[pos:m.start()]))
        pos = m.end()
        if m.group(1):
            pieces.append(Piece(key, m.start(), m.end(), bytes([int(m.group(1), 16)]).decode("cp1252", "replace")))
        elif m.group(2):
            pieces.append(Piece(key, m.start(), m.end(), chr(int(m.group(2)) % 65536)))
        elif m.group(3):
            pieces.append(Piece(key, m.start(), m.end(), m.group(3)))
        elif m.group(4):
            pieces.append(BREAK)
        else:
            pieces.append(JOIN)
    if len(source) > pos:
        pieces.append(Piece(key, pos, len(source), source[pos:]))
    return pieces


def _render(pieces: Sequence[Piece], join: str) -> tuple[str, list[int]]:
    out, offsets, at = [], [], 0
    for p in pieces:
        text = join if p is JOIN else p.text
        offsets.append(at)
        out.append(text)
        at += len(text)
    return "".join(out), offsets

