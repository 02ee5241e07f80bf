"""A command imports only what it needs: the CLI's modules load no model framework, no database layer, no web
framework and not presidio (spaCy); a wrong argument is answered before any model loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import DATA, ROOT

HEAVY = ("torch", "transformers", "sqlalchemy", "fastapi", "uvicorn", "presidio_analyzer", "spacy")
HL7 = DATA / "hl7v2" / "ADT-A01-01.hl7"

# Runs the CLI in this interpreter and, at exit, prints which of HEAVY it imported as the last line on stderr.
RUN = ("import atexit, json, sys\n"
       "atexit.register(lambda: print(json.dumps([m for m in {heavy!r} if m in sys.modules]), file=sys.stderr))\n"
       "sys.argv = ['deid-adapter', *{args!r}]\n"
       "from adapter.cli.main import main\n"
       "main()\n")


def loaded_by(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + f"\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"],
                         cwd=ROOT, capture_output=True, text=True, check=True, env=env())
    return json.loads(out.stdout.splitlines()[-1])


def env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}


def run(*args: str, key_file, state=None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The CLI's run and the heavy libraries it imported; `state`: where the default audit store is made."""
    environment = env() | {"DEID_ADAPTER_KEY_FILE": str(key_file), "XDG_STATE_HOME": str(state or "/nonexistent")}
    proc = subprocess.run([sys.executable, "-c", RUN.format(heavy=HEAVY, args=list(args))], cwd=ROOT, env=environment,
                          capture_output=True, text=True)
    return proc, json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["adapter.cli", "adapter.cli.main", "adapter.cli.hl7", "adapter.cli.fhir",
                                    "adapter.cli.text", "adapter.cli.auditing"])
def test_the_cli_modules_import_no_heavy_library(module):
    assert loaded_by(f"import json, sys, {module}") == []


def test_one_message_with_the_patterns_stack_and_no_audit_store_loads_none_of_them(tmp_path, test_key_file):
    proc, loaded = run("hl7", str(HL7), str(tmp_path / "out.hl7"), "--stack", "patterns", "--audit", "off",
                       "--today", "2026-01-15", key_file=test_key_file)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out.hl7").exists() and loaded == []


def test_the_default_audit_store_loads_the_database_layer_only(tmp_path, test_key_file):
    proc, loaded = run("hl7", str(HL7), str(tmp_path / "out.hl7"), "--stack", "patterns", "--today", "2026-01-15",
                       key_file=test_key_file, state=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "state" / "deid-adapter" / "audit.sqlite").exists() and loaded == ["sqlalchemy"]


@pytest.mark.parametrize("wrong", [["MISSING"], ["IN", "--today", "2026-13-45"], ["IN", "--profile", "no-such"]])
def test_a_wrong_argument_exits_2_before_a_model_loads(tmp_path, test_key_file, wrong):
    source = str(tmp_path / "missing.hl7") if wrong[0] == "MISSING" else str(HL7)
    proc, loaded = run("hl7", source, str(tmp_path / "out.hl7"), "--stack", "no-llm", "--audit", "off", *wrong[1:],
                       key_file=test_key_file)
    assert proc.returncode == 2 and "deid-adapter:" in proc.stderr
    assert not {"torch", "transformers"} & set(loaded)
    assert not (tmp_path / "out.hl7").exists()
