"""Load (issue #36): one client sending heavy requests (a large text attachment near the body limit, two at a
time, back to back) beside one sending small ones, against a real `deid-adapter serve` on a free port.

Timings are noisy on a shared machine: the bounds here are generous, and the figures (p99 alone and beside the
heavy client, peak RSS) come from benchmarks/service_heavy_load.py. Before, the heavy requests' detectors ran on
for minutes after their 503 and held both workers, so the small requests timed out behind them."""
from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import httpx

from adapter.http.auth import add_client
from tests.support import serve

SMALL = {"resourceType": "Patient", "id": "p2", "name": [{"family": "Quorvath"}], "birthDate": "1971-04-05"}
WORDS = "Seen at Mercy Hospital in Boston by Dr. Smith for chest pain and Anna Jones called back".split()
SMALL_P99_BOUND_S = 5.0  # measured well under 1 s (docs/measurements.md); generous for a loaded 2-core machine
PEAK_RSS_BOUND_MB = 3072


def heavy(text_chars: int) -> bytes:
    text = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(text_chars // 6))
    document = {"resourceType": "DocumentReference", "status": "current", "subject": {"reference": "Patient/p1"},
                "content": [{"attachment": {"contentType": "text/plain",
                                            "data": base64.b64encode(text.encode()).decode()}}]}
    return json.dumps({"resourceType": "Bundle", "type": "collection",
                       "entry": [{"resource": {"resourceType": "Patient", "id": "p1"}}, {"resource": document}]}).encode()


def peak_rss_mb(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) // 1024


def test_small_requests_stay_fast_beside_a_client_sending_heavy_ones(tmp_path, test_key_file):
    heavy_token = add_client(tmp_path / "tokens.json", "heavy-sender", ["fhir"])
    body = heavy(1_400_000)  # ~1.9 MB of base64 under a 2 MB limit
    with serve(tmp_path, test_key_file, "--workers", "2", "--max-body-mb", "2", "--timeout-s", "3") as server:
        headers = {"Content-Type": "application/fhir+json"}
        small_headers = {**headers, "Authorization": f"Bearer {server['token']}"}
        assert httpx.post(server["base"] + "/fhir/$de-identify", json=SMALL, headers=small_headers,
                          timeout=120).status_code == 200  # the engine and the NER loaded
        stop, heavy_statuses, small = threading.Event(), [], []

        def send_heavy():
            with httpx.Client(timeout=120, headers={**headers, "Authorization": f"Bearer {heavy_token}"}) as client:
                while not stop.is_set():
                    resp = client.post(server["base"] + "/fhir/$de-identify", content=body)
                    heavy_statuses.append(resp.status_code)
                    if resp.status_code == 429:
                        time.sleep(float(resp.headers["retry-after"]))

        senders = [threading.Thread(target=send_heavy, daemon=True) for _ in range(2)]
        for t in senders:
            t.start()
        time.sleep(2)  # the heavy requests are under way
        with httpx.Client(timeout=120, headers=small_headers) as client:
            end = time.monotonic() + 15
            while time.monotonic() < end:
                start = time.perf_counter()
                resp = client.post(server["base"] + "/fhir/$de-identify", json=SMALL)
                small.append((time.perf_counter() - start, resp.status_code))
                time.sleep(0.1)
        stop.set()
        for t in senders:
            t.join(60)
        peak = peak_rss_mb(server["proc"].pid)
    assert {status for _, status in small} == {200}
    latencies = sorted(seconds for seconds, _ in small)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    assert p99 <= SMALL_P99_BOUND_S, p99
    assert heavy_statuses and set(heavy_statuses) <= {200, 429, 503}
    assert peak <= PEAK_RSS_BOUND_MB, peak
