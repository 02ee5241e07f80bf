"""Every command of the README's "One example per entry point" runs as the README writes it, one after another in
one shell, from a copy of the repository's examples: each exit code is checked. A command ending in `&` (a server)
is started, waited for until it says it listens, and stopped with SIGTERM at the end of its block, exit 0. The MLLP
listener forwards to a test receiver on the README's downstream port."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.edges.mllp.test_mllp_send import receiver

README = ROOT / "README.md"
SECTION = ("## One example per entry point", "## Documentation")
PORTS = (8080, 8090, 2575, 2576)  # the README's: serve, review serve, mllp, its downstream
DOWNSTREAM = 2576
PASSWORD = "a-long-review-passphrase-1"


def readme_commands() -> list[list[str]]:
    """The section's code blocks, each a list of commands (a line ending in a backslash joined with the next)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index(SECTION[0]):text.index(SECTION[1])]
    blocks = []
    for block in re.findall(r"^```\n(.*?)^```", section, flags=re.S | re.M):
        blocks.append([c.strip() for c in re.sub(r"\\\n\s*", "", block).splitlines() if c.strip()])
    return blocks


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _other_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script(blocks: list[list[str]], ports: dict[int, int]) -> str:
    """One bash script: each command as written (the README's ports swapped only where one is taken on this
    machine), its exit code recorded; servers started in the background, waited for, and stopped at the end
    of their block."""
    lines = ["set -u", "codes=codes.txt", ": > $codes",
             "wait_ready() { for _ in $(seq 1200); do grep -qE 'listening on|review page on' $1 && return 0; "
             "sleep 0.1; done; return 1; }"]
    n = 0
    for block in blocks:
        servers = []
        for command in block:
            for readme_port, port in ports.items():
                command = re.sub(rf"(?<=[: ]){readme_port}\b", str(port), command)
            n += 1
            if command.endswith("&"):
                lines.append(f"{command[:-1].rstrip()} > server-{n}.log 2>&1 &")
                lines.append(f"pid_{n}=$!; wait_ready server-{n}.log; echo \"{n} start $? \" >> $codes")
                servers.append(n)
            else:
                lines.append(f"{command}\necho \"{n} exit $? \" >> $codes")
        for s in servers:
            lines.append(f"kill -TERM $pid_{s}; wait $pid_{s}; echo \"{s} stop $? \" >> $codes")
    return "\n".join(lines) + "\n"


def test_the_readme_examples_name_only_what_the_repository_ships():
    commands = [c for block in readme_commands() for c in block]
    assert len(commands) >= 20
    named = {p for c in commands for p in re.findall(r"@?(examples/[\w./*-]+)", c)}
    assert named and all(list(ROOT.glob(p.lstrip("@"))) for p in named), named
    for entry in ("fhir", "hl7", "serve", "mllp", "mllp send", "bulk", "text redact", "eval", "review fhir", "risk",
                  "audit verify"):
        assert any(f"{c} ".startswith(f"deid-adapter {entry} ") for c in commands), entry


@pytest.mark.skipif(not shutil.which("curl"), reason="the README's HTTP example uses curl")
def test_every_readme_command_runs_as_written(tmp_path):
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("output", "*.key"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "deid-adapter"  # the installed entry point, for this checkout and interpreter
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m adapter.cli \"$@\"\n")
    wrapper.chmod(0o755)
    ports = {p: (p if _free(p) else _other_port()) for p in PORTS}
    blocks = readme_commands()
    (work / "readme.sh").write_text(script(blocks, ports))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ROOT))
    with receiver(port=ports[DOWNSTREAM]) as downstream:  # the MLLP listener's downstream
        done = subprocess.run(["bash", "readme.sh"], cwd=work, env=env, input=PASSWORD + "\n", capture_output=True,
                              text=True, timeout=900)
    codes = [line.split() for line in (work / "codes.txt").read_text().splitlines()]
    commands = [c for block in blocks for c in block]
    failed = [(commands[int(n) - 1], what, code) for n, what, code in codes if code != "0"]
    logs = "".join(p.read_text()[-1500:] for p in sorted(work.glob("server-*.log")))
    assert not failed and done.returncode == 0, (failed, done.stderr[-4000:], logs)
    assert len([c for c in codes if c[1] in ("exit", "start")]) == len(commands)
    assert len(downstream.messages) == len(list((ROOT / "examples" / "hl7").glob("*.hl7")))
    for out in ("fhir/patient-bundle.json", "hl7/oru-r01-note.hl7", "bulk/manifest.json", "redacted.jsonl",
                "http.json", "risk.html", "disclosures.csv"):
        assert (work / "out" / out).is_file(), out
