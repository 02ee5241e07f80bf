"""Peak memory of `fhir` on a large NDJSON file and `hl7` on a large message, against the input's size.

Run: PYTHONPATH=. .venv/bin/python benchmarks/stream_memory.py [--lines 100000] [--segments 200000]
    [--shape obx|short|nte]
Writes a synthetic NDJSON file (Observations of a few patients, one a line) and a synthetic ORU message
(MSH, PID, OBR, then OBX NM segments, the shortest segments, or one comment's NTE lines), runs each through
the CLI under /usr/bin/time -v with the audit trail off, and prints each input's size, the peak RSS, their
ratio, and the wall time. Issue #36 target: peak RSS ≤ 4× input
at 1M lines / 1M segments (memory proportional to a line or a segment, not the file).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CLI = [sys.executable, "-m", "adapter.cli.main"]


def make_ndjson(path: Path, lines: int) -> None:
    with path.open("w") as out:
        for n in range(lines):
            out.write(json.dumps({
                "resourceType": "Observation", "id": f"obs-{n:08d}", "status": "final",
                "code": {"coding": [{"system": "http://loinc.org", "code": "2345-7", "display": "Glucose"}]},
                "subject": {"reference": f"Patient/pat-{n % 97:04d}"},
                "effectiveDateTime": f"20{n % 20 + 5:02d}-0{n % 9 + 1}-1{n % 10}T08:30:00Z",
                "valueQuantity": {"value": 80 + n % 60, "unit": "mg/dL", "system": "http://unitsofmeasure.org",
                                  "code": "mg/dL"}}, separators=(",", ":")) + "\n")


# what fills a message after its MSH, PID and OBR: numeric results, or the shortest segments a red-team file
# used (1.3M segments in 7.8 MB), or one comment of many NTE lines (a single text for the stack: not windowed)
FILLERS = {"obx": lambda n: f"OBX|{n + 1}|NM|2345-7^Glucose^LN||{80 + n % 60}|mg/dL\r",
           "short": lambda n: "ZZ1|1\r",
           "nte": lambda n: f"NTE|{n + 1}||line {n}\r"}


def make_hl7(path: Path, segments: int, shape: str = "obx") -> None:
    head = ("MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240101120000||ORU^R01^ORU_R01|CTRL1|P|2.5.1\r"
            "PID|1||MRN4471902^^^HOSP^MR||Zyxwvut^Qqqplanted||19700312|F\r"
            "OBR|1|||2345-7^Glucose^LN\r")
    filler = FILLERS[shape]
    with path.open("w", newline="") as out:
        out.write(head)
        for n in range(segments - 3):
            out.write(filler(n))


def peak(cmd: list[str], env: dict) -> tuple[int, float, int]:
    """(peak RSS in bytes, wall seconds, exit code) of `cmd` under /usr/bin/time -v."""
    done = subprocess.run(["/usr/bin/time", "-v", *cmd], env=env, capture_output=True, text=True)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)[1]) * 1024
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    seconds = int(wall[1] or 0) * 3600 + int(wall[2]) * 60 + float(wall[3])
    return rss, seconds, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--segments", type=int, default=200_000)
    parser.add_argument("--shape", choices=sorted(FILLERS), default="obx", help="what fills the HL7 message")
    args = parser.parse_args()
    env = {**os.environ, "DEID_ADAPTER_AUDIT": "off"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        key = tmp_path / "bench.key"
        subprocess.run([*CLI, "keys", "init", str(key)], env=env, check=True, capture_output=True)
        cases = []
        if args.lines:
            make_ndjson(tmp_path / "obs.ndjson", args.lines)
            cases.append(("fhir", f"{args.lines} NDJSON lines", tmp_path / "obs.ndjson", ["--validate", "off"]))
        if args.segments:
            make_hl7(tmp_path / "big.hl7", args.segments, args.shape)
            cases.append(("hl7", f"{args.segments} HL7 segments ({args.shape})", tmp_path / "big.hl7", []))
        make_ndjson(tmp_path / "one.ndjson", 1)
        make_hl7(tmp_path / "one.hl7", 4)
        base = {"fhir": tmp_path / "one.ndjson", "hl7": tmp_path / "one.hl7"}
        for command, what, path, extra in cases:
            run = [*CLI, command, "--key-file", str(key), *extra]
            floor = peak([*run, str(base[command]), str(tmp_path / f"out-one-{command}")], env)[0]
            rss, wall, rc = peak([*run, str(path), str(tmp_path / f"out-{path.name}")], env)
            size = path.stat().st_size
            print(f"{command} {what}: input {size / 1e6:.1f} MB, peak RSS {rss / 1e6:.0f} MB "
                  f"({rss / size:.1f}x the input; {(rss - floor) / size:.1f}x above the {floor / 1e6:.0f} MB of a "
                  f"one-record run), {wall:.1f} s, exit {rc}")


if __name__ == "__main__":
    main()
