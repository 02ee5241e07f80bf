"""Build the data of the clinical-values filter (text_deid/clinical/): UCUM units and drug names.

    pip install -e '.[values-build]'
    npm pack @lhncbc/ucum-lhc@7.1.10 && tar xzf lhncbc-ucum-lhc-7.1.10.tgz
    python scripts/build_clinical_values.py package/data/ucumDefs.min.json

Writes `mappings/data/ucum-units.txt` (every unit code, print symbol and name of the UCUM table as the NLM's
ucum-lhc 7.1.10 ships it, lowercased, one a line) and `mappings/data/drug-names.txt.gz` (every name and
synonym of four letters or more of the `drug-named-entity-recognition` 2.0.9 dictionary, lowercased, one a line). Sorted, and gzip
with a fixed timestamp: the same inputs give the same bytes. mappings/data/SOURCES.md gives the licences.
"""
from __future__ import annotations

import bz2
import gzip
import json
import pickle
import sys
from importlib import resources
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "mappings" / "data"


def ucum_units(defs: Path) -> list[str]:
    table = json.loads(defs.read_text(encoding="utf-8"))["units"]
    column = {name: i for i, name in enumerate(table["config"]) if isinstance(name, str)}
    found = set()
    for row in table["data"]:
        for key in ("csCode_", "ciCode_", "printSymbol_", "name_"):
            value = row[column[key]]
            if isinstance(value, str) and value.strip() and " " not in value.strip():
                found.add(value.strip().lower())
    return sorted(found)


def drug_names() -> list[str]:
    path = resources.files("drug_named_entity_recognition") / "drug_ner_dictionary.pkl.bz2"
    with bz2.open(str(path), "rb") as fh:
        dictionary = pickle.load(fh)  # the package's own data file, as its find_drugs() loads it
    # names of three letters or fewer are abbreviations that other words share ("ace", "tab")
    return sorted({v.strip().lower() for v in dictionary["drug_variant_to_canonical"] if len(v.strip()) >= 4})


def main(defs: str) -> None:
    units = ucum_units(Path(defs))
    (DATA / "ucum-units.txt").write_text(
        "# UCUM unit codes, print symbols and names, lowercased: NLM ucum-lhc 7.1.10 data/ucumDefs.min.json\n"
        + "".join(f"{u}\n" for u in units), encoding="utf-8")
    body = "# drug names and synonyms, lowercased: drug-named-entity-recognition 2.0.9\n" + "".join(
        f"{d}\n" for d in drug_names())
    with open(DATA / "drug-names.txt.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(body.encode("utf-8"))
    print(f"{len(units)} units, {body.count(chr(10)) - 1} drug names")


if __name__ == "__main__":
    main(sys.argv[1])
