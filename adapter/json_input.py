"""Strict JSON for every input edge (CLI files, NDJSON lines, HTTP bodies, bulk lines, text JSONL): a duplicate
key, nesting deeper than MAX_DEPTH, or NaN/Infinity (including a number that overflows to it, 1e400) is bad
input, never "last one wins", a RecursionError or a non-JSON number further on.

Errors name a place (line and column, or a key path such as `entry[3].resource.name[0]`, where a key FHIR does not
define is `?`), never a value.
"""
from __future__ import annotations

import json
import re

import msgspec

from fhir_transforms.errors import InputError
from fhir_transforms.r4.schema import known_keys
from text_deid.evaluation import STRICT_NUMBERS, NotFinite

# Real FHIR nests far less: a Bundle entry's resource is 4 levels down, and a Questionnaire ten items deep
# with nested extensions stays under 40. The engine (walker, R4B validation) recurses once or twice per
# level and meets Python's recursion limit near 300 levels; 100 leaves room on both sides.
MAX_DEPTH = 100


class JsonInputError(InputError):
    """Input that is not acceptable JSON: syntax, a duplicate key, or nested too deeply."""


class _DuplicateKey(Exception):
    pass


_NOT_FINITE = "invalid JSON: NaN or Infinity is not a JSON number"


def _unique_pairs(pairs: list) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise _DuplicateKey
    return doc


class _Duplicated(dict):
    """Stands in for an object with a duplicate key on the second (error-path only) parse."""

    key = ""


def _mark_duplicates(pairs: list) -> dict:
    doc = dict(pairs)
    if len(doc) == len(pairs):
        return doc
    marked = _Duplicated(pairs)
    seen = set()
    marked.key = next(k for k, _ in pairs if k in seen or seen.add(k))
    return marked


_CONTAINERS = frozenset({dict, list, _Duplicated})


