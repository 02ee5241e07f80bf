"""Load on the HTTP service: N concurrent clients posting Synthea bundles (patterns stack), beside the same
work done in-process with the same concurrency, in one run. Prints p50/p95/p99, throughput, errors and
the HTTP overhead ratio. Targets: zero errors, p99 <= 3x p50.

Run: .venv/bin/python benchmarks/service_load.py [--clients 8] [--requests 500]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapter.http.auth import add_client  # noqa: E402
from fhir_transforms.keys import init_key_file  # noqa: E402
from fhir_transforms.keys import load_key  # noqa: E402
from fhir_transforms.pseudonym import Pseudonymizer  # noqa: E402
from fhir_transforms.r4.record import Deidentifier  # noqa: E402
from fhir_transforms.rules import load_profile  # noqa: E402
from text_deid.stack import build_stack  # noqa: E402

BUNDLES = ROOT.parent / "shared" / "data" / "fhir" / "synthea-bundles"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(name: str, latencies: list[float], wall: float, errors: int) -> dict:
    p50, p95, p99 = (percentile(latencies, q) for q in (0.5, 0.95, 0.99))
    print(f"{name:12s} n={len(latencies)} errors={errors} p50={p50 * 1000:7.0f} ms p95={p95 * 1000:7.0f} ms "
          f"p99={p99 * 1000:7.0f} ms p99/p50={p99 / p50:4.2f} throughput={len(latencies) / wall:6.2f} req/s")
    return {"p50": p50, "p99": p99, "throughput": len(latencies) / wall, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    bodies = [p.read_bytes() for p in sorted(BUNDLES.glob("*.json"))]
    work = [bodies[i % len(bodies)] for i in range(args.requests)]
    tmp = Path(tempfile.mkdtemp())
    key_file = tmp / "bench.key"
    init_key_file(key_file)
    token = add_client(tmp / "tokens.json", "bench", ["fhir"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    server = subprocess.Popen([sys.executable, "-m", "adapter.cli", "serve", "--port", str(port), "--tokens",
                               str(tmp / "tokens.json"), "--key-file", str(key_file), "--stack", "patterns",
                               "--workers", str(args.clients)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(base + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        headers = {"Content-Type": "application/fhir+json", "Authorization": f"Bearer {token}"}
        clients = [httpx.Client(base_url=base, headers=headers, timeout=600) for _ in range(args.clients)]

        def http_call(i: int) -> tuple[float, bool]:
            start = time.perf_counter()
            resp = clients[i % args.clients].post("/fhir/$de-identify", content=work[i])
            return time.perf_counter() - start, resp.status_code == 200

        engine = Deidentifier(load_profile("safe-harbor"), Pseudonymizer(load_key(key_file)), build_stack("patterns"))

        def local_call(i: int) -> tuple[float, bool]:
            start = time.perf_counter()
            json.dumps(engine.deidentify(json.loads(work[i])).resource)
            return time.perf_counter() - start, True

        results = {}
        for name, fn in (("http", http_call), ("in-process", local_call)):
            start = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                done = list(pool.map(fn, range(args.requests)))
            wall = time.perf_counter() - start
            results[name] = summary(name, [d for d, _ in done], wall, sum(1 for _, ok in done if not ok))
        print(f"HTTP overhead ratio (in-process throughput / HTTP throughput): "
              f"{results['in-process']['throughput'] / results['http']['throughput']:.2f}")
        print(f"targets: errors == 0 -> {results['http']['errors'] == 0}; "
              f"p99 <= 3x p50 -> {results['http']['p99'] <= 3 * results['http']['p50']}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
