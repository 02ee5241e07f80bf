"""Time `deid-adapter risk`'s reading and analysis for 1,000, 10,000 and 100,000 synthetic patients.

Writes a synthetic de-identified NDJSON export (Patient, Encounter, Condition) per size into a temporary
folder, then times read_release + analyze (k-anonymity, risks, l-diversity, generalization search).
Usage: python benchmarks/risk_scale.py [SIZES...]
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

from adapter.risk import measures as risk


def write_export(root: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(root / "Patient.000.ndjson", "w") as p, open(root / "Encounter.000.ndjson", "w") as e, \
            open(root / "Condition.000.ndjson", "w") as c:
        for i in range(n):
            pid = f"p{i}"
            p.write(json.dumps({"resourceType": "Patient", "id": pid, "gender": rng.choice(["female", "male"]),
                                "birthDate": str(rng.randint(1936, 2025)),
                                "address": [{"postalCode": f"{rng.randint(0, 999):03d}"}]}) + "\n")
            for j in range(rng.randint(0, 6)):
                e.write(json.dumps({"resourceType": "Encounter", "id": f"e{i}-{j}",
                                    "subject": {"reference": f"Patient/{pid}"}}) + "\n")
            for j in range(rng.randint(0, 3)):
                c.write(json.dumps({"resourceType": "Condition", "id": f"c{i}-{j}", "subject": {"reference": f"Patient/{pid}"},
                                    "code": {"coding": [{"system": "s", "code": str(rng.randint(1, 40))}]}}) + "\n")


def main(sizes: list[int]) -> None:
    print(f"{'patients':>9}  {'read s':>7}  {'analyze s':>9}  {'total s':>7}  {'us/patient':>10}")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            write_export(Path(tmp), n)
            start = time.perf_counter()
            release = risk.read_release(Path(tmp))
            read = time.perf_counter() - start
            risk.analyze(risk.Table.from_release(release, ("birth_year", "gender", "zip3", "encounters")), 5)
            total = time.perf_counter() - start
        print(f"{n:>9}  {read:>7.2f}  {total - read:>9.2f}  {total:>7.2f}  {total / n * 1e6:>10.1f}", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000])
