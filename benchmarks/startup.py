"""Start-up: wall seconds of one-shot CLI runs beside `python -c pass` and `python -c "import torch"`, each run
N times, the commands taking turns (so a busy moment hits all of them alike); medians printed side by side.

Run: .venv/bin/python benchmarks/startup.py [--runs 7] [--before DIR]
--before DIR: also run every CLI command from another checkout of the project (e.g. `git archive REV | tar -x -C
DIR`), in the same turns, for before/after figures from one run. Targets (issue #23): `hl7 --stack patterns`
on one message <= 1.5 s, `--stack no-llm` <= 5 s, `--help` <= 0.5 s.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MESSAGE = ROOT.parent / "shared" / "data" / "hl7v2" / "ADT-A01-01.hl7"


def cli_runs(work: Path, key: Path) -> dict[str, list[str]]:
    """The CLI commands measured: name → arguments after `python -m adapter.cli`."""
    one = [str(MESSAGE), str(work / "out.hl7"), "--key-file", str(key), "--today", "2026-01-15"]
    return {
        "--help": ["--help"],
        "hl7 --stack patterns --audit off": ["hl7", *one, "--stack", "patterns", "--audit", "off"],
        "hl7 --stack patterns (SQLite audit)": ["hl7", *one, "--stack", "patterns"],
        "hl7 --stack no-llm --audit off": ["hl7", *one, "--stack", "no-llm", "--audit", "off"],
        "wrong argument (no-llm, missing input)": ["hl7", str(work / "missing.hl7"), str(work / "o.hl7"),
                                                   "--key-file", str(key), "--stack", "no-llm", "--audit", "off"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--before", type=Path, help="Another checkout of the project, run beside this one.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
        env["XDG_STATE_HOME"] = str(work / "state")
        key = work / "bench.key"
        subprocess.run([sys.executable, "-m", "adapter.cli", "keys", "init", str(key)], cwd=ROOT, check=True,
                       env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True)
        runs: dict[str, tuple[list[str], Path]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], ROOT),
            'python -c "import torch"': ([sys.executable, "-c", "import torch"], ROOT),
        }
        trees = [("", ROOT)] + ([("before: ", args.before.resolve())] if args.before else [])
        for name, cli in cli_runs(work, key).items():
            for label, tree in trees:
                runs[label + name] = ([sys.executable, "-m", "adapter.cli", *cli], tree)
        walls: dict[str, list[float]] = {name: [] for name in runs}
        cpus: dict[str, list[float]] = {name: [] for name in runs}
        codes: dict[str, int] = {}
        for _ in range(args.runs):
            for name, (cmd, tree) in runs.items():
                before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                proc = subprocess.run(cmd, cwd=tree, env={**env, "PYTHONPATH": str(tree)}, capture_output=True)
                walls[name].append(time.perf_counter() - start)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                codes[name] = proc.returncode
    print(f"medians of {args.runs} runs each, taking turns; load average {os.getloadavg()[0]:.2f}")
    print(f"  {'':52s} {'wall s':>7s} {'CPU s':>7s}")
    for name, times in walls.items():
        print(f"  {name:52s} {statistics.median(times):7.2f} {statistics.median(cpus[name]):7.2f}   (exit {codes[name]})")


if __name__ == "__main__":
    main()
