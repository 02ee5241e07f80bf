"""Peak memory of `deid-adapter fhir` on one large Bundle with validation off (issue #17: 200 MB peaked at 3.7 GB).

Run: .venv/bin/python benchmarks/bundle_memory.py [--mb 200] [--bundle PATH]
Builds (or reuses, with --bundle) a collection Bundle of about --mb megabytes from benchmarks/make_export.py copies
of the shared sample, runs the CLI on it in a child process (audit trail on, in a temporary folder) and prints
the child's peak resident set (ru_maxrss) beside the bundle's size, and its wall and CPU seconds.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_export import make_export  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_MB = 0.8  # one copy of the shared sample export


def make_bundle(path: Path, mb: float) -> int:
    """A collection Bundle of every resource of enough export copies to reach `mb` megabytes; returns its size."""
    with tempfile.TemporaryDirectory() as tmp:
        make_export(Path(tmp), max(1, round(mb / SAMPLE_MB)))
        with path.open("w", encoding="utf-8") as out:
            out.write('{"resourceType": "Bundle", "type": "collection", "entry": [')
            first = True
            for part in sorted(Path(tmp).glob("*.ndjson")):
                for line in part.read_text(encoding="utf-8").splitlines():
                    if line.strip():
                        out.write(("" if first else ",\n") + '{"resource": ' + line + "}")
                        first = False
            out.write("]}\n")
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--bundle", type=Path, help="Use (or create, if missing) this bundle file.")
    parser.add_argument("--validate", default="off", choices=["off", "sample", "full"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle = args.bundle or work / "bundle.json"
        size = bundle.stat().st_size if bundle.exists() else make_bundle(bundle, args.mb)
        key = work / "bench.key"
        key.write_text(json.dumps({"version": 1, "secret": base64.b64encode(secrets.token_bytes(32)).decode()}))
        key.chmod(0o600)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(work / "state")}
        env.pop("DEID_ADAPTER_AUDIT", None)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "adapter.cli", "fhir", str(bundle), str(work / "out.json"),
                               "--validate", args.validate, "--stack", "patterns", "--key-file", str(key),
                               "--today", "2026-01-15"], cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
    print(f"bundle {size / 1e6:.1f} MB, validation {args.validate}: peak RSS {usage.ru_maxrss / 1024:.0f} MB "
          f"({usage.ru_maxrss * 1024 / size:.1f}x the input), {wall:.1f} s wall, "
          f"{usage.ru_utime + usage.ru_stime:.1f} s CPU")


if __name__ == "__main__":
    main()
