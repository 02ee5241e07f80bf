"""One normal form in which text and known identifiers are compared, with offsets back to the original text.

Escapes are decoded first (JSON `\\uXXXX`, and `\\n`, `\\r`, `\\t` as a word break; HTML character references,
RTF `\\'hh` and `\\uN`, HL7 escapes: a formatting command or an escaped delimiter reads as a word break,
highlighting as nothing). Then every character is folded on its own: default-ignorable characters (zero-width,
soft hyphen, direction marks) are dropped, the compatibility decomposition (NFKD: fullwidth Latin, ligatures)
is taken, case is folded, marks (accents) are dropped, and confusable look-alikes (Cyrillic "р", Greek "ο",
...) map to the Latin letter or digit of their Unicode TS #39 skeleton, from the confusable-homoglyphs
package's copy of confusables.txt. Folding character by character keeps a folded character's origin known.
ASCII text without a backslash or an ampersand is its own normal form (matching is case-insensitive): the
common case costs nothing.
"""
from __future__ import annotations

import bisect
import html
import json
import re
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

# Latin letters that hold no mark to drop, with the letters they are written as when the keyboard lacks them
_LATIN_BASE = {"ł": "l", "ø": "o", "đ": "d", "ð": "d", "ħ": "h", "ŧ": "t", "ı": "i", "ŀ": "l", "æ": "ae", "œ": "oe",
               "þ": "th", "ĸ": "k", "ƒ": "f", "ɨ": "i", "ʉ": "u"}
# default-ignorable code points outside the format category (Cf), which is dropped whole
_IGNORABLE = frozenset("\u115f\u1160\u3164\uffa0\u034f\u17b4\u17b5")


@lru_cache(maxsize=1)
def _skeletons() -> dict[str, str]:
    """Character -> the ASCII letter or digit it is confusable with (lower case first, then letters, then digits)."""
    data = json.loads(resources.files("confusable_homoglyphs").joinpath("confusables.json").read_text("utf-8"))
    table = {}
    for char, glyphs in data.items():
        if len(char) != 1 or char.isascii():
            continue
        targets = sorted((g["c"] for g in glyphs if len(g["c"]) == 1 and g["c"].isascii() and g["c"].isalnum()),
                         key=lambda c: (not c.islower(), not c.isalpha(), c))
        if targets:
            table[char] = targets[0].lower()
    return table


def _fold_char(c: str) -> str:
    if c in _IGNORABLE or unicodedata.category(c) == "Cf":
        return ""
    skeletons = _skeletons()
    # the skeleton before case folding too: a capital can look like a Latin letter while its small letter does not (К, к)
    decomposed = "".join(skeletons.get(d, d) for d in unicodedata.normalize("NFKD", c))
    out = []
    for d in unicodedata.normalize("NFKD", decomposed.casefold()):
        if unicodedata.category(d) in ("Mn", "Me") or d in _IGNORABLE:
            continue
        d = skeletons.get(d, d)
        out.append(_LATIN_BASE.get(d, d))
    return "".join(out)


class _FoldTable(dict):
    """str.translate's table, filled in as characters are met (a dict lookup in C once a character is known)."""

    def __missing__(self, key: int) -> str:
        folded = self[key] = _fold_char(chr(key))
        return folded


FOLD = _FoldTable({c: chr(c).lower() for c in range(128)})

_ESCAPE_RE = re.compile(
    r"\\u(?P<json>[0-9a-fA-F]{4})"
    r"|\\'(?P<rtf_hex>[0-9a-fA-F]{2})"
    r"|\\u(?P<rtf_u>-?\d{1,5}) ?\??"
    r"|\\(?P<hl7>[FSTRE]|\.[a-z]{2}[+-]?\d*|[HN]|X[0-9A-Fa-f]*|[CMZ][0-9A-Za-z]{0,16})\\"
    r"|\\(?P<json_space>[nrt])"
    r"|&(?:#\d{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?")