def loads(text: str | bytes) -> object:
    """json.loads that refuses duplicate keys, nesting deeper than MAX_DEPTH and NaN/Infinity (JsonInputError)."""
    doc = _quick(text)
    if doc is not _UNSURE:
        if not _within_depth(doc):
            raise JsonInputError(f"JSON nested deeper than {MAX_DEPTH} levels")
        return doc
    try:
        doc = json.loads(text, object_pairs_hook=_unique_pairs, **STRICT_NUMBERS)
    except NotFinite:
        raise JsonInputError(_NOT_FINITE) from None
    except _DuplicateKey:
        try:
            doc = _too_deep_or_duplicate(json.loads(text, object_pairs_hook=_mark_duplicates, **STRICT_NUMBERS))
        except NotFinite:
            raise JsonInputError(_NOT_FINITE) from None
    except json.JSONDecodeError as e:
        raise JsonInputError(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:  # json's own C parser gives up near Python's recursion limit
        raise JsonInputError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise JsonInputError("not UTF-8 text") from None
    if not _within_depth(doc):
        raise JsonInputError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return doc


_UNSURE = object()
_DECODE = msgspec.json.Decoder().decode
_ENCODE = msgspec.json.Encoder().encode


def _quick(text: str | bytes) -> object:
    """The document as `loads` reads it, from msgspec's parser (C, ~2.5x json.loads with the duplicate-key
    hook), or _UNSURE: then the stdlib's parse gives the answer (or the error and its line and column).

    msgspec refuses everything json.loads refuses, and more (NaN, lone surrogates, a BOM, numbers out of
    range): all of that goes to the stdlib. It keeps the last of duplicate keys, so they are found by
    counting: every member of an object is written with one ':' outside strings, and a ':' inside a string
    stays a ':' when it is written again (unless the input spelled it as an escape, \\u003a: those go to the
    stdlib). A dropped duplicate takes at least its own ':' with it, so the input holds more than the
    document written again."""
    try:
        doc = _DECODE(text)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return _UNSURE
    colon, escaped = (":", "\\u003") if type(text) is str else (b":", b"\\u003")
    if escaped in text or text.count(colon) != _ENCODE(doc).count(b":"):
        return _UNSURE
    return doc


_WS = re.compile(r"[ \t\n\r]*")


def split_bundle(text: str) -> tuple[dict, list[str], list[int]] | None:
    """A top-level JSON object with an `entry` array, read without holding the entries: (its other members,
    in order, the keys that come before `entry`, and where each entry starts in `text`). Each entry is parsed
    once here, strictly (as `loads` would), and dropped. None for anything else, or anything `loads` refuses:
    the caller parses the whole text and gets its answer."""
    strict = json.JSONDecoder(object_pairs_hook=_unique_pairs, **STRICT_NUMBERS)
    try:
        i = _WS.match(text).end()
        if text[i:i + 1] != "{":
            return None
        i = _WS.match(text, i + 1).end()
        pairs: list = []
        before: list[str] | None = None
        starts: list[int] = []
        while text[i:i + 1] == '"':
            key, i = json.decoder.scanstring(text, i + 1)
            i = _WS.match(text, i).end()
            if text[i:i + 1] != ":":
                return None
            i = _WS.match(text, i + 1).end()
            if key == "entry" and text[i:i + 1] == "[" and before is None:
                before = [k for k, _ in pairs]
                i = _WS.match(text, i + 1).end()
                while text[i:i + 1] != "]":
                    entry, end = strict.raw_decode(text, i)
                    if not _within_depth(entry, MAX_DEPTH - 2):  # the Bundle and its entry list hold it
                        return None
                    starts.append(i)
                    i = _WS.match(text, end).end()
                    if text[i:i + 1] == ",":
                        i = _WS.match(text, i + 1).end()
                    elif text[i:i + 1] != "]":
                        return None
                i += 1
            else:
                value, i = strict.raw_decode(text, i)
                if not _within_depth(value, MAX_DEPTH - 1):
                    return None
                pairs.append((key, value))
            i = _WS.match(text, i).end()
            if text[i:i + 1] == ",":
                i = _WS.match(text, i + 1).end()
            elif text[i:i + 1] == "}":
                break
            else:
                return None
        else:
            return None
        if text[i + 1:].strip(" \t\n\r") or before is None:
            return None
        header = _unique_pairs(pairs + [("entry", None)])
    except (ValueError, _DuplicateKey, RecursionError):  # NotFinite included
        return None
    del header["entry"]
    return header, before, starts


def entries_at(text: str, starts: list[int]):
    """The entries `split_bundle` found, parsed anew one at a time (already checked there)."""
    decoder = json.JSONDecoder()
    for i in starts:
        yield decoder.raw_decode(text, i)[0]


def _within_depth(doc: object, limit: int = MAX_DEPTH) -> bool:
    """Whether no container sits deeper than MAX_DEPTH: the containers one level at a time, each level's in
    one comprehension (exact class tests, not isinstance: this runs on every input)."""
    level = [doc] if doc.__class__ in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return False
        level = [v for node in level for v in (node if node.__class__ is list else node.values())
                 if v.__class__ in _CONTAINERS]
    return True


def _too_deep_or_duplicate(doc: object) -> None:
    """Raise for a document the marking parse built: too deep first (its path would be long), else the
    first duplicate in document order, by key path."""
    if not _within_depth(doc):
        raise JsonInputError(f"JSON nested deeper than {MAX_DEPTH} levels")
    stack = [(doc, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _Duplicated):
            where = _join(path, node.key) or "the top level"
            raise JsonInputError(f"duplicate JSON key at {where}")
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in reversed(list(items)):
            if isinstance(v, (dict, list)):
                stack.append((v, _join(path, k)))
    raise JsonInputError("duplicate JSON key")


def _join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    # only the element names FHIR defines: a sender's key may be anything, a name included
    name = key if key in known_keys() or key.lstrip("_") in known_keys() else "?"
    return f"{path}.{name}" if path else name
