"""Build mappings/data/drug-words.txt.gz: one-word drug names (generic and brand), lower case, one a line.

    pip install -e '.[vocab-build]'
    python scripts/build_drug_words.py [--out mappings/data/drug-words.txt.gz]

The source is the dictionary shipped in the `drug-named-entity-recognition` package (MIT; drug names from
DrugBank's open vocabulary, MeSH, Wikipedia and the NHS, see mappings/data/SOURCES.md). Only names of one
word of letters (a hyphen allowed), four letters or more, are kept; the output is sorted and gzip-compressed
with a fixed timestamp, so the same inputs give the same bytes. The text stack reads the list, not the
package, whose pickled dictionary takes seconds to load.
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import pickle  # noqa: S403 - the package's own data file, installed from PyPI
import re
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE_WORD = re.compile(r"[a-zà-ÿ]{2,}(?:-[a-zà-ÿ]{2,})*")


def drug_words() -> list[str]:
    """The package's one-word drug names, sorted."""
    path = resources.files("drug_named_entity_recognition") / "drug_ner_dictionary.pkl.bz2"
    with bz2.open(str(path), "rb") as fh:
        dictionary = pickle.load(fh)  # noqa: S301 - see above
    return sorted({w for w in dictionary["drug_variant_to_canonical"] if len(w) >= 4 and ONE_WORD.fullmatch(w)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "mappings" / "data" / "drug-words.txt.gz")
    args = parser.parse_args()
    words = drug_words()
    header = "# one-word drug names from drug-named-entity-recognition (see mappings/data/SOURCES.md)\n"
    with open(args.out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as fh:
        fh.write((header + "\n".join(words) + "\n").encode("utf-8"))
    print(f"{len(words)} words -> {args.out}")


if __name__ == "__main__":
    main()
