"""The release matcher (text_deid/detectors/release.py): time per note and memory for releases of 1,000 and
10,000 patients.

Run: .venv/bin/python benchmarks/release_matcher.py [--patients 1000 10000]
The release: the known identifiers of the sample export's patients (tests/data/fhir/bulk-ndjson, as the engine
collects them), the first copy as they are, the others as benchmarks/make_export.py copies them (a suffix on
every name part, other digits in phones and ids). The notes: the sample's 78 DocumentReference notes, each looked up on its own
(`known_in([note])`) as a record's texts are. Memory: the resident size the matcher adds (built after a gc, in
this process). Prints timings and sizes only.
"""
from __future__ import annotations

import argparse
import base64
import gc
import json
import random
import re
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_export import suffix  # noqa: E402

from adapter.release import person_known  # noqa: E402
from fhir_transforms.keys import Key  # noqa: E402
from fhir_transforms.pseudonym import Pseudonymizer  # noqa: E402
from fhir_transforms.r4.record import Deidentifier  # noqa: E402
from fhir_transforms.rules import load_profile  # noqa: E402
from text_deid.detectors.release import ReleaseMatcher  # noqa: E402
from text_deid.spans import KnownIdentifier  # noqa: E402
from text_deid.stack import build_stack  # noqa: E402

SAMPLE = ROOT / "tests" / "data" / "fhir" / "bulk-ndjson"
DIGITS = re.compile(r"\d")


def lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (SAMPLE / name).read_text().splitlines() if line.strip()]


def sample_known() -> list[set[KnownIdentifier]]:
    engine = Deidentifier(load_profile("safe-harbor"), Pseudonymizer(Key("bench", bytes(32))), build_stack("patterns"),
                          lambda: date(2026, 1, 15), False)
    return [person_known(engine, p, "Patient") for p in lines("Patient.000.ndjson")]


def copy(known: set[KnownIdentifier], k: int, rng: random.Random) -> set[KnownIdentifier]:
    """Copy k of a patient's identifiers: name parts suffixed, the digits of the others drawn again (copy 0: the
    patient's own, which the notes name)."""
    if k == 0:
        return known
    found = set()
    for i in known:
        if i.category == "NAME":
            value = " ".join(w + suffix(k) for w in i.value.split())
        else:
            value = DIGITS.sub(lambda _: str(rng.randrange(10)), i.value)
        found.add(KnownIdentifier(value, i.category))
    return found


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, nargs="+", default=[1000, 10000])
    args = parser.parse_args()
    people = sample_known()
    notes = ["".join(base64.b64decode(c["attachment"]["data"]).decode() for c in d["content"])
             for d in lines("DocumentReference.000.ndjson")]
    ReleaseMatcher(people[0]).known_in(notes[:1])  # wordfreq's list and the fold tables, loaded once before
    print("| patients | identifiers | build s | memory MB | µs per note (78 notes, mean of 20 rounds after one) "
          "| found per note |")
    print("|---|---|---|---|---|---|")
    for n in args.patients:
        rng = random.Random(n)
        known = [k for i in range(n) for k in copy(people[i % len(people)], i // len(people), rng)]
        gc.collect()
        before, start = rss(), time.perf_counter()
        matcher = ReleaseMatcher(known)
        built = time.perf_counter() - start
        gc.collect()
        grown = rss() - before
        found = sum(len(matcher.known_in([note])) for note in notes)  # (and a round to warm up)
        start = time.perf_counter()
        for _ in range(20):
            for note in notes:
                matcher.known_in([note])
        per_note = (time.perf_counter() - start) / (20 * len(notes)) * 1e6
        print(f"| {n:,} | {len(set(known)):,} | {built:.2f} | {grown / 2**20:.0f} | {per_note:.0f} | "
              f"{found / len(notes):.1f} |")
        del matcher, known


if __name__ == "__main__":
    main()
