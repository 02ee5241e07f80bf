"""The FHIR fast path of several checkouts, side by side: each checkout's code in its own process, taking turns.

Run: .venv/bin/python benchmarks/fhir_checkouts.py DIR [DIR ...] [--rounds 5]
(DIR: a checkout, e.g. a `git worktree` of an older commit; this interpreter runs each one's packages.)
Each process parses the 9 shared Synthea bundles strictly, de-identifies them (patterns stack, validation off)
and writes them as the `fhir` command does, 7 times, then runs json load+dump of the same text 7 times; it
prints the best CPU seconds of each. The rounds alternate the checkouts, so that a machine that speeds up or
slows down weighs on all of them alike; each row prints every round's fast path and its ratio to json load+dump.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ONE_PROCESS = r'''
import json, time
from pathlib import Path
from adapter import json_input
from adapter.cli.common import tune_gc
from adapter.files import serialize
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.rules import load_profile
from text_deid.stack import build_stack

tune_gc()
raws = [p.read_text() for p in sorted(Path("../shared/data/fhir/synthea-bundles").glob("*.json"))]
secret = bytes(range(32))  # a public test key: nothing is written
fast = Deidentifier(load_profile("safe-harbor"), Pseudonymizer(Key(key_id_for(secret), secret)), build_stack("patterns"),
                    validate=False)
best_fast = best_json = float("inf")
for _ in range(7):
    cpu = time.process_time()
    for raw in raws:
        serialize([fast.deidentify(json_input.loads(raw), consume=True).resource], False)
    best_fast = min(best_fast, time.process_time() - cpu)
    cpu = time.process_time()
    for raw in raws:
        json.dumps(json.loads(raw))
    best_json = min(best_json, time.process_time() - cpu)
print(best_fast, best_json)
'''


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkouts", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs: dict[Path, list[tuple[float, float]]] = {d.resolve(): [] for d in args.checkouts}
    for _ in range(args.rounds):
        for d in runs:
            out = subprocess.run([sys.executable, "-c", ONE_PROCESS], cwd=d, env={"PYTHONPATH": str(d), "PATH": "/usr/bin:/bin"},
                                 capture_output=True, text=True, check=True)
            fast, plain = map(float, out.stdout.split())
            runs[d].append((fast, plain))
    for d, rows in runs.items():
        print(f"{d}\n  fast path CPU s: {' '.join(f'{f:.4f}' for f, _ in rows)} (best {min(f for f, _ in rows):.4f})"
              f"\n  / json load+dump: {' '.join(f'{f / j:.2f}' for f, j in rows)}")


if __name__ == "__main__":
    main()
