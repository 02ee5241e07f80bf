"""Worst-case text beside ordinary notes of the same size, side by side in one run.

Run: .venv/bin/python benchmarks/text_worst_case.py [--sizes 80000,1000000] [--stacks patterns,no-llm]
     [--budget-s 60] [--no-cli]
Texts, each cut to exactly the size: an ordinary note (the ASQ-PHI tuning queries and the shared DocumentReference
notes, joined and repeated), 'a@' repeated, '1.' repeated, and random digits and separators (seeded).
1. The whole command `deid-adapter text detect --stack patterns` over one record of each text (a new process each:
   start-up, imports, detection, output), wall seconds; target: 80 KB of 'a@' at most 3x the ordinary note.
2. Each stack in this process (built and warmed once), one `detect` per text under a record budget of --budget-s
   seconds (the pattern detector's own per-text budget, 2 s + 8 s per MB, may stop it sooner).
Each line gives the seconds, `ok` or `refused` (the record failed closed at its budget), and the ratio to the
ordinary note of the same size.
"""
from __future__ import annotations

import argparse
import base64
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from text_deid import budget
from text_deid.spans import DetectorError
from text_deid.stack import StackUnavailable, build_stack

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"


def ordinary_note(size: int) -> str:
    """The tuning queries and the shared notes, joined by blank lines and repeated to `size` characters."""
    texts = [json.loads(line)["text"] for line in (SHARED / "asq-phi" / "tuning.jsonl").read_text().splitlines() if line]
    for line in (SHARED / "fhir" / "bulk-ndjson" / "DocumentReference.000.ndjson").read_text().splitlines():
        texts += [base64.b64decode(c["attachment"]["data"]).decode() for c in json.loads(line).get("content", [])
                  if c.get("attachment", {}).get("data")]
    corpus = "\n\n".join(texts)
    return (corpus * (size // len(corpus) + 1))[:size]


def digits_and_separators(size: int) -> str:
    rnd = random.Random(0)
    parts, length = [], 0
    while length < size:
        parts.append("".join(rnd.choice("0123456789") for _ in range(rnd.randint(1, 4))) + rnd.choice("-./ ()"))
        length += len(parts[-1])
    return "".join(parts)[:size]


def inputs(size: int) -> dict[str, str]:
    return {"ordinary note": ordinary_note(size), "'a@' x": ("a@" * size)[:size], "'1.' x": ("1." * size)[:size],
            "digits+separators": digits_and_separators(size)}


def cli_run(text: str, workdir: Path) -> tuple[float, str]:
    """Wall seconds of one whole `text detect --stack patterns` over one record, and ok / refused / exit N."""
    src, out = workdir / "in.jsonl", workdir / "out.jsonl"
    src.write_text(json.dumps({"id": "r1", "text": text}) + "\n")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "adapter.cli", "text", "detect", "--stack", "patterns",
                           "--in", str(src), "--out", str(out)], cwd=ROOT, capture_output=True)
    seconds = time.perf_counter() - start
    return seconds, {0: "ok", 3: "refused"}.get(proc.returncode, f"exit {proc.returncode}")


def in_process(stack, text: str, budget_s: float) -> tuple[float, str]:
    start = time.perf_counter()
    try:
        with budget.within(budget_s):
            stack.detect(text)
        outcome = "ok"
    except DetectorError:
        outcome = "refused"
    return time.perf_counter() - start, outcome


def table(title: str, rows: dict[int, dict[str, tuple[float, str]]]) -> None:
    print(f"\n{title}")
    print(f"  {'size':>9}  {'text':<18} {'seconds':>8}  {'outcome':<8} {'x ordinary':>10}")
    for size, by_text in rows.items():
        base = by_text["ordinary note"][0]
        for name, (seconds, outcome) in by_text.items():
            print(f"  {size:>9,}  {name:<18} {seconds:>8.2f}  {outcome:<8} {seconds / base:>10.2f}")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="80000,1000000")
    ap.add_argument("--stacks", default="patterns,no-llm")
    ap.add_argument("--budget-s", type=float, default=60.0, help="record budget of the in-process runs")
    ap.add_argument("--no-cli", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    texts = {size: inputs(size) for size in sizes}
    if not args.no_cli:
        with tempfile.TemporaryDirectory() as tmp:
            table("whole CLI run: deid-adapter text detect --stack patterns (wall s)",
                  {size: {name: cli_run(text, Path(tmp)) for name, text in by_name.items()}
                   for size, by_name in texts.items()})
    for name in args.stacks.split(","):
        try:
            stack = build_stack(name)
        except StackUnavailable as e:
            print(f"\nstack {name}: skipped ({e})")
            continue
        stack.detect(texts[sizes[0]]["ordinary note"][:2000])  # load models and lexicons outside the timings
        table(f"stack {name} in process, record budget {args.budget_s:g} s (wall s)",
              {size: {t: in_process(stack, text, args.budget_s) for t, text in by_name.items()}
               for size, by_name in texts.items()})


if __name__ == "__main__":
    main()
