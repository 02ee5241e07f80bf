"""ED payloads (OBX-5 of type ED): the character set a text payload declares, to read and write it by.

HTML `<meta charset>` / `content=...; charset=`, an XML declaration's `encoding`, RTF `\\ansicpg`; else UTF-8.
"""
from __future__ import annotations

import base64
import codecs
import re

DECLARED_RE = re.compile(rb"""(?:charset\s*=\s*["']?|encoding\s*=\s*["'])([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
RTF_RE = re.compile(rb"\\ansicpg(\d+)")


def payload_codec(data: bytes) -> str:
    """The codec a payload declares in its first 2 KiB (a byte-order mark wins), else UTF-8.
    LookupError when it names a character set Python does not know."""
    if data.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    head = data[:2048]
    m = RTF_RE.search(head)
    if m:
        return codecs.lookup(f"cp{int(m.group(1))}").name
    m = DECLARED_RE.search(head)
    if m:
        return codecs.lookup(m.group(1).decode("ascii")).name
    return "utf-8"


def encode(text: str, codec: str) -> bytes:
    """Text back into the payload's own character set; a character it cannot hold as a character reference
    (only replacements the text stack wrote, which are ASCII, are new)."""
    return text.encode(codec, "xmlcharrefreplace")


def payload_text(leaf: str) -> str | None:
    """A base64 leaf decoded by the character set it declares, or None when it is not base64 text."""
    try:
        data = base64.b64decode(leaf, validate=True)
        return data.decode(payload_codec(data))
    except (ValueError, LookupError):
        return None
