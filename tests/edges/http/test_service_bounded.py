"""Bounded work per request (issue #36): a request past its deadline stops its detectors, a memory estimate refuses
what cannot fit, each client has its own limit, and slow or idle connections are closed.

Real uvicorn servers on free ports, run in this process where a test slows a detector or holds a request."""
from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from adapter.http.auth import TokenStore, add_client
from adapter.http.connections import with_header_timeout
from adapter.http.service import ServiceConfig, create_app
from fhir_transforms.r4.record import Deidentifier
from tests.conftest import FIXED_TODAY
from tests.support import assert_outcome, free_port, post, serve
from text_deid import budget
from text_deid.detectors import gazetteer
from text_deid.detectors.ner import ENCODE_PIECE_CHARS, NerDetector
from text_deid.spans import DetectorError

WORDS = ("Patient seen today at Mercy Hospital in Boston by Dr. Smith for follow up of chest pain and was given "
         "aspirin Anna Jones called back later").split()


def note(words: int) -> str:
    return " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(words))


def patient(text: str = "") -> dict:
    doc = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Zyxwortel"}], "birthDate": "1971-04-05"}
    if text:
        doc["text"] = {"status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{text}</div>'}
    return doc


@contextmanager
def running(tmp_path, test_key, http="auto", **settings):
    """A service with `settings` on a free port; yields base URL, tokens of two clients and the config."""
    tokens = tmp_path / "tokens.json"
    first, second = (add_client(tokens, name, ["fhir"]) for name in ("heavy-sender", "small-sender"))
    config = ServiceConfig(test_key, TokenStore.load(tokens), clock=lambda: FIXED_TODAY, **settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning",
                                           http=http))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    try:
        yield {"base": f"http://127.0.0.1:{port}", "token": first, "other": second, "config": config, "port": port}
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def quiet_after(times: list[float], still: float = 1.5, longest: float = 60.0) -> None:
    """Wait until nothing has been added to `times` for `still` seconds (the worker has stopped)."""
    end = time.monotonic() + longest
    while time.monotonic() < end:
        seen = len(times)
        time.sleep(still)
        if len(times) == seen:
            return


def test_a_request_past_its_deadline_stops_its_detectors_within_a_window(tmp_path, test_key, monkeypatch):
    """Default stack; the gazetteer and the NER slowed. Before: the 503 came at the deadline, but the gazetteer went
    on over every remaining token of the note (thousands of steps after the answer)."""
    gazetteer_steps, windows = [], []
    joined, logits = gazetteer._joined, NerDetector._logits

    def slow_joined(*args):
        time.sleep(0.0003)
        gazetteer_steps.append(time.monotonic())
        return joined(*args)

    def slow_logits(self, rows):
        time.sleep(0.02)
        windows.append(time.monotonic())
        return logits(self, rows)

    monkeypatch.setattr(gazetteer, "_joined", slow_joined)
    monkeypatch.setattr(NerDetector, "_logits", slow_logits)
    with running(tmp_path, test_key, timeout_s=2.0) as service:
        post(service, patient("short note"))  # engine and NER loaded before the clock starts
        gazetteer_steps.clear()
        windows.clear()
        resp = post(service, patient(note(40_000)))
        answered = time.monotonic()
        assert_outcome(resp, 503)
        quiet_after(gazetteer_steps)
        quiet_after(windows)
    late_steps = sum(t > answered for t in gazetteer_steps)
    late_windows = sum(t > answered for t in windows)
    assert late_steps <= 4 * gazetteer.BUDGET_EVERY, late_steps  # ~1 look at the deadline's worth of tokens
    assert late_windows <= 1, late_windows


def test_ner_encodes_a_long_text_in_pieces_giving_the_same_tokens_and_stopping_at_the_deadline():
    """Before: one tokenizer call over the whole text, which went on past the deadline however long the text."""
    detector = NerDetector()
    text = note(30_000).replace(" at ", "\n\tat ").replace(" by ", "  by\r\n")
    whole = detector.tokenizer.encode(text, add_special_tokens=False)
    assert detector.encode([text])[0] == (whole.ids, whole.offsets)

    real, ended = detector.tokenizer, []  # (time, characters) of each tokenizer call, when it returns

    class SlowTokenizer:
        def __getattr__(self, name):
            def call(arg, *args, **kwargs):
                time.sleep(0.4)
                out = getattr(real, name)(arg, *args, **kwargs)
                ended.append((time.monotonic(), sum(map(len, arg)) if isinstance(arg, list) else len(arg)))
                return out
            return call

    detector.tokenizer = SlowTokenizer()
    with pytest.raises(DetectorError), budget.within(0.3) as deadline:
        detector.encode([text])
    late = sum(chars for t, chars in ended if t > deadline)
    assert 0 < late <= ENCODE_PIECE_CHARS + 64 < len(text) // 2


