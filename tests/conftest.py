"""Shared fixtures: a fixed test key (golden files depend on it), the sample data in tests/data, the CLI."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from fhir_transforms.keys import Key, key_id_for, load_key
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.rules import load_profile
from text_deid.stack import build_stack

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"  # a few files of each sample corpus, in the repository (tests/data/SOURCES.md)
# The full sample and peer corpora and the independent leak checkers beside a development checkout (../shared):
# a clone has none, so the tests that measure on them are skipped there.
SHARED = ROOT.parent / "shared" / "data"
SHARED_TOOLS = ROOT.parent / "shared" / "tools"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="measures on the full sample and peer corpora of "
                                  "../shared/data, which is not beside this checkout")
needs_shared_tools = pytest.mark.skipif(not SHARED_TOOLS.is_dir(), reason="runs the independent leak checker of "
                                        "../shared/tools, which is not beside this checkout")
CASES = ROOT / "tests" / "cases"  # golden files and refused cases
TEST_SECRET = bytes(range(32))  # a fixed, public test key: golden files are made with it
FIXED_TODAY = date(2026, 1, 15)


def write_key(path: Path, secret: bytes) -> Path:
    path.write_text(json.dumps({"version": 1, "key_id": key_id_for(secret), "secret": base64.b64encode(secret).decode()}))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session", autouse=True)
def audit_state_home(tmp_path_factory):
    """Commands record their audit trail (default ~/.local/state/deid-adapter) in a temporary folder, not the user's."""
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield Path(os.environ["XDG_STATE_HOME"])
    if previous is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = previous


@pytest.fixture(scope="session")
def test_key_file(tmp_path_factory) -> Path:
    return write_key(tmp_path_factory.mktemp("keys") / "test.key", TEST_SECRET)


@pytest.fixture(scope="session")
def other_key_file(tmp_path_factory) -> Path:
    return write_key(tmp_path_factory.mktemp("keys") / "other.key", bytes(range(100, 132)))


@pytest.fixture(scope="session")
def test_key(test_key_file) -> Key:
    return load_key(test_key_file)


def make_engine(key: Key, profile: str = "safe-harbor", validate: bool = True, today: date = FIXED_TODAY) -> Deidentifier:
    return Deidentifier(load_profile(profile), Pseudonymizer(key), build_stack("patterns"), lambda: today, validate)


@pytest.fixture
def engine(test_key) -> Deidentifier:
    return make_engine(test_key)


def run_cli(*args: str, key_file: Path | None = None, check: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEID_ADAPTER_")}
    if key_file:
        env["DEID_ADAPTER_KEY_FILE"] = str(key_file)
    proc = subprocess.run([sys.executable, "-m", "adapter.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def independent_leak_check(tool: str, given: Path, written: Path) -> tuple[int, dict] | None:
    """The independent checker `tool` of ../shared/tools (fhir_leak.py, hl7_leak.py) on the input and output
    folders: its exit code and JSON line; None where the checker is not beside this checkout."""
    path = SHARED_TOOLS / tool
    if not path.is_file():
        return None
    done = subprocess.run([sys.executable, str(path), str(given), str(written)], capture_output=True, text=True)
    return done.returncode, json.loads(done.stdout)
