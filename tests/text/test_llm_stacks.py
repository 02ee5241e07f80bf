"""The LLM stacks and the second opinion against the scripted Ollama server, and through the CLI."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapter.cli.main import app
from tests.conftest import run_cli
from tests.support import OllamaStub
from text_deid import stack as stack_module
from text_deid.detectors.llm import LlmSettings
from text_deid.second_opinion import SecondOpinion
from text_deid.spans import DetectorError, Span
from text_deid.stack import STACK_FILTERS, STACKS, StackUnavailable, build_stack
from text_deid.spans import KnownIdentifier
from text_deid.prompts import load

MODEL = "stub-model"
NOTE = ("Quillan Zyxwortel, call 503-555-0187, seen at Hollis Creek Clinic in Brimwood by Osei. "
        "Parkinson disease, stable. Lives with Danika.")
PATIENT = {"resourceType": "Patient", "id": "p-zyx", "name": [{"family": "Zyxwortel", "given": ["Quillan"]}],
           "text": {"status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{NOTE}</div>'}}


def at(text: str, covered: str, category: str, detector: str) -> Span:
    start = text.index(covered)
    return Span(start, start + len(covered), category, detector)


class FakeNer:
    """Stands in for the clinical NER: reports fixed texts of the note."""

    name = "ner"
    reports = [("Quillan Zyxwortel", "NAME"), ("503-555-0187", "PHONE_NUMBER"), ("Hollis Creek Clinic", "NAME"),
               ("Brimwood", "GEOGRAPHIC_LOCATION"), ("Osei", "NAME"), ("Parkinson", "NAME"), ("Danika", "NAME")]

    def __init__(self, settings=None):  # the stack hands the NER its settings
        pass

    def detect(self, text, known):
        return [at(text, t, c, "ner") for t, c in self.reports if t in text]


@pytest.fixture
def ollama(monkeypatch):
    monkeypatch.setenv("DEID_ADAPTER_LLM_TIMEOUT_S", "1")
    monkeypatch.delenv("DEID_ADAPTER_LLM_URL", raising=False)
    monkeypatch.delenv("DEID_ADAPTER_LLM_MODEL", raising=False)
    monkeypatch.setitem(stack_module.DETECTORS, "ner", FakeNer)
    with OllamaStub() as stub:
        yield stub


def settings(stub: OllamaStub) -> LlmSettings:
    return LlmSettings(stub.url, MODEL, timeout_s=1)


def second_opinion_questions(stub: OllamaStub) -> list[str]:
    return [p for p in stub.prompts() if p.startswith("Suggested type:")]


def covered(text: str, spans) -> list[str]:
    return [text[s.start:s.end] for s in spans]


def test_the_llm_stacks_are_data():
    assert STACKS["precision-first"] == ("known", "patterns", "llm")
    assert STACKS["recall-first"] == ("known", "patterns", "ner", "llm")
    assert STACKS["balanced"] == STACKS["recall-first"]
    assert STACK_FILTERS["balanced"] == ("clinical-values", "second-opinion", "validation")


def test_the_second_opinion_may_veto_only_an_ner_span_nothing_else_reported(ollama):
    ollama.verdict("Candidate:", "NOT_PHI")
    spans = [at(NOTE, "Quillan Zyxwortel", "NAME", "ner"), at(NOTE, "Zyxwortel", "NAME", "known"),
             at(NOTE, "503-555-0187", "PHONE_NUMBER", "ner"), at(NOTE, "503-555-0187", "PHONE_NUMBER", "patterns"),
             at(NOTE, "Osei", "NAME", "ner"), at(NOTE, "Osei", "NAME", "llm"),
             at(NOTE, "Brimwood", "GEOGRAPHIC_LOCATION", "ner"), at(NOTE, "Hollis Creek Clinic", "NAME", "ner"),
             at(NOTE, "Parkinson", "NAME", "ner"), at(NOTE, "Danika", "NAME", "llm")]
    kept = SecondOpinion(settings(ollama))(spans, NOTE)
    assert kept == [s for s in spans if covered(NOTE, [s]) != ["Parkinson"]]
    [question] = second_opinion_questions(ollama)
    assert "Candidate: Parkinson" in question and "⟦Parkinson⟧ disease" in question and "Quillan" in question
    assert ollama.requests[-1]["format"]["properties"]["verdict"]["enum"] == ["PHI", "NOT_PHI", "UNSURE"]


@pytest.mark.parametrize("verdict", ["PHI", "UNSURE"])
def test_the_second_opinion_keeps_a_span_unless_the_model_is_sure(ollama, verdict):
    ollama.verdict("Candidate: Parkinson", verdict)
    spans = [at(NOTE, "Parkinson", "NAME", "ner")]
    assert SecondOpinion(settings(ollama))(spans, NOTE) == spans


@pytest.mark.parametrize("misbehave", ["500", "reset", "invalid-json", "length", "slow"])
def test_a_failing_second_opinion_fails_the_record_closed(ollama, misbehave):
    ollama.answer("Candidate: Parkinson", misbehave=misbehave, delay=2 if misbehave == "slow" else 0)
    with pytest.raises(DetectorError, match="second-opinion") as err:
        SecondOpinion(settings(ollama))([at(NOTE, "Parkinson", "NAME", "ner")], NOTE)
    assert "Parkinson" not in str(err.value)


def test_balanced_vetoes_what_recall_first_keeps(ollama):
    ollama.verdict("Candidate:", "NOT_PHI")  # first: the questions quote the note too
    ollama.answer("Quillan", [("Quillan Zyxwortel", "NAME"), ("Osei", "NAME")])
    recall = covered(NOTE, build_stack("recall-first", settings(ollama)).detect(NOTE))
    balanced_stack = build_stack("balanced", settings(ollama))
    balanced = covered(NOTE, balanced_stack.detect(NOTE))
    assert "Danika" in recall and "Danika" not in balanced and "Parkinson" not in balanced
    assert [c for c in recall if c != "Danika"] == balanced
    assert {"Quillan Zyxwortel", "503-555-0187", "Osei", "Brimwood", "Hollis Creek Clinic"} <= set(balanced)
    vetoed = {q.split("\n")[1] for q in second_opinion_questions(ollama)}
    assert vetoed == {"Candidate: Parkinson", "Candidate: Danika"}
    assert balanced_stack.filters[1].counts == {"asked": 2, "vetoed": 2}


def test_precision_first_unions_known_patterns_and_llm_spans(ollama):
    ollama.answer("Quillan", [("Osei", "NAME"), ("Hollis Creek Clinic", "GEOGRAPHIC_LOCATION")])
    found = build_stack("precision-first", settings(ollama)).detect(NOTE, [KnownIdentifier("Zyxwortel", "NAME")])
    by_detector = {(NOTE[s.start:s.end], s.detector) for s in found}
    assert {("Osei", "llm"), ("Hollis Creek Clinic", "llm"), ("503-555-0187", "patterns")} <= by_detector
    assert any(d == "known" and "Zyxwortel" in c for c, d in by_detector)


def free_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name", ["precision-first", "recall-first", "balanced"])
def test_an_llm_stack_without_a_reachable_endpoint_exits_2_and_says_so(ollama, tmp_path, name, test_key_file):
    notes = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": NOTE}])
    url = free_url()
    for args in (["text", "redact", "--in", str(notes), "--out", str(tmp_path / "out.jsonl")],
                 ["fhir", str(write_jsonl(tmp_path / "p.json", [PATIENT])), str(tmp_path / "o.json"),
                  "--key-file", str(test_key_file)],
                 ["eval", str(notes)]):
        result = CliRunner().invoke(app, [*args, "--stack", name, "--llm-url", url, "--llm-model", MODEL])
        assert result.exit_code == 2, result.output
        assert f"stack {name!r} is not available here: llm: no usable Ollama server at {url}" in result.output
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "o.json").exists()
    result = CliRunner().invoke(app, ["text", "detect", "--stack", name, "--in", str(notes)])
    assert result.exit_code == 2 and "no LLM endpoint configured: set --llm-url" in result.output
    result = CliRunner().invoke(app, ["text", "detect", "--stack", name, "--in", str(notes), "--llm-url", ollama.url,
                                      "--llm-model", "not-pulled"])
    assert result.exit_code == 2 and "ollama pull not-pulled" in result.output


def test_the_environment_names_the_endpoint_for_every_command(ollama, tmp_path, test_key_file, monkeypatch):
    monkeypatch.setenv("DEID_ADAPTER_LLM_URL", ollama.url)
    monkeypatch.setenv("DEID_ADAPTER_LLM_MODEL", MODEL)
    ollama.answer("Quillan", [("Osei", "NAME")])
    notes = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": NOTE}])
    result = CliRunner().invoke(app, ["text", "detect", "--stack", "precision-first", "--in", str(notes)])
    assert result.exit_code == 0, result.output
    spans = json.loads(result.output)["spans"]
    assert {"start": NOTE.index("Osei"), "end": NOTE.index("Osei") + 4, "category": "NAME", "detector": "llm",
            "confidence": 1.0} in spans
    result = CliRunner().invoke(app, ["eval", str(write_jsonl(tmp_path / "gold.jsonl", [{"id": "a", "text": NOTE, "spans": [
        {"start": NOTE.index("Osei"), "end": NOTE.index("Osei") + 4, "category": "NAME"}]}])),
        "--stack", "precision-first", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["detectors"]["llm"] == {"version": "1", "model": MODEL,
                                                              "prompt_version": load().label}
    hl7 = tmp_path / "m.hl7"
    hl7.write_text("MSH|^~\\&|A|B|C|D|20240101||ORU^R01|1|P|2.5\rPID|1||123||Zyxwortel^Quillan\r"
                   f"OBX|1|TX|||{NOTE}\r")
    result = CliRunner().invoke(app, ["hl7", str(hl7), str(tmp_path / "m.out.hl7"), "--stack", "precision-first",
                                      "--key-file", str(test_key_file)])
    assert result.exit_code == 0, result.output
    assert any("Parkinson" in p for p in ollama.prompts())  # the OBX narrative went to the model


def test_the_command_line_subprocess_reads_the_endpoint_from_its_environment(tmp_path):
    notes = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": NOTE}])
    proc = run_cli("text", "detect", "--stack", "precision-first", "--in", str(notes), "--llm-url", free_url())
    assert proc.returncode == 2 and "no usable Ollama server" in proc.stderr and not proc.stdout


FAILURES = ["slow", "500", "reset", "invalid-json", "length"]


@pytest.mark.parametrize("misbehave", FAILURES)
def test_each_failure_mode_refuses_the_record_with_exit_3_and_no_output(ollama, tmp_path, misbehave, test_key_file):
    ollama.answer("Zyxwortel", misbehave=misbehave, delay=2 if misbehave == "slow" else 0)
    notes = write_jsonl(tmp_path / "in.jsonl", [{"id": "fine", "text": "Seen by Dr. Hale today."},
                                                {"id": "bad", "text": NOTE}])
    common = ["--stack", "precision-first", "--llm-url", ollama.url, "--llm-model", MODEL]
    result = CliRunner().invoke(app, ["text", "redact", "--in", str(notes), "--out", str(tmp_path / "out.jsonl"), *common])
    assert result.exit_code == 3 and "record bad: refused: llm:" in result.output
    assert not (tmp_path / "out.jsonl").exists()
    result = CliRunner().invoke(app, ["fhir", str(write_jsonl(tmp_path / "p.json", [PATIENT])), str(tmp_path / "o.json"),
                                      "--key-file", str(test_key_file), *common])
    assert result.exit_code == 3 and "refused" in result.output
    assert not (tmp_path / "o.json").exists()
    assert "Zyxwortel" not in result.output and "Quillan" not in result.output


def test_a_stack_that_cannot_build_never_falls_back(ollama, monkeypatch):
    def unavailable(_settings):
        raise StackUnavailable("llm: gone")

    monkeypatch.setitem(stack_module.DETECTORS, "llm", unavailable)
    for name in ("precision-first", "recall-first", "balanced"):
        with pytest.raises(StackUnavailable, match=f"stack '{name}' is not available here: llm: gone"):
            build_stack(name, settings(ollama))