def test_a_request_estimated_over_the_memory_budget_is_413_before_any_work(tmp_path, test_key):
    with running(tmp_path, test_key, stack="patterns", max_inflight_mb=1) as service:
        assert post(service, patient("short note")).status_code == 200
        outcome = assert_outcome(post(service, patient(note(2_000))), 413)  # ~12 KB of text: ~2 MiB estimated
        assert outcome["issue"][0]["code"] == "too-costly"
        assert "Zyxwortel" not in json.dumps(outcome)


@contextmanager
def held_requests(monkeypatch):
    """Requests that wait in their worker until released."""
    release, started = threading.Event(), threading.Semaphore(0)
    original = Deidentifier.deidentify

    def held(self, *args, **kwargs):
        started.release()
        release.wait(30)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Deidentifier, "deidentify", held)
    try:
        yield started
    finally:
        release.set()


def in_background(fn, *args):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("resp", fn(*args)), daemon=True)
    thread.start()
    return thread, result


def test_a_request_that_does_not_fit_beside_those_in_flight_is_503_with_retry_after(tmp_path, test_key, monkeypatch):
    text = note(1_500)  # ~1.4 MiB estimated: one fits in 2 MiB, two do not
    with running(tmp_path, test_key, stack="patterns", max_inflight_mb=2) as service:
        with held_requests(monkeypatch) as started:
            thread, first = in_background(post, service, patient(text))
            assert started.acquire(timeout=30)
            resp = post(service, patient(text), service["other"])
            assert_outcome(resp, 503)
            assert int(resp.headers["retry-after"]) > 0
        thread.join(60)
        assert first["resp"].status_code == 200
        assert post(service, patient(text), service["other"]).status_code == 200  # the budget is free again


def test_a_client_over_its_limit_is_429_while_another_client_is_served(tmp_path, test_key, monkeypatch):
    with running(tmp_path, test_key, stack="patterns", workers=2, per_client_concurrency=1,
                 per_client_queue=0) as service:
        with held_requests(monkeypatch) as started:
            thread, first = in_background(post, service, patient())
            assert started.acquire(timeout=30)
            resp = post(service, patient())
            assert_outcome(resp, 429)
            assert int(resp.headers["retry-after"]) > 0
            _, other = in_background(post, service, patient(), service["other"])
            assert started.acquire(timeout=30)  # the other client's request got the second worker
        thread.join(60)
        assert first["resp"].status_code == 200


def raw_request(port: int, head: bytes, wait: float) -> bytes:
    """What the server sends back on a connection given `head` then nothing, until it closes or `wait` passes."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head)
        s.settimeout(wait)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except socket.timeout:
            got += b"<still open>"
        return got


def test_a_body_that_does_not_arrive_in_time_is_408(tmp_path, test_key):
    with running(tmp_path, test_key, stack="patterns", body_timeout_s=1.0) as service:
        head = (f"POST /fhir/$de-identify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {service['token']}\r\n"
                "Content-Type: application/fhir+json\r\nContent-Length: 1000\r\n\r\n{\"resourceType\"").encode()
        answer = raw_request(service["port"], head, 8.0)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_a_connection_whose_headers_do_not_arrive_is_closed(tmp_path, test_key):
    with running(tmp_path, test_key, stack="patterns", http=with_header_timeout(0.5)) as service:
        started = time.monotonic()
        answer = raw_request(service["port"], b"POST /fhir/$de-identify HTTP/1.1\r\nHost: x\r\n", 8.0)
        assert answer == b"" and time.monotonic() - started < 5
        with httpx.Client(base_url=service["base"]) as client:  # kept alive: served, then idle, then closed
            assert client.get("/healthz").status_code == 200
            assert client.get("/healthz").status_code == 200


def test_serve_caps_connections(tmp_path, test_key_file):
    with serve(tmp_path, test_key_file, "--stack", "patterns", "--max-connections", "2") as server:
        with socket.create_connection(("127.0.0.1", int(server["base"].rsplit(":", 1)[1]))):
            time.sleep(0.2)
            assert httpx.get(server["base"] + "/healthz").status_code == 503  # the idle one counts
        time.sleep(0.2)
        assert httpx.get(server["base"] + "/healthz").status_code == 200
