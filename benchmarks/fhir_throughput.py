"""De-identification throughput on the shared Synthea bundles, beside fhir.resources R4B parse+serialize
and plain json load+dump of the same bundles, measured side by side in one run.

Run: .venv/bin/python benchmarks/fhir_throughput.py [--repeat N]
Prints wall and CPU seconds (CPU: every thread of this process, so "per core" holds on a busy machine)
and the ratios the core issue sets targets for:
  full validation: time(de-identify) / time(R4B parse+serialize)  (target ≤ 2; issue #23: ≤ 1.2)
  trusted fast path (--validate off): MB/s per core                 (target ≥ 15)
  fast path / json load+dump, in process                           (issue #23: ≤ 5)
  `deid-adapter fhir FOLDER … --validate off --stack patterns --audit off`, its CPU seconds less those of the
  same command on a folder of one small Patient (its start-up), / json load+dump   (issue #23: ≤ 1.5× the above)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fhir.resources.R4B import get_fhir_model_class

from adapter import json_input
from adapter.cli.common import tune_gc
from adapter.files import serialize
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.rules import load_profile
from text_deid.stack import build_stack

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = ROOT.parent / "shared" / "data" / "fhir" / "synthea-bundles"
PATIENT = ROOT.parent / "shared" / "data" / "fhir" / "hl7-r4-examples" / "Patient-example.json"


def cli_cpu(folder: Path, work: Path, key: Path, repeat: int) -> float:
    """Best CPU seconds (user + system) of the fhir command on `folder`, validation off, in a child process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")} | {"PYTHONPATH": str(ROOT)}
    best = float("inf")
    for n in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "adapter.cli", "fhir", str(folder), str(work / f"out-{folder.name}-{n}"),
                        "--validate", "off", "--stack", "patterns", "--audit", "off", "--key-file", str(key),
                        "--today", "2026-01-15"], cwd=ROOT, env=env, check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return best


def timed(fns: dict, raws: list[str], repeat: int) -> dict[str, tuple[float, float]]:
    """Best wall seconds and best CPU seconds (all threads of this process) of each function over `repeat`
    rounds. Each round runs every function once, in turn, so that a machine that speeds up or slows down
    during the run weighs on all of them alike (the ratios compare functions run minutes apart otherwise)."""
    best = {name: (float("inf"), float("inf")) for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.process_time()
            for raw in raws:
                fn(raw)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tune_gc()  # as every deid-adapter command does
    raws = [p.read_text() for p in sorted(BUNDLES.glob("*.json"))]
    mb = sum(len(r.encode()) for r in raws) / 1e6
    secret = secrets.token_bytes(32)  # a throwaway key: the benchmark writes nothing
    key = Key(key_id_for(secret), secret)

    def engine(validate: bool) -> Deidentifier:
        return Deidentifier(load_profile("safe-harbor"), Pseudonymizer(key), build_stack("patterns"), validate=validate)

    full, fast = engine(True), engine(False)
    model = get_fhir_model_class("Bundle")

    def json_roundtrip(raw):
        json.dumps(json.loads(raw))

    def r4b_roundtrip(raw):
        model.model_validate(json.loads(raw)).model_dump_json()

    def strict_roundtrip(raw):
        json.dumps(json_input.loads(raw))

    # as the fhir command does, the input is parsed strictly (no duplicate keys, depth limit), given up to the
    # engine (consume: no copy of it is made), and written by the command's own writer (adapter/files.py
    # serialize: compact json.dumps indented by msgspec; its streamed Bundles come to the same bytes)
    def deid_full(raw):
        serialize([full.deidentify(json_input.loads(raw), consume=True).resource], False)

    def deid_fast(raw):
        serialize([fast.deidentify(json_input.loads(raw), consume=True).resource], False)

    def deid_fast_lax(raw):  # what the parse cost before strict input: json.loads, last duplicate key wins
        serialize([fast.deidentify(json.loads(raw), consume=True).resource], False)

    timings = timed({"json load+dump": json_roundtrip, "strict json load+dump": strict_roundtrip,
                     "R4B parse+serialize": r4b_roundtrip, "de-identify, full validation": deid_full,
                     "de-identify, validation off": deid_fast, "  same, plain json.loads": deid_fast_lax},
                    raws, args.repeat)
    print(f"{len(raws)} Synthea bundles, {mb:.2f} MB, best of {args.repeat} rounds (each runs all in turn), one process")
    print(f"  {'':32s} {'wall s':>7s}  {'MB/s':>7s}  {'CPU s':>7s}  {'MB/CPU-s':>8s}")
    for name, (wall, cpu) in timings.items():
        print(f"  {name:32s} {wall:7.3f}  {mb / wall:7.2f}  {cpu:7.3f}  {mb / cpu:8.2f}")
    # Ratios use CPU seconds: on a shared machine wall time also counts other processes' turns.
    cpu = {name: c for name, (_, c) in timings.items()}
    r4b = cpu["R4B parse+serialize"]
    print(f"ratio de-identify(full) / R4B parse+serialize: {cpu['de-identify, full validation'] / r4b:.2f}  (target <= 2)")
    print(f"ratio de-identify(off)  / R4B parse+serialize: {cpu['de-identify, validation off'] / r4b:.2f}")
    print(f"ratio de-identify(off)  / json load+dump:      {cpu['de-identify, validation off'] / cpu['json load+dump']:.1f}")
    print(f"ratio strict / plain json.loads, fast path:    "
          f"{cpu['de-identify, validation off'] / cpu['  same, plain json.loads']:.3f}")
    print(f"fast path: {mb / cpu['de-identify, validation off']:.2f} MB per CPU-second, "
          f"{mb / timings['de-identify, validation off'][0]:.2f} MB/s wall (target >= 15 per core)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "one").mkdir()
        (work / "one" / PATIENT.name).write_bytes(PATIENT.read_bytes())
        subprocess.run([sys.executable, "-m", "adapter.cli", "keys", "init", str(work / "bench.key")], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, capture_output=True)
        startup = cli_cpu(work / "one", work, work / "bench.key", args.repeat)
        folder = cli_cpu(BUNDLES, work, work / "bench.key", args.repeat)
    cli = folder - startup
    print(f"CLI on the folder, validation off: {folder:.3f} CPU s, start-up (one small Patient) {startup:.3f} CPU s")
    print(f"ratio CLI less start-up / json load+dump:  {cli / cpu['json load+dump']:.1f}  "
          f"({cli / cpu['de-identify, validation off']:.2f}x the fast path in process; target <= 1.5)")

if __name__ == "__main__":
    main()
