"""Heavy requests beside small ones on the HTTP service (issue #36): one client posts Bundles carrying a large
text attachment near the body limit, two at a time, back to back; another posts a small Patient at a steady pace.
Prints the small requests' p50/p99 alone and beside the heavy client, side by side in one run, the heavy answers'
statuses, the server's peak RSS, its RSS once idle, and how long it kept working after the last heavy answer.

Run: .venv/bin/python benchmarks/service_heavy_load.py [--checkout DIR] [--text-mb 2.1] [--seconds 40] [-- serve args]
(`--checkout` runs another checkout's server, e.g. an export of main, for a before/after comparison.)
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("Patient seen today at Mercy Hospital in Boston by Dr. Smith for follow up of chest pain and was given "
         "aspirin Anna Jones called back later on 617-555-0101").split()


def heavy_bundle(text_mb: float) -> bytes:
    words = int(text_mb * 1e6 / 6)
    text = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(words))
    document = {"resourceType": "DocumentReference", "status": "current", "subject": {"reference": "Patient/p1"},
                "content": [{"attachment": {"contentType": "text/plain",
                                            "data": base64.b64encode(text.encode()).decode()}}]}
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Zyxwortel", "given": ["Anna"]}]}
    return json.dumps({"resourceType": "Bundle", "type": "collection",
                       "entry": [{"resource": patient}, {"resource": document}]}).encode()


SMALL = json.dumps({"resourceType": "Patient", "id": "p2", "name": [{"family": "Quorvath"}], "birthDate": "1971-04-05",
                    "text": {"status": "generated", "div": '<div xmlns="http://www.w3.org/1999/xhtml">Seen by Dr. '
                                                           'Smith at Mercy Hospital.</div>'}}).encode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def proc_status(pid: int, field: str) -> int:
    """A /proc/PID/status field in MiB (VmHWM: peak RSS, VmRSS: RSS now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return -1


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def small_client(base: str, token: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=600, headers={"Authorization": f"Bearer {token}",
                                                           "Content-Type": "application/fhir+json"}) as client:
        while not stop.is_set():
            start = time.perf_counter()
            resp = client.post("/fhir/$de-identify", content=SMALL)
            out.append(time.perf_counter() - start)
            if resp.status_code != 200:
                out[-1] = float("inf")
            time.sleep(0.1)


def heavy_client(base: str, token: str, body: bytes, stop: threading.Event, statuses: list[int],
                 answered: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=600, headers={"Authorization": f"Bearer {token}",
                                                           "Content-Type": "application/fhir+json"}) as client:
        while not stop.is_set():
            resp = client.post("/fhir/$de-identify", content=body)
            statuses.append(resp.status_code)
            answered.append(time.monotonic())
            if resp.status_code == 429:
                time.sleep(float(resp.headers.get("retry-after", "1")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--text-mb", type=float, default=2.1)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("serve_args", nargs="*")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    tmp = Path(tempfile.mkdtemp())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    env.update(PYTHONPATH=str(checkout), DEID_ADAPTER_AUDIT="off")
    cli = [sys.executable, "-m", "adapter.cli"]
    subprocess.run([*cli, "keys", "init", str(tmp / "bench.key")], cwd=checkout, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    tokens = {}
    for name in ("heavy", "small"):
        tokens[name] = subprocess.run([*cli, "tokens", "add", str(tmp / "tokens.json"), "--client", name, "--op", "fhir"],
                                      cwd=checkout, env=env, check=True, capture_output=True, text=True).stdout.strip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([*cli, "serve", "--port", str(port), "--tokens", str(tmp / "tokens.json"), "--key-file",
                               str(tmp / "bench.key"), "--workers", "2", "--max-body-mb", "3", "--timeout-s",
                               str(args.timeout_s), *args.serve_args], cwd=checkout, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    body = heavy_bundle(args.text_mb)
    try:
        for _ in range(600):
            try:
                httpx.get(base + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        alone: list[float] = []
        stop = threading.Event()
        thread = threading.Thread(target=small_client, args=(base, tokens["small"], stop, alone))
        thread.start()
        time.sleep(args.seconds / 2)
        stop.set()
        thread.join()
        alone = alone[2:]  # the first requests load the engine and the NER

        beside: list[float] = []
        statuses: list[int] = []
        answered: list[float] = []
        stop = threading.Event()
        threads = [threading.Thread(target=heavy_client, args=(base, tokens["heavy"], body, stop, statuses, answered))
                   for _ in range(2)]
        threads.append(threading.Thread(target=small_client, args=(base, tokens["small"], stop, beside)))
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        last_answer = time.monotonic()
        peak = proc_status(server.pid, "VmHWM")
        busy_until, cpu = last_answer, cpu_seconds(server.pid)
        while time.monotonic() - last_answer < 300:  # until the server has been idle for two seconds
            time.sleep(2)
            now = cpu_seconds(server.pid)
            if now - cpu < 0.1:
                break
            busy_until, cpu = time.monotonic(), now
        print(f"checkout {checkout}; heavy body {len(body) / 1e6:.1f} MB ({args.text_mb} MB text), --timeout-s "
              f"{args.timeout_s}, serve args {' '.join(args.serve_args) or '-'}")
        print(f"small alone:        n={len(alone):4d} p50={percentile(alone, 0.5) * 1000:7.0f} ms "
              f"p99={percentile(alone, 0.99) * 1000:7.0f} ms")
        print(f"small beside heavy: n={len(beside):4d} p50={percentile(beside, 0.5) * 1000:7.0f} ms "
              f"p99={percentile(beside, 0.99) * 1000:7.0f} ms (failed: {sum(v == float('inf') for v in beside)})")
        print(f"heavy answers: {dict(sorted((s, statuses.count(s)) for s in set(statuses)))}")
        print(f"server peak RSS {peak} MiB; RSS once idle {proc_status(server.pid, 'VmRSS')} MiB; kept working "
              f"{busy_until - last_answer:.1f} s after the last heavy answer")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
