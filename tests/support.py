"""What several test files share: stores, servers, fixtures' builders (conftest.py holds the fixtures)."""
from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import httpx
from fhir.resources.R4B import get_fhir_model_class
import pytest
import uvicorn
from sqlalchemy import create_engine, text

from adapter.audit.trail import AuditTrail, database_url
from adapter.bulk.export import deidentify_export
from adapter.http.auth import add_client
from adapter.review.app import ReviewConfig
from adapter.review.auth import UserStore, add_user
from adapter.review.flow import route
from adapter.review.queue import ReviewQueue, Thresholds
from fhir_transforms import keys
from fhir_transforms.keys import Key, key_id_for
from tests.conftest import DATA, FIXED_TODAY, TEST_SECRET, make_engine, run_cli
from text_deid.spans import Span

# --- Audit stores for the audit tests: a SQLite file, and a throwaway schema on a real PostgreSQL server.
PG_URL = os.environ.get("DEID_ADAPTER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def audit_key(seed: int = 7) -> Key:
    secret = bytes([seed]) * 32
    return Key(key_id_for(secret, "audit"), secret)


def _postgres_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh, empty audit store URL on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'audit.sqlite'}"
        return
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    schema = f"deid_audit_test_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as e:  # noqa: BLE001 — any connection failure means: no server here
        admin.dispose()
        pytest.skip(f"PostgreSQL at {PG_URL} does not answer ({type(e).__name__}); set DEID_ADAPTER_TEST_PG")
    try:
        yield _postgres_url(schema)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def dump(url: str) -> bytes:
    """Every value of every table in the store, as text: what a canary search reads."""
    engine = create_engine(url)
    parts = []
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            tables = [r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")]
        else:
            tables = [r[0] for r in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"))]
        for t in tables:
            for row in conn.exec_driver_sql(f'SELECT * FROM "{t}"'):
                parts.append(repr(tuple(row)))
    engine.dispose()
    return "\n".join(parts).encode()


# --- What the bulk tests share: the sample export, one reference run (local engine, one worker), an export with
SAMPLE = DATA / "fhir" / "bulk-ndjson"
TODAY = FIXED_TODAY.isoformat()
_REFERENCE: dict[str, Path] = {}


def run_bulk(out: Path, root: Path = SAMPLE, **options) -> Path:
    """A bulk run with the fixed test key and day; the log goes nowhere."""
    options.setdefault("today", TODAY)
    options.setdefault("stack", "patterns")
    deidentify_export(root, out, TEST_SECRET, tty=False, log=lambda m: None, **options)
    return out


def reference_output(tmp_path_factory) -> Path:
    """The sample de-identified once per session by the local engine with one worker (the bytes others must match)."""
    if "ref" not in _REFERENCE:
        _REFERENCE["ref"] = run_bulk(tmp_path_factory.mktemp("bulk-reference") / "out", workers=1)
    return _REFERENCE["ref"]


def refusing_export(tmp_path: Path) -> tuple[Path, str]:
    """The sample with one Condition (line 6) that must be refused (an unknown modifierExtension); and its id."""
    root = tmp_path / "in"
    shutil.copytree(SAMPLE, root)
    condition = json.loads((SAMPLE / "Condition.000.ndjson").read_text().splitlines()[5])
    condition["modifierExtension"] = [{"url": "http://example.org/unknown-modifier", "valueBoolean": True}]
    lines = (root / "Condition.000.ndjson").read_text().splitlines()
    lines[5] = json.dumps(condition)
    (root / "Condition.000.ndjson").write_text("\n".join(lines) + "\n")
    return root, condition["id"]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (hidden work files included), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_tree(actual: Path, expected: Path, context: str = "") -> None:
    a, e = tree(actual), tree(expected)
    assert sorted(a) == sorted(e), context
    differing = [name for name in e if a[name] != e[name]]
    assert not differing, f"files differ: {differing} {context}"


# --- A review setup for tests: review key, queue, users, thresholds, engine, and a record the thresholds hold.
NOTE = "Seen on 03/14/2025 by Dr. Alvarez; call 617-555-0142. Lives with Quentin Marsh in Brookline."
THRESHOLDS = {"thresholds": {"DATE": 0.95, "PHONE_NUMBER": 0.95, "NAME": 0.85}, "default": 0.0}
PASSWORDS = {"rita": "rita-pass-1", "adam": "adam-pass-1", "otto": "otto-pass-1"}


def observation(note: str = NOTE, family: str = "") -> dict:
    res = {"resourceType": "Observation", "status": "final", "code": {"text": "Progress note"},
           "note": [{"text": note}]}
    if family:
        res["contained"] = [{"resourceType": "Patient", "id": "p1", "name": [{"family": family}]}]
        res["subject"] = {"reference": "#p1"}
    return res


@dataclass
class ReviewSetup:
    root: Path
    queue: ReviewQueue
    review_key: keys.Key
    trail: AuditTrail
    thresholds: Thresholds
    users_file: Path
    out_dir: Path
    engine: object

    def config(self) -> ReviewConfig:
        return ReviewConfig(self.queue, UserStore.load(self.users_file), self.engine, self.thresholds, self.out_dir,
                            self.trail)

    def hold(self, resource: dict | None = None, site: str = "north") -> str:
        routed = route(self.engine, resource or observation(), "Observation", self.thresholds, self.queue, site)
        assert routed.held
        return routed.held_id


def make_setup(root: Path, test_key, queue_url: str | None = None) -> ReviewSetup:
    root.mkdir(parents=True, exist_ok=True)
    keys.init_key_file(root / "review.key", "review")
    review_key = keys.load_key(root / "review.key", "review")
    audit_key = root / "audit.key"
    keys.init_key_file(audit_key, "audit")
    trail = AuditTrail(database_url(root / "audit.sqlite"), [keys.load_key(audit_key, "audit")])
    queue = ReviewQueue(queue_url or database_url(root / "review.sqlite"), review_key)
    users = root / "users.json"
    add_user(users, "rita", "reviewer", "north", PASSWORDS["rita"])
    add_user(users, "adam", "admin", "north", PASSWORDS["adam"])
    add_user(users, "otto", "reviewer", "south", PASSWORDS["otto"])
    out = root / "released"
    out.mkdir()
    return ReviewSetup(root, queue, review_key, trail, Thresholds.from_json(THRESHOLDS), users, out,
                       make_engine(test_key))


def secrets_of(setup: ReviewSetup, test_key) -> list[str]:
    """Every written form of the keys a page must never carry."""
    out = []
    for k in (setup.review_key, test_key):
        out += [base64.b64encode(k.secret).decode(), k.secret.hex()]
    return out


class LiveServer:
    """The review app on a free port of 127.0.0.1, in a thread (a real socket, for the browser)."""

    def __init__(self, app):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("review server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)


def released_text(setup: ReviewSetup, item_id: str) -> str:
    return json.loads((setup.out_dir / f"{item_id}.json").read_text())["note"][0]["text"]


# --- A scripted Ollama server for tests: a real HTTP server on 127.0.0.1 speaking /api/chat, /api/tags and
@dataclass
class Rule:
    contains: str
    answer: object
    misbehave: str | None
    delay: float
    times: int | None


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up before its answer is written (a detector that stopped waiting) is not the stub's
    error: socketserver would print its traceback on stderr, where a command's captured output holds it."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class OllamaStub:
    def __init__(self, model: str = "stub-model:latest", thinking: bool = True):
        self.model, self.thinking = model, thinking
        self.rules: list[Rule] = []
        self.requests: list[dict] = []  # every /api/chat body, in arrival order
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/api/tags":
                    self._json(200, {"models": [{"model": stub.model, "name": stub.model, "size": 1,
                                                 "digest": "0" * 64, "modified_at": "2026-01-01T00:00:00Z"}]})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if self.path == "/api/show":
                    if body.get("model") not in (stub.model, stub.model.removesuffix(":latest")):
                        return self._json(404, {"error": "model not found"})
                    return self._json(200, {"capabilities": ["completion"] + ["thinking"] * stub.thinking,
                                            "modelfile": "", "template": "", "details": {}, "model_info": {}})
                if self.path != "/api/chat":
                    return self._json(404, {"error": "not found"})
                with stub._lock:
                    stub.requests.append(body)
                stub._reply(self, body)

            def _json(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.Handler = Handler
        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> OllamaStub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, contains: str, items=None, *, misbehave: str | None = None, delay: float = 0.0,
               times: int | None = None, raw: object = None) -> None:
        """When the prompt contains `contains`: answer `items` ([(text, type)]) or `raw` (any JSON), or misbehave.
        Rules are tried in the order given; one with `times` stops applying after that many uses."""
        answer = raw if raw is not None else {"items": [{"text": t, "type": c} for t, c in (items or [])]}
        self.rules.append(Rule(contains, answer, misbehave, delay, times))

    def verdict(self, contains: str, verdict: str) -> None:
        """Second-opinion answer for questions containing `contains`."""
        self.answer(contains, raw={"verdict": verdict})

    def prompts(self) -> list[str]:
        """The last user message of each chat request received."""
        return [_prompt(r) for r in self.requests]

    def _rule(self, prompt: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.contains in prompt and rule.times != 0:
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return None

    def _reply(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        rule = self._rule(_prompt(body))
        second_opinion = "verdict" in json.dumps(body.get("format") or {})
        answer = rule.answer if rule else ({"verdict": "UNSURE"} if second_opinion else {"items": []})
        misbehave = rule.misbehave if rule else None
        if rule and rule.delay:
            time.sleep(rule.delay)
        if misbehave == "500":
            return handler._json(500, {"error": "model runner crashed"})
        if misbehave == "reset":
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.connection.close()
            handler.close_connection = True
            return
        content = json.dumps(answer)
        done_reason = "stop"
        if misbehave == "invalid-json":
            content = '{"items": [{"text": "unterminated'
        elif misbehave == "length":
            content, done_reason = content[: len(content) // 2], "length"
        handler._json(200, {"model": body.get("model"), "created_at": "2026-01-01T00:00:00Z",
                            "message": {"role": "assistant", "content": content}, "done": True,
                            "done_reason": done_reason, "prompt_eval_count": 100, "eval_count": 10})


def _prompt(body: dict) -> str:
    users = [m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user"]
    return users[-1] if users else ""


# --- A real `deid-adapter serve` on a free port, for tests that need the HTTP service with settings of their own.
FHIR = {"Content-Type": "application/fhir+json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(workdir: Path, key_file: Path, *args: str) -> Iterator[dict]:
    """The service, started with `args` (e.g. --stack patterns) and an audit trail in `workdir`; yields its base URL,
    a bearer token for every operation, its process, log and audit store."""
    token = add_client(workdir / "tokens.json", "tests", ["fhir", "hl7v2", "metadata", "metrics", "ready"])
    audit_key = workdir / "audit.key"
    assert run_cli("keys", "init", "--purpose", "audit", str(audit_key)).returncode == 0
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    with open(workdir / "server.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "adapter.cli", "serve", "--port", str(port), "--tokens", str(workdir / "tokens.json"),
             "--key-file", str(key_file), "--today", "2026-01-15", "--audit", str(workdir / "audit.sqlite"),
             "--audit-key-file", str(audit_key), *args],
            cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            else:
                raise RuntimeError("server did not start: " + (workdir / "server.log").read_text()[-2000:])
            yield {"base": base, "token": token, "dir": workdir, "log": workdir / "server.log", "proc": proc,
                   "audit": workdir / "audit.sqlite", "audit_key": audit_key}
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def post(server: dict, doc, token: str | None = None, headers: dict = FHIR, path: str = "/fhir/$de-identify",
         timeout: float = 120) -> httpx.Response:
    """POST a body (bytes, text, or a resource as a dict) to the service, with the server's token or `token`."""
    body = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    return httpx.post(server["base"] + path, content=body, timeout=timeout,
                      headers={**headers, "Authorization": f"Bearer {token or server['token']}"})


def assert_outcome(resp: httpx.Response, status: int) -> dict:
    """The response's body, after checking it is a valid FHIR OperationOutcome with `status`."""
    assert resp.status_code == status, resp.text[:500]
    assert resp.headers["content-type"].startswith("application/fhir+json")
    body = resp.json()
    get_fhir_model_class("OperationOutcome").model_validate(body)
    return body


class FlagsEveryText:
    """A text stack that marks the first word of every text it is given as a NAME, and remembers the texts:
    what it did not see was not sent through the stack."""

    name = "flags-every-text"

    def __init__(self):
        self.seen: list[str] = []

    def detect_many(self, texts, known, timings=None):
        self.seen.extend(texts)
        return [[Span(0, len(t.split()[0]), "NAME", 1.0, "test")] if t.split() else [] for t in texts]
