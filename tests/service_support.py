"""A real `deid-adapter serve` on a free port, for tests that need the HTTP service with settings of their own."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from adapter.service_auth import add_client
from tests.conftest import run_cli

FHIR = {"Content-Type": "application/fhir+json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(workdir: Path, key_file: Path, *args: str) -> Iterator[dict]:
    """The service, started with `args` (e.g. --stack patterns); yields its base URL and a bearer token."""
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
            yield {"base": base, "token": token}
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def post(server: dict, body: bytes, timeout: float = 120) -> httpx.Response:
    """POST a FHIR resource to $de-identify."""
    return httpx.post(server["base"] + "/fhir/$de-identify", content=body, timeout=timeout,
                      headers={**FHIR, "Authorization": f"Bearer {server['token']}"})
