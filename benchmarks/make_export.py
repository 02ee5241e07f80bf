"""Make a large FHIR Bulk Data export from the shared sample: N copies of its patients with fresh ids,
names and dates, so scale can be measured without real data.

Run: .venv/bin/python benchmarks/make_export.py OUT --copies N [--copies-per-file 25]
Copy k re-keys every UUID (ids and the references to them) with uuid5, appends a suffix to every
Patient name part (in the notes too, so cross-file linkage is exercised as in the sample), and moves
every full date by a per-copy number of days. Output files are Type.NNN.ndjson, as a bulk server writes.
"""
from __future__ import annotations

import argparse
import base64
import json
import random
import re
import uuid
from datetime import date, timedelta
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "fhir" / "bulk-ndjson"
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DATE_RE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
NAMESPACE = uuid.UUID("5b1d3f0e-1f0a-4a59-9c43-2f3e0b3a7c11")


def suffix(k: int) -> str:
    letters = ""
    while True:
        k, r = divmod(k, 26)
        letters = "abcdefghijklmnopqrstuvwxyz"[r] + letters
        if not k:
            return letters


class Copy:
    """The rewriting for copy k: ids, patient names, dates."""

    def __init__(self, k: int, names: list[str]):
        self.k, self.days = k, random.Random(k).randint(-3000, 3000)
        self.names = {n: n + suffix(k) for n in names}
        self.names_re = re.compile("|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)))

    def text(self, s: str) -> str:
        s = UUID_RE.sub(lambda m: str(uuid.uuid5(NAMESPACE, f"{self.k}:{m[0]}")), s)
        s = self.names_re.sub(lambda m: self.names[m[0]], s)
        return DATE_RE.sub(self._date, s)

    def _date(self, m: re.Match) -> str:
        try:
            return (date(int(m[1]), int(m[2]), int(m[3])) + timedelta(days=self.days)).isoformat()
        except ValueError:
            return m[0]

    def resource(self, line: str) -> str:
        res = json.loads(line)
        for content in res.get("content", []) if res.get("resourceType") == "DocumentReference" else []:
            att = content.get("attachment", {})
            if "data" in att:
                att["data"] = base64.b64encode(self.text(base64.b64decode(att["data"]).decode()).encode()).decode()
        return self.text(json.dumps(res, ensure_ascii=False, separators=(",", ":")))


def patient_names(sample: Path) -> list[str]:
    names = set()
    for line in (sample / "Patient.000.ndjson").read_text().splitlines():
        for n in json.loads(line).get("name", []):
            names.update(n.get("given", []) + [n.get("family", "")])
    return sorted(x for x in names if len(x) >= 3)


def make_export(out: Path, copies: int, per_file: int = 25, sample: Path = SAMPLE) -> int:
    """Write the export; returns its size in bytes."""
    out.mkdir(parents=True, exist_ok=True)
    names = patient_names(sample)
    files = {p.name.split(".")[0]: p.read_text().splitlines() for p in sorted(sample.glob("*.ndjson")) if p.name != "log.ndjson"}
    size = 0
    for start in range(0, copies, per_file):
        batch = [Copy(k, names) for k in range(start, min(start + per_file, copies))]
        for rtype, lines in files.items():
            data = "".join(c.resource(line) + "\n" for c in batch for line in lines if line.strip()).encode()
            (out / f"{rtype}.{start // per_file:03d}.ndjson").write_bytes(data)
            size += len(data)
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--copies", type=int, required=True)
    parser.add_argument("--copies-per-file", type=int, default=25)
    args = parser.parse_args()
    size = make_export(args.out, args.copies, args.copies_per_file)
    print(f"{args.copies} copies of the sample, {size / 1e6:.1f} MB, in {args.out}")


if __name__ == "__main__":
    main()
