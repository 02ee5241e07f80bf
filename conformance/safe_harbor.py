"""Safe Harbor conformance checks of de-identified FHIR output, written apart from the engine (they share
none of its code), so they can judge any de-identifier: this project's CLI, its HTTP service, or another.

Leak check:
For every input file it collects the people's names, telecom, address lines, cities, full ZIPs, every
identifier value, patient ids and every full date, then searches the output (JSON text, XHTML and HTML
with tags as spaces and as rendered, inline tags joined, character references decoded, base64 attachments
decoded, RTF escapes too) for each, case-insensitively, as whole tokens, and in a normal form of its own (JSON
and HL7 escapes decoded, invisible format characters dropped, accents dropped, look-alike letters as Latin): a
name part of five letters or more is also looked for inside longer tokens and reversed.
"""
from __future__ import annotations

import base64
import html
import json
import re
import unicodedata
from functools import lru_cache
from pathlib import Path

PEOPLE = {"Patient", "RelatedPerson", "Person", "Practitioner"}


def load(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix == ".ndjson":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return [json.loads(text)]


def resources(doc):
    if isinstance(doc, dict) and "resourceType" in doc:
        yield doc
        for c in doc.get("contained") or []:
            yield from resources(c)
        if doc["resourceType"] == "Bundle":
            for e in doc.get("entry") or []:
                if e.get("resource"):
                    yield from resources(e["resource"])


def nodes(x):
    if isinstance(x, dict):
        for k, v in x.items():
            yield k, v
            yield from nodes(v)
    elif isinstance(x, list):
        for v in x:
            yield from nodes(v)


def identifying_values(doc) -> set[tuple[str, str]]:
    found = set()
    for r in resources(doc):
        if r["resourceType"] in PEOPLE:
            for n in r.get("name") or []:
                for part in (n.get("given") or []) + [n.get("family") or ""]:
                    found.add(("name", part))
            for t in r.get("telecom") or []:
                found.add(("telecom", t.get("value") or ""))
            for a in r.get("address") or []:
                for line in a.get("line") or []:
                    found.add(("address", line))
                found.add(("city", a.get("city") or ""))
                if len(re.sub(r"\D", "", a.get("postalCode") or "")) >= 5:
                    found.add(("zip", a["postalCode"]))
            if r["resourceType"] == "Patient":
                found.add(("patient-id", r.get("id") or ""))
        for key, value in nodes(r):
            if key == "identifier":
                for ident in value if isinstance(value, list) else [value]:
                    if r["resourceType"] not in ("Organization", "Location"):
                        found.add(("identifier", (ident or {}).get("value") or ""))
            if isinstance(value, str) and key != "lastUpdated" and re.match(r"^\d{4}-\d{2}-\d{2}", value):
                found.add(("date", value[:10]))
    return {(k, v.strip()) for k, v in found if len(v.strip()) >= 3}


def searchable_text(doc) -> str:
    parts = [json.dumps(doc, ensure_ascii=False)]
    for key, value in nodes(doc):
        if key == "div" and isinstance(value, str):
            parts += markup_readings(value)
        if key == "data" and isinstance(value, str):
            try:
                decoded = base64.b64decode(value, validate=True).decode("utf-8", "replace")
            except ValueError:
                continue
            parts += [decoded, *markup_readings(decoded), rtf_text(decoded)]
    text = "\n".join(parts)
    return text.lower() + "\n" + normal_form(text)


@lru_cache(maxsize=1)
def _skeletons() -> dict[str, str]:
    """Look-alike character -> the ASCII letter or digit it is confusable with (Unicode's confusables.txt)."""
    from confusable_homoglyphs.confusables import confusables_data  # loads its table: only when a check runs

    table = {}
    for char, glyphs in confusables_data.items():
        latin = sorted(g["c"] for g in glyphs if len(g["c"]) == 1 and g["c"].isascii() and g["c"].isalnum())
        if len(char) == 1 and not char.isascii() and latin:
            table[char] = min(latin, key=lambda c: (not c.islower(), not c.isalpha(), c)).lower()
    return table


def normal_form(text: str) -> str:
    """Text as a reader takes it: JSON \\uXXXX and HL7 escapes decoded (formatting as a space), format characters
    (zero-width, soft hyphen, direction marks) dropped, compatibility forms and accents undone, case folded,
    look-alike letters as Latin."""
    text = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), text)
    text = re.sub(r"\\(?:\.[a-z]{2}[+-]?\d*|[FSTRE])\\", " ", re.sub(r"\\[HN]\\", "", text))
    skeletons = _skeletons()
    text = "".join(skeletons.get(c, c) for c in unicodedata.normalize("NFKD", text))
    return "".join(skeletons.get(c, c) for c in unicodedata.normalize("NFKD", text.casefold())
                   if unicodedata.category(c) not in ("Mn", "Me", "Cf"))


