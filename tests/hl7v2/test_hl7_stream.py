"""Long HL7v2 messages are written a window of segments at a time (issue #36 item 3): the same bytes and findings
as the whole message read at once, errors alike, and memory for a window instead of for the message."""
from __future__ import annotations

import dataclasses
import io
import tracemalloc
from pathlib import Path

import pytest

from fhir_transforms.errors import InputError, RecordRefused
from fhir_transforms.hl7v2 import stream
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.message import encode
from fhir_transforms.hl7v2.rules import load_hl7_profile
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import FIXED_TODAY, run_cli
from text_deid.stack import build_stack

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*(ROOT / "tests" / "data" / "hl7v2").rglob("*.hl7"), *(ROOT / "examples" / "hl7").glob("*.hl7"),
                ROOT / "tests" / "cases" / "methods" / "hl7v2" / "message.hl7"])
MSH = "MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240101120000||ORU^R01^ORU_R01|CTRL1|P|2.5.1"
PID = "PID|1||MRN4471902^^^HOSP^MR||Zyxwvut^Qqqplanted||19700312|F|||12 Qwerty Lane^^Springfield^IL^62704||(217)555-0199"


def _synthetic() -> dict[str, str]:
    """Messages whose windows cut through what a message shares: runs of note lines, a patient named late, a
    name split over two NTE segments, characters MSH-18 does not hold, an envelope, a leak, bad input."""
    obx = "".join(f"OBX|{n}|NM|2345-7^Glucose^LN||{80 + n}|mg/dL\r" for n in range(1, 6))
    note = "".join(f"OBX|{n}|TX|11506-3^Progress note^LN|1|"
                   + (f"vut, {n} noted\r" if n % 2 else f"line {n} Qqqplanted seen by Zyxw\r")
                   for n in range(6, 12))  # the surname Zyxwvut split over two lines, three times
    split = "NTE|1||seen with Kowa\rNTE|2||lczyk today, call (217)555-0199\r"
    nk1 = "NK1|1|Kowalczyk^Anna|SPO\r"
    return {
        "runs of lines": f"{MSH}\r{PID}\rOBR|1\r{obx}{note}{obx}{note.replace('|1|', '|2|')}NTE|1||Zyxwvut called\r",
        "named late": f"{MSH}\rOBR|1\r{obx}{note}{PID}\r{nk1}{split}{obx}",
        "split name": f"{MSH}\r{PID}\r{nk1}{obx}{split}{obx}{split}",
        "latin-1 label, other text": f"{MSH}|||||||8859/1\r{PID}\r{obx}NTE|1||Überweisung an Łódź für Qqqplanted\r{obx}",
        "no label, non-ASCII": f"{MSH}\r{PID}\r{obx}NTE|1||café für Zyxwvut\r{obx}",
        "envelope": f"FHS|^~\\&|APP|||||||for Qqqplanted\rBHS|^~\\&\r{MSH}\r{PID}\r{obx}{note}BTS|1\r{MSH}\r{obx}FTS|1\r",
        "a Z-segment names the patient": f"{MSH}\r{PID}\r{obx}ZXX|1|Zyxwvut, born 197003120815\r{obx}ZXX|2|Qqqplanted\r",
        "outside a message": f"PID|1\r{MSH}\r",
        "bad segment": f"{MSH}\r{obx}P!D|1\r",
    }


class Blind:
    """A text stack that finds nothing: what survives is the leak guard's to refuse."""

    def detect_many(self, texts, known):
        return [[] for _ in texts]


@pytest.fixture(scope="module")
def deid(test_key) -> HL7Deidentifier:
    return HL7Deidentifier(load_hl7_profile("safe-harbor"), Pseudonymizer(test_key), build_stack("patterns"),
                           lambda: FIXED_TODAY)


@pytest.fixture(scope="module")
def blind(deid) -> HL7Deidentifier:
    return dataclasses.replace(deid, stack=Blind())


def _whole(deid: HL7Deidentifier, text: str):
    try:
        result = deid.deidentify_file(text)
        return encode(result.text), result.findings
    except (InputError, RecordRefused) as e:
        return type(e).__name__, str(e)


def _streamed(deid: HL7Deidentifier, text: str, window: int):
    out = io.BytesIO()
    try:
        written = stream.write_file(deid, text, out, window)
        return out.getvalue(), written.findings
    except (InputError, RecordRefused) as e:
        return type(e).__name__, str(e)


