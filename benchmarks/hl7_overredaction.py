"""Over-redaction of HL7v2 coded text: which CE/CWE/CNE text components did de-identification change?

Run: .venv/bin/python benchmarks/hl7_overredaction.py IN OUT   (files matched by relative path: *.hl7, *.txt, *.er7)
The HL7v2 counterpart of ../shared/tools/fhir_overredaction.py. Each input message is compared with the
output message at the same place, segment by segment. In every field whose datatype is CE, CWE or CNE in the
message's version (hl7apy's tables, as the engine reads them; OBX-5 by OBX-2), each text component (2 and 5,
and CWE-9 and 11) that gained a [CATEGORY] tag is counted, in one of two classes:
  coded    the code beside it (component 1, 4 or 10) is present: terminology, kept unless it holds a known
           identifier of the message
  uncoded  no code beside it (and CWE-9, original text): free text, through the text stack by design
Prints one JSON line: texts compared, changed per class, and the changed ones by field and component with the
categories put in (never the text itself), and how many of those held a known identifier of the message (a
name, address part, telecom or identifier of PID, NK1, GT1, IN1, PV1 or MRG, matched as a whole word).
Exit 0 always: it measures.
"""
from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

from fhir_transforms.hl7v2.standard import field_type, standard_version

CODED = {"CE", "CWE", "CNE"}
TEXTS = {2: 1, 5: 4, 9: None, 11: 10}  # text component → the code component beside it (None: original text)
TAG = re.compile(r"\[[A-Z_]+\]")
SUFFIXES = (".hl7", ".txt", ".er7")
# where the message's known identifiers stand (segment → fields: the patient's, relatives', guarantor's,
# insured's and staff names, addresses, telecom and identifiers, as ../shared/tools/hl7_leak.py reads them)
PATIENT_FIELDS = {"PID": (2, 3, 4, 5, 6, 9, 11, 13, 14, 18, 19, 20, 21), "NK1": (2, 4, 5, 6, 30, 32),
                  "GT1": (3, 5, 6, 7, 12), "IN1": (16, 19, 36, 49), "PV1": (7, 8, 9, 17, 19), "MRG": (1, 3, 7)}


def messages(text: str) -> list[list[str]]:
    """The messages of a file, each a list of segments (split on CR, LF or CR LF; MSH starts a message)."""
    found: list[list[str]] = []
    for seg in re.split(r"\r\n|\r|\n", text.lstrip("\ufeff")):
        if not seg.strip():
            continue
        if seg.startswith("MSH") or not found:
            found.append([])
        found[-1].append(seg)
    return found


def fields(seg: str, sep: str) -> list[str]:
    """Fields by their HL7 number (index 0 is the segment id; MSH-1 is the field separator itself)."""
    parts = seg.split(sep)
    return [parts[0], sep, *parts[1:]] if parts[0] == "MSH" else parts


def known_words(msg: list[str], sep: str, comp: str, sub: str, rep: str) -> set[str]:
    """Values of the known identifiers' fields (3 characters or more), lower-cased, to tell a text that held one."""
    words = set()
    for seg in msg:
        f = fields(seg, sep)
        for n in PATIENT_FIELDS.get(f[0], ()):
            if n < len(f):
                for value in re.split("[" + re.escape(comp + sub + rep) + "]", f[n]):
                    if len(value.strip()) >= 3 and not value.strip().isdigit() or len(value.strip()) >= 6:
                        words.add(value.strip().lower())
    return words


def compare(a: list[str], b: list[str], found: list, counts: collections.Counter) -> None:
    sep = a[0][3] if a[0].startswith("MSH") and len(a[0]) > 3 else "|"
    enc = fields(a[0], sep)[2] if a[0].startswith("MSH") else "^~\\&"
    comp, rep, sub = (enc + "^~\\&")[0], (enc + "^~\\&")[1], (enc + "^~\\&")[3]
    msh = fields(a[0], sep)
    version = standard_version(msh[12].split(comp)[0] if len(msh) > 12 else "")
    known = known_words(a, sep, comp, sub, rep)
    for sa, sb in zip(a, b):
        fa, fb = fields(sa, sep), fields(sb, sep)
        if fa[0] != fb[0]:
            continue
        for n in range(1, min(len(fa), len(fb))):
            if fa[0] == "OBX" and n == 5:
                dtype = fa[2].split(comp)[0].strip().upper() if len(fa) > 2 else ""
            else:
                dtype = field_type(version, fa[0], n) or ""
            if dtype not in CODED:
                continue
            for ra, rb in zip(fa[n].split(rep), fb[n].split(rep)):
                ca, cb = ra.split(comp), rb.split(comp)
                for i, code_at in TEXTS.items():
                    if i > len(ca) or i > len(cb) or not ca[i - 1].strip() or (i in (9, 11) and dtype == "CE"):
                        continue
                    kind = "coded" if code_at and code_at <= len(ca) and ca[code_at - 1].strip() else "uncoded"
                    counts[kind] += 1
                    before, after = ca[i - 1], cb[i - 1]
                    if before != after and TAG.search(after) and not TAG.search(before):
                        held = any(re.search(r"(?<![0-9a-z])" + re.escape(w) + r"(?![0-9a-z])", before.lower())
                                   for w in known)
                        found.append((kind, f"{fa[0]}-{n}.{i}", tuple(sorted(set(TAG.findall(after)))), held))


def main() -> None:
    ind, outd = Path(sys.argv[1]), Path(sys.argv[2])
    compared: collections.Counter = collections.Counter()
    found: list = []
    for path in sorted(p for p in ind.rglob("*") if p.suffix.lower() in SUFFIXES):
        out = outd / path.relative_to(ind)
        if not out.exists():
            continue
        a = messages(path.read_text(encoding="utf-8", errors="replace"))
        b = messages(out.read_text(encoding="utf-8", errors="replace"))
        if len(a) != len(b):
            continue
        for ma, mb in zip(a, b):
            compare(ma, mb, found, compared)
    changed = collections.Counter(kind for kind, *_ in found)
    by_field = collections.Counter((kind, where, tags) for kind, where, tags, _ in found)
    held = collections.Counter(kind for kind, *_, h in found if h)
    top = [{"class": k, "field": w, "tags": list(t), "n": n} for (k, w, t), n in by_field.most_common(15)]
    print(json.dumps({"texts_compared": dict(compared), "changed": dict(changed),
                      "changed_holding_a_known_identifier": dict(held), "top": top}))


if __name__ == "__main__":
    main()