def _found(kind: str, value: str, text: str) -> bool:
    """Whether `value` is in `text` (searchable_text) as a whole token, or a long name part anywhere or reversed."""
    tail = r"(?![0-9])" if kind == "date" else r"(?![0-9a-z])"
    if re.search(r"(?<![0-9a-z])" + re.escape(value.lower()) + tail, text):
        return True
    folded = normal_form(value)
    if re.search(r"(?<![0-9a-z])" + re.escape(folded) + tail, text):
        return True
    return kind == "name" and sum(c.isalpha() for c in folded) >= 5 and (folded in text or folded[::-1] in text)


def markup_readings(text: str) -> list[str]:
    """Markup read with each tag as a space, and as rendered (inline tags as nothing), references decoded."""
    inline = (r"</?(?:a|abbr|b|bdi|bdo|big|cite|code|em|font|i|kbd|mark|q|s|samp|small|span|strike|strong|sub|sup|tt|u|var)"
              r"\b[^>]*>")
    return [html.unescape(re.sub(r"<[^>]+>", " ", text)),
            html.unescape(re.sub(r"<[^>]+>", " ", re.sub(inline, "", text, flags=re.I)))]


def rtf_text(text: str) -> str:
    """RTF read roughly: hex and unicode escapes decoded, control words and groups dropped."""
    text = re.sub(r"\\'([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]).decode("cp1252", "replace"), text)
    text = re.sub(r"\\u(-?\d+) ?\??", lambda m: chr(int(m.group(1)) % 65536), text)
    return re.sub(r"\\[a-z]+-?\d* ?|[{}]", "", text)


def leaks(input_path: Path, output_path: Path) -> tuple[int, list[str]]:
    """(number of values checked, kinds of the values found in the output) for two files."""
    values = set()
    for doc in load(input_path):
        values |= identifying_values(doc)
    text = "\n".join(searchable_text(d) for d in load(output_path))
    return len(values), [kind for kind, value in sorted(values) if _found(kind, value, text)]


def references(doc) -> tuple[set[str], list[str]]:
    """(what can be referenced inside the document, every literal reference in it)."""
    names, refs = set(), []
    for r in resources(doc):
        if r.get("id"):
            names.add(f"{r['resourceType']}/{r['id']}")
    for key, value in nodes(doc):
        if key == "fullUrl":
            names.add(value)
            m = re.search(r"([A-Z][A-Za-z]+/[^/]+)$", value)
            if m:
                names.add(m.group(1))
        if key == "reference" and isinstance(value, str) and not value.startswith("#") and "?" not in value:
            refs.append(value)
    return names, refs


def broken_references(before: dict, after: dict) -> int:
    """How many references that resolved inside `before` no longer resolve inside `after`."""
    names_in, refs_in = references(before)
    names_out, refs_out = references(after)
    if len(refs_in) != len(refs_out):
        return abs(len(refs_in) - len(refs_out))
    return sum(1 for a, b in zip(refs_in, refs_out) if a in names_in and b not in names_out)


def leaks_in(before: dict, after: dict) -> list[str]:
    """Kinds of identifying values of `before` found in `after`."""
    text = searchable_text(after)
    return [kind for kind, value in sorted(identifying_values(before)) if _found(kind, value, text)]
