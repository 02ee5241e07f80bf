"""Bulk throughput and memory: the local engine with 1 and 2 workers and Spark local[2], on generated exports.

Run: .venv/bin/python benchmarks/bulk_scale.py [--mb 50 200] [--validate sample] [--engines local1 local2 spark2]
For each size it generates an export (benchmarks/make_export.py), runs `deid-adapter bulk` once per engine
as a subprocess, and reports MB/s (input bytes over wall time, start-up included), resources/s, the CPU
seconds and the peak memory of the whole process tree (driver, pool workers, Spark's JVM and Python
workers), both sampled every 0.2 s from /proc. It also checks that every engine wrote the same bytes.
On a shared machine wall times depend on what else runs (the load averages are printed); CPU seconds much
less so, and ratios between engines of one run still compare.
Targets (issue 8): 2 workers ≥ 1.8× 1 worker; Spark within 1.5× of the local engine; memory flat as input grows.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_export import make_export  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_MB = 0.81  # the shared sample's resource files
ENGINES = {"local1": ["--engine", "local", "--workers", "1"], "local2": ["--engine", "local", "--workers", "2"],
           "spark2": ["--engine", "spark", "--workers", "2"]}


TICK = os.sysconf("SC_CLK_TCK")


def tree_sample(pid: int) -> tuple[int, dict[int, float]]:
    """Resident bytes of `pid` and all its descendants, and the CPU seconds each of them has used so far."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    rss, cpu, todo = 0, {}, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            cpu[p] = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            pass
    return rss, cpu


def timed_run(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the process tree, peak tree RSS bytes) of a command."""
    peak = 0
    cpu: dict[int, float] = {}
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            rss, seen = tree_sample(proc.pid)
            peak = max(peak, rss)
            for p, seconds in seen.items():
                cpu[p] = max(cpu.get(p, 0.0), seconds)
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    elapsed = time.perf_counter() - start
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{err[-2000:]}")
    return elapsed, sum(cpu.values()), peak


def digest(out: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(out.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(out).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def load() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[50, 200], help="export sizes to generate (MB, at least)")
    parser.add_argument("--validate", default="sample", help="full, sample or off (bulk --validate)")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    args = parser.parse_args()
    print(f"start: {load()}", flush=True)
    results: dict[float, dict[str, tuple[float, float, int, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="bulk-scale-") as tmp:
        work = Path(tmp)
        key = work / "bench.key"
        subprocess.run([sys.executable, "-m", "adapter.cli", "keys", "init", str(key)], cwd=ROOT, check=True,
                       capture_output=True)
        print("| input MB | resources | engine | seconds | MB/s | resources/s | CPU s | peak memory MB | output digest |")
        print("|---|---|---|---|---|---|---|---|---|", flush=True)
        for mb in args.mb:
            export = work / f"export-{mb:g}"
            size = make_export(export, max(1, math.ceil(mb / SAMPLE_MB)))
            resources = sum(sum(1 for line in p.open("rb") if line.strip()) for p in export.glob("*.ndjson"))
            for name in args.engines:
                out = work / f"out-{mb:g}-{name}"
                cmd = [sys.executable, "-m", "adapter.cli", "bulk", str(export), str(out), "--key-file", str(key),
                       "--today", "2026-01-15", "--validate", args.validate, "--stack", "patterns", *ENGINES[name]]
                seconds, cpu, peak = timed_run(cmd)
                results.setdefault(mb, {})[name] = (size / 1e6 / seconds, cpu, peak, digest(out))
                shutil.rmtree(out)
                print(f"| {size / 1e6:.1f} | {resources:,} | {name} | {seconds:.1f} | {size / 1e6 / seconds:.2f} | "
                      f"{resources / seconds:,.0f} | {cpu:,.0f} | {peak / 2**20:,.0f} | {results[mb][name][3]} |", flush=True)
            shutil.rmtree(export)
    print(f"end: {load()}")
    for mb, by in results.items():
        rate = {name: r[0] for name, r in by.items()}
        same = len({r[3] for r in by.values()}) == 1
        line = f"{mb:g} MB: every engine wrote the same bytes: {'yes' if same else 'NO'}"
        if "local1" in rate and "local2" in rate:
            line += f"; local2/local1 {rate['local2'] / rate['local1']:.2f}x (target >= 1.8)"
        if "spark2" in rate and "local2" in rate:
            line += f"; spark2 takes {rate['local2'] / rate['spark2']:.2f}x the time of local2 (target <= 1.5)"
        print(line)
    if len(results) > 1:
        for name in args.engines:
            peaks = ", ".join(f"{by[name][2] / 2**20:,.0f} MB at {mb:g} MB" for mb, by in results.items())
            print(f"peak memory, {name}: {peaks}")


if __name__ == "__main__":
    main()