def _decoded(m: re.Match) -> str:
    if m["json"]:
        return chr(int(m["json"], 16))
    if m["rtf_hex"]:
        return bytes([int(m["rtf_hex"], 16)]).decode("cp1252", "replace")
    if m["rtf_u"]:
        return chr(int(m["rtf_u"]) % 65536)
    if m["json_space"]:  # JSON's \n, \r, \t: a word break
        return " "
    if (seq := m["hl7"]) is not None:
        if seq[0] in "HNCMZ":  # highlighting and character sets: no space where they stand
            return ""
        if seq[0] == "X":
            data = bytes.fromhex(seq[1:]) if len(seq) % 2 == 1 else b""
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                return data.decode("latin-1")
        return " "  # an escaped delimiter, a line break, a space, an indent, a skip: a word break
    return html.unescape(m[0])


def plain(text: str) -> bool:
    """Whether `text` is its own normal form (matched case-insensitively)."""
    return text.isascii() and "\\" not in text and "&" not in text


_CHUNK = 32  # folded offsets are mapped back through the cumulative lengths of chunks of this many characters


@dataclass
class Folded:
    """A text in normal form (`text`), and the way back from its offsets to the original's."""

    text: str
    decoded: str  # escapes decoded, characters not yet folded
    escapes: list[tuple[int, int, int, int]]  # (decoded start, decoded end, original start, original end)
    one_to_one: bool = True  # every character of `decoded` folds to one character
    _chunks: list[int] | None = field(default=None, repr=False)

    def original(self, start: int, end: int) -> tuple[int, int]:
        """The original text's span of the characters that folded into text[start:end] (end > start)."""
        if self.one_to_one:
            return self._original_of(start)[0], self._original_of(end - 1)[1]
        first, last = self._decoded_index(start), self._decoded_index(end - 1)
        while last + 1 < len(self.decoded) and not FOLD[ord(self.decoded[last + 1])]:
            last += 1  # a mark or an invisible character after the last letter is part of it ("e" + U+0301)
        return self._original_of(first)[0], self._original_of(last)[1]

    def _decoded_index(self, f: int) -> int:
        """The index in `decoded` of the character whose folding holds folded offset f."""
        if self._chunks is None:
            self._chunks = [0]
        chunks, decoded = self._chunks, self.decoded
        while chunks[-1] <= f and (len(chunks) - 1) * _CHUNK < len(decoded):  # as far as asked: matches come in order
            i = (len(chunks) - 1) * _CHUNK
            chunks.append(chunks[-1] + len(decoded[i:i + _CHUNK].translate(FOLD)))
        j = bisect.bisect_right(chunks, f) - 1
        pos = self._chunks[j]
        for i in range(j * _CHUNK, min((j + 1) * _CHUNK, len(self.decoded))):
            pos += len(FOLD[ord(self.decoded[i])])
            if pos > f:
                return i
        raise IndexError(f)

    def _original_of(self, d: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.escapes, (d, float("inf"))) - 1
        if k >= 0:
            d_start, d_end, o_start, o_end = self.escapes[k]
            if d < d_end:
                return o_start, o_end
            d += o_end - d_end
        return d, d + 1


def fold(text: str) -> Folded:
    """`text` in normal form, with its way back."""
    if plain(text):
        return Folded(text, text, [])
    decoded, escapes = text, []
    if "\\" in text or "&" in text:
        parts, pos, shift = [], 0, 0
        for m in _ESCAPE_RE.finditer(text):
            value = _decoded(m)
            parts += [text[pos:m.start()], value]
            d_start = m.start() - shift
            escapes.append((d_start, d_start + len(value), m.start(), m.end()))
            shift += m.end() - m.start() - len(value)
            pos = m.end()
        if escapes:
            parts.append(text[pos:])
            decoded = "".join(parts)
    if decoded.isascii():
        return Folded(decoded, decoded, escapes)
    one_to_one = all(len(FOLD[ord(c)]) == 1 for c in set(decoded) if c >= "\x80")
    return Folded(decoded.translate(FOLD), decoded, escapes, one_to_one)


def fold_value(value: str) -> str:
    """A known identifier's value in normal form: its characters folded (a value from a structured field holds
    no escapes)."""
    return value.translate(FOLD)
