"""Clinical values a text stack masks: every string of the shared samples through the stack, and the clinical
tokens of each (numeric ranges, comparators, LOINC-shaped codes, HL7 table ids, doses, as
../shared/tools/clinical_values.py counts them) that a span overlaps.

Run: .venv/bin/python benchmarks/clinical_values.py [--stacks patterns,no-llm] [DIR ...]
DIR: folders of HL7v2 (.hl7, .txt, .er7: every component of every field) and FHIR (.json, .ndjson: every string
but narrative markup and attachments); default ../shared/data/{hl7v2,hl7v2-peer,fhir-peer}. The texts go through
the stack alone, without the record's known identifiers, so this measures what the detectors and filters make of
clinical strings wherever they stand; a token counts as masked where a span overlaps it and holds no other letter or
digit ("(555) 555-1234" is a phone, not a range masked). Prints one JSON line per folder and stack: texts, tokens checked, tokens
masked by kind, and the seconds the stack took (target: 0 masked).
"""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path

from text_deid.stack import build_stack

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
NUM = r"(?:0|[1-9]\d{0,3})(?:\.\d+)?"
TOKENS = [
    ("range", re.compile(rf"(?<![\w.\-/]){NUM}\s?(?:-|–|to)\s?{NUM}(?![\w.\-/])")),
    ("comparator", re.compile(rf"(?:<=|>=|<|>|≤|≥)\s?{NUM}(?![\w.])")),
    ("loinc", re.compile(r"(?<![\w\-])\d{3,5}-\d(?![\w\-])")),
    ("hl7_table", re.compile(r"(?<!\w)HL7\d{4}(?!\w)")),
    ("dose", re.compile(rf"(?<![\w.]){NUM}\s?(?:mg|mcg|g|mL|ml|L|mmol/L|mg/dL|g/dL|U/L|IU|units?|tablets?|%)(?![\w/])")),
]
SKIP_KEYS = {"div", "data"}


def hl7_texts(path: Path) -> list[str]:
    raw = path.read_text(encoding="utf-8", errors="replace").lstrip("\ufeff")
    out = []
    for seg in re.split(r"\r\n|\r|\n", raw):
        if len(seg) < 4 or seg.startswith("MSH"):
            continue
        for field in seg.split("|")[1:]:
            out += [s for rep in field.split("~") for c in rep.split("^") for s in c.split("&") if s.strip()]
    return out


def fhir_texts(node, out: list[str]) -> list[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k not in SKIP_KEYS:
                fhir_texts(v, out)
    elif isinstance(node, list):
        for v in node:
            fhir_texts(v, out)
    elif isinstance(node, str) and node.strip():
        out.append(node)
    return out


def texts_of(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".hl7", ".txt", ".er7"):
            found += hl7_texts(path)
        elif path.suffix in (".json", ".ndjson"):
            raw = path.read_text(encoding="utf-8-sig")
            docs = [json.loads(line) for line in raw.splitlines() if line.strip()] if path.suffix == ".ndjson" \
                else [json.loads(raw)]
            for doc in docs:
                fhir_texts(doc, found)
    return list(dict.fromkeys(found))


def _masks(text: str, span, start: int, end: int) -> bool:
    """The span masks the token: it overlaps it and holds no other letter or digit ("(555) 555-1234" is a phone
    that holds "555-1234", not a range masked)."""
    if not (span.start < end and start < span.end):
        return False
    outside = text[span.start:start] + text[end:span.end]
    return not any(c.isalnum() for c in outside)


def measure(stack, texts: list[str]) -> dict:
    start = time.perf_counter()
    spans = stack.detect_many(texts, ())
    seconds = time.perf_counter() - start
    checked, masked = 0, Counter()
    for text, found in zip(texts, spans):
        for kind, pattern in TOKENS:
            for m in pattern.finditer(text):
                checked += 1
                if any(_masks(text, s, m.start(), m.end()) for s in found):
                    masked[kind] += 1
    return {"texts": len(texts), "tokens_checked": checked, "tokens_masked": sum(masked.values()),
            "masked_by_kind": dict(masked), "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path,
                        default=[SHARED / "hl7v2", SHARED / "hl7v2-peer", SHARED / "fhir-peer"])
    parser.add_argument("--stacks", default="patterns,no-llm")
    args = parser.parse_args()
    stacks = {name: build_stack(name) for name in args.stacks.split(",")}
    for folder in args.dirs:
        texts = texts_of(folder)
        for name, stack in stacks.items():
            print(json.dumps({"folder": folder.name, "stack": name, **measure(stack, texts)}))


if __name__ == "__main__":
    main()
