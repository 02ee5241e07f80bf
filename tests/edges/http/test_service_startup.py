"""`serve` says where it listens (address, port, profile, stack, key id; never the key) as soon as it does, and its
counts when it stops (SIGTERM: exit 0); a port in use is exit 2 naming it, not exit 3 (the leak guard's)."""
from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx

from adapter.http.auth import add_client
from tests.conftest import DATA, ROOT, TEST_SECRET, run_cli

LISTENING = re.compile(r"^deid-adapter serve: listening on http://127\.0\.0\.1:(\d+) "
                       r"\(profile safe-harbor, stack patterns, key k-c271300f3a22\)$", re.M)


def test_serve_says_where_it_listens_and_what_it_did(tmp_path, test_key_file):
    token = add_client(tmp_path / "tokens.json", "tests", ["fhir"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "adapter.cli", "serve", "--port", "0", "--tokens",
                                 str(tmp_path / "tokens.json"), "--key-file", str(test_key_file), "--stack", "patterns",
                                 "--audit", "off"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (found := LISTENING.search(log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        base = f"http://127.0.0.1:{found.group(1)}"
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200  # it listens where it says, already
        patient = (DATA / "fhir" / "hl7-r4-examples" / "Patient-example.json").read_bytes()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/fhir+json"}
        assert httpx.post(base + "/fhir/$de-identify", content=patient, headers=headers, timeout=60).status_code == 200
        assert httpx.post(base + "/fhir/$de-identify", content=b"{", headers=headers, timeout=60).status_code == 400
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    text = log.read_text()
    assert code == 0, text
    assert text.strip().splitlines()[-1] == \
        "deid-adapter serve: stopped; 2 $de-identify request(s) answered (1 2xx, 1 4xx), 0 record(s) refused"
    assert base64.b64encode(TEST_SECRET).decode() not in text and "Chalmers" not in text


def test_a_port_in_use_is_exit_2_naming_it(tmp_path, test_key_file):
    add_client(tmp_path / "tokens.json", "tests", ["fhir"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("serve", "--port", str(port), "--tokens", str(tmp_path / "tokens.json"), "--stack", "patterns",
                       "--audit", "off", key_file=test_key_file)
    assert proc.returncode == 2, proc.stderr
    assert f"port {port} is in use" in proc.stderr and "Traceback" not in proc.stderr
    assert "listening on" not in proc.stderr