CASES = {**{p.name: p.read_bytes() for p in FILES}, **{k: v.encode() for k, v in _synthetic().items()}}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_message_written_in_windows_is_the_message_written_whole(deid, blind, name):
    for engine in (deid, blind):
        text = engine.read(CASES[name]).text
        whole = _whole(engine, text)
        for window in (1, 2, 3, 7):
            assert _streamed(engine, text, window) == whole, window


def _message(engine: HL7Deidentifier, text: str, window: int | None = None):
    try:
        result = (engine.deidentify_with_findings(text) if window is None
                  else stream.deidentify_message(engine, text, window))
        return result.text, result.findings
    except (InputError, RecordRefused) as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_message_in_windows_is_the_message_whole_as_mllp_gets_it(deid, blind, name):
    for engine in (deid, blind):
        text = engine.read(CASES[name]).text
        whole = _message(engine, text)
        for window in (1, 3):
            assert _message(engine, text, window) == whole, window


def test_the_synthetic_cases_cover_what_they_name(deid, blind):
    """The cases above are not vacuous: names masked over windows, refusals, bad input, a rewritten MSH-18."""
    out = {k: _whole(deid, deid.read(v.encode()).text) for k, v in _synthetic().items()}
    assert out["outside a message"][0] == "InputError" and out["bad segment"][0] == "InputError"
    for name in ("runs of lines", "named late", "split name", "envelope", "a Z-segment names the patient"):
        data = out[name][0]
        assert isinstance(data, bytes) and b"[NAME]" in data
        assert not any(part in data for part in (b"Qqqplanted", b"Zyxw", b"lczyk", b"555-0199", b"19700312"))
    assert b"UNICODE UTF-8" in out["no label, non-ASCII"][0].split(b"\r")[0]
    assert b"UNICODE UTF-8" in out["latin-1 label, other text"][0].split(b"\r")[0]  # Ł is not in 8859/1
    refused = _whole(blind, _synthetic()["a Z-segment names the patient"])
    assert refused[0] == "LeakFound" and "3 known identifier(s)" in refused[1] and "Zyxwvut" not in refused[1]


def _long_message(segments: int) -> str:
    return (f"{MSH}\r{PID}\rOBR|1\r"
            + "".join(f"OBX|{n}|NM|2345-7^Glucose^LN||{80 + n % 60}|mg/dL\r" for n in range(segments - 4))
            + "NTE|1||Qqqplanted Zyxwvut was seen\r")


def test_a_long_message_takes_memory_for_a_window_not_for_the_message(deid):
    text = _long_message(30_000)
    peaks = {}
    for how in ("whole", "streamed"):
        tracemalloc.start()
        if how == "whole":
            encode(deid.deidentify_file(text).text)
        else:
            stream.write_file(deid, text, io.BytesIO(), window=500)
        peaks[how] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # the BytesIO holds the output (about the input's size); whole, the parse alone is tens of times the input
    assert peaks["whole"] > 20 * len(text)
    assert peaks["streamed"] < 4 * len(text)


def test_the_cli_writes_a_long_message_as_the_engine_writes_it_whole(deid, tmp_path, test_key_file):
    given = tmp_path / "long.hl7"
    given.write_text(_long_message(stream.WINDOW * 2 + 17), newline="")
    written = tmp_path / "out" / "long.hl7"
    done = run_cli("hl7", str(given), str(written), "--stack", "patterns", "--today", FIXED_TODAY.isoformat(),
                   key_file=test_key_file)
    assert done.returncode == 0, done.stderr
    assert written.read_bytes() == encode(deid.deidentify_file(given.read_bytes().decode()).text)
    assert b"Qqqplanted" not in written.read_bytes()


def test_the_cli_writes_nothing_of_a_file_whose_last_message_fails_after_a_long_one(tmp_path, test_key_file):
    given = tmp_path / "long.hl7"
    bad = f"{MSH}\rOBX|1|ED|11506-3^Note^LN||^TEXT^PLAIN^Base64^@@not base64 Qqqplanted\r"
    given.write_bytes((_long_message(stream.WINDOW * 2) + bad).encode())
    done = run_cli("hl7", str(given), str(tmp_path / "out"), "--stack", "patterns", key_file=test_key_file)
    assert done.returncode == 2 and "not valid base64" in done.stderr
    assert not (tmp_path / "out").exists() or not any(p.is_file() for p in (tmp_path / "out").rglob("*"))
    assert "Qqqplanted" not in done.stderr
