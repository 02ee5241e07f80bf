"""The R4 invariants on every DomainResource (dom-2..dom-6) and what an output must not claim, as a check
for tests: violations(output, input) lists each broken one by path, never by value."""
from __future__ import annotations

from typing import Iterator


def _resources(doc: dict, path: str) -> Iterator[tuple[str, dict]]:
    yield path, doc
    if doc.get("resourceType") == "Bundle":
        for i, entry in enumerate(doc.get("entry", [])):
            if isinstance(entry.get("resource"), dict):
                yield from _resources(entry["resource"], f"{path}.entry[{i}].resource")


def _references(node) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "reference" and isinstance(v, str):
                yield v
            elif k != "contained":
                yield from _references(v)
    elif isinstance(node, list):
        for v in node:
            yield from _references(v)


def violations(output: dict, given: dict | None = None) -> list[str]:
    """dom-2 (no nested contained), dom-3 (each contained resource is referenced from the container, or
    refers to it), dom-4 (no meta.versionId/lastUpdated on a contained one), dom-5 (no meta.security on a
    contained one), dom-6 (narrative kept where the input had it), and no meta.profile claim."""
    found = []
    had_text = {p for p, r in _resources(given, "$") if (r.get("text") or {}).get("div")} if given else set()
    for path, res in _resources(output, "$"):
        if "profile" in (res.get("meta") or {}):
            found.append(f"{path}: meta.profile")
        if path in had_text and not (res.get("text") or {}).get("div"):
            found.append(f"{path}: dom-6 narrative lost")
        refs = set(_references(res))
        for i, c in enumerate(res.get("contained", [])):
            where = f"{path}.contained[{i}]"
            meta = c.get("meta") or {}
            if c.get("contained"):
                found.append(f"{where}: dom-2")
            if f"#{c.get('id')}" not in refs and "#" not in set(_references(c)):
                found.append(f"{where}: dom-3")
            if "versionId" in meta or "lastUpdated" in meta:
                found.append(f"{where}: dom-4")
            if "security" in meta:
                found.append(f"{where}: dom-5")
            if "tag" in meta:
                found.append(f"{where}: meta.tag on a contained resource")
    return found
