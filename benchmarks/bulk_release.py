"""What the release costs a bulk export: `deid-adapter bulk` with every patient's identifiers looked for in every
record (as it runs) against the same run with an empty release (as before), side by side on one generated export.

Run: .venv/bin/python benchmarks/bulk_release.py [--mb 20] [--workers 2] [--rounds 2] [--stack patterns]
The export: benchmarks/make_export.py's copies of the shared sample (a suffix on every patient's name parts,
so each copy's patients are new people). Each round runs both, in turns; reported: the median wall and CPU
seconds and the peak memory of the process tree (benchmarks/bulk_scale.py's sampling), and the ratios.
"""
from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bulk_scale import ROOT, SAMPLE_MB, load, timed_run  # noqa: E402
from make_export import make_export  # noqa: E402

# the run without a release: the same command with the workers' release matcher built over no identifiers
WITHOUT = ("import sys, adapter.bulk.job as job, text_deid.detectors.release as release; "
           "job.ReleaseMatcher = lambda known: release.ReleaseMatcher(()); "
           "sys.argv[0] = 'deid-adapter'; from adapter.cli.main import main; main()")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=20, help="export size to generate (MB, at least)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stack", default="patterns", help="the text stack (no-llm: the default)")
    args = parser.parse_args()
    print(f"start: {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bulk-release-") as tmp:
        work = Path(tmp)
        key = work / "bench.key"
        subprocess.run([sys.executable, "-m", "adapter.cli", "keys", "init", str(key)], cwd=ROOT, check=True,
                       capture_output=True)
        export = work / "export"
        size = make_export(export, max(1, math.ceil(args.mb / SAMPLE_MB)))
        patients = sum(1 for p in export.glob("Patient.*.ndjson") for line in p.open("rb") if line.strip())
        bulk = ["bulk", str(export), None, "--key-file", str(key), "--today", "2026-01-15", "--validate", "sample",
                "--stack", args.stack, "--workers", str(args.workers)]
        runs = {"with release": [sys.executable, "-m", "adapter.cli"], "without": [sys.executable, "-c", WITHOUT]}
        measured: dict[str, list[tuple[float, float, int]]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, command in runs.items():
                out = work / "out"
                measured[name].append(timed_run(command + [str(out) if a is None else a for a in bulk]))
                shutil.rmtree(out)
    print(f"{size / 1e6:.1f} MB, {patients:,} patients, stack {args.stack}, {args.workers} workers, "
          f"median of {args.rounds} rounds")
    print("| run | wall s | CPU s | peak memory MB |")
    print("|---|---|---|---|")
    median = {name: [statistics.median(m[i] for m in ms) for i in range(3)] for name, ms in measured.items()}
    for name, (wall, cpu, peak) in median.items():
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {peak / 2**20:,.0f} |")
    (w1, c1, p1), (w0, c0, p0) = median["with release"], median["without"]
    print(f"with/without: wall {w1 / w0:.2f}x, CPU {c1 / c0:.2f}x, peak memory {(p1 - p0) / 2**20:+,.0f} MB")
    print(f"end: {load()}")


if __name__ == "__main__":
    main()
