"""A scripted Ollama server for tests: a real HTTP server on 127.0.0.1 speaking /api/chat, /api/tags and
/api/show, answering per prompt from a script, and misbehaving on request.

    with OllamaStub() as ollama:
        ollama.answer("Ingrid", [("Ingrid Vasquez", "NAME")])         # when the note contains "Ingrid"
        ollama.answer("Tessaly", misbehave="500", times=1)             # fail once, then fall through
        LlmDetector(LlmSettings(ollama.url, ollama.model)).detect(...)

Misbehaviours: "slow" (sleep `delay` seconds, then answer), "500", "reset" (close the connection with a
TCP reset), "invalid-json" (content that is not JSON), "length" (cut content, done_reason "length").
Scripted answers can be anything (invented or reworded text, answers for overlapping chunks).
The prompt matched is the last user message, i.e. the chunk or the second-opinion question.
"""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Rule:
    contains: str
    answer: object
    misbehave: str | None
    delay: float
    times: int | None


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
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
