"""The LLM detector against the scripted Ollama server, through the real `ollama` client."""
from __future__ import annotations

import re
import shutil
import socket
from types import SimpleNamespace

import pytest

from adapter import settings

from tests.support import OllamaStub
from text_deid import prompts
from text_deid.detectors.llm import (CHUNK_CHARS, DEFAULT_MODEL, LlmDetector, LlmSettings, LlmUnavailable,
                                     chunk_bounds, locate)
from text_deid.spans import CATEGORIES, DetectorError
from text_deid.stack import TextStack
from adapter.audit.trail import engine_versions

MODEL = "stub-model"
FILLER = "Vitals stable, afebrile, tolerating diet, ambulating in the hall with physical therapy. "


@pytest.fixture
def ollama():
    with OllamaStub() as stub:
        yield stub


def detector(stub: OllamaStub) -> LlmDetector:
    return LlmDetector(LlmSettings(stub.url, MODEL, timeout_s=2))


def found(text: str, spans) -> list[tuple[str, str]]:
    return [(text[s.start:s.end], s.category) for s in spans]


def note_with_name_in_overlap(name: str) -> tuple[str, int]:
    """A note longer than one chunk with `name` inside the overlap of the first two chunks."""
    text = "Admission note. " + FILLER * 40
    first_end = chunk_bounds(text)[0][1]
    at = text.rfind(" ", 0, first_end - 80) + 1
    text = text[:at] + name + " " + text[at:]
    (_, end1), (start2, _) = chunk_bounds(text)[:2]
    assert start2 <= at and at + len(name) <= end1, "the name must lie in the overlap"
    return text, at


def test_requests_are_deterministic_schema_constrained_and_not_thinking(ollama):
    detector(ollama).detect("Seen by Dr. Hale today.")
    request = ollama.requests[-1]
    assert request["model"] == MODEL and request["stream"] is False
    assert request["options"]["temperature"] == 0 and request["options"]["num_ctx"] == 8192
    assert request["think"] is False
    assert request["format"] == prompts.load().schema
    assert request["messages"][0]["role"] == "system" and len(request["messages"]) == 2 + 2 * len(prompts.load().examples)


def test_thinking_is_not_mentioned_to_a_model_that_cannot_think(monkeypatch):
    with OllamaStub(thinking=False) as stub:
        LlmDetector(LlmSettings(stub.url, MODEL)).detect("Seen today.")
        assert "think" not in stub.requests[-1]


def test_spans_are_exact_and_a_name_in_the_overlap_is_found_once(ollama):
    text, at = note_with_name_in_overlap("Ingrid Vasquez-Tolland")
    text += "Daughter Runa Halvorsen called."
    ollama.answer("Runa", [("Ingrid Vasquez-Tolland", "NAME"), ("Runa Halvorsen", "NAME")])
    ollama.answer("Ingrid", [("Ingrid Vasquez-Tolland", "NAME")])
    spans = detector(ollama).detect(text)
    assert len(chunk_bounds(text)) >= 2 and len(ollama.requests) == len(chunk_bounds(text))
    assert sum("Ingrid" in p for p in ollama.prompts()) == 2  # both chunks saw the name
    assert [(s.start, s.end, s.category, s.detector) for s in spans] == [
        (at, at + len("Ingrid Vasquez-Tolland"), "NAME", "llm"),
        (text.index("Runa"), text.index("Runa") + len("Runa Halvorsen"), "NAME", "llm")]


def test_overlapping_answers_of_two_chunks_are_all_kept_and_merge_in_the_stack(ollama):
    text, at = note_with_name_in_overlap("Ingrid Vasquez-Tolland")
    ollama.answer("Admission note.", [("Ingrid Vasquez-Tolland", "NAME")])  # the first chunk
    ollama.answer("Ingrid", [("Vasquez-Tolland", "NAME")])
    spans = detector(ollama).detect(text)
    assert found(text, spans) == [("Ingrid Vasquez-Tolland", "NAME"), ("Vasquez-Tolland", "NAME")]
    merged = TextStack("t", [detector(ollama)]).detect(text)
    assert found(text, merged) == [("Ingrid Vasquez-Tolland", "NAME")]


def test_a_returned_text_is_found_wherever_it_occurs_as_whole_words(ollama):
    text = "Pell called. Mr. Pell's wife: PELL agrees. Pellegrino is a drug rep."
    ollama.answer("Pell", [("Pell", "NAME")])
    assert found(text, detector(ollama).detect(text)) == [("Pell", "NAME"), ("Pell", "NAME")]
    assert locate(text, "pell")[1] is False  # no exact match: normalized
    assert [text[s:e] for s, e in locate(text, "pell")[0]] == ["Pell", "Pell", "PELL"]


def test_case_and_spacing_differences_are_located_after_normalizing(ollama):
    text = "Seen with her sister TESSALY  MORROW today."
    ollama.answer("TESSALY", [("Tessaly Morrow", "NAME")])
    assert found(text, detector(ollama).detect(text)) == [("TESSALY  MORROW", "NAME")]


def test_invented_and_reworded_text_is_dropped_and_counted(ollama):
    text = "Spoke with Teodor Brandvik about the discharge plan on Friday."
    ollama.answer("Teodor", [("Teodor Brandvik", "NAME"), ("Marguerite Obi", "NAME"), ("Brandvik, Teodor", "NAME"),
                             ("Teodore Brandvik", "NAME")])
    llm = detector(ollama)
    assert found(text, llm.detect(text)) == [("Teodor Brandvik", "NAME")]
    assert llm.counts["invented"] == 2 and llm.counts["reworded"] == 1 and llm.counts["items"] == 4


def test_text_from_another_chunk_is_invented_for_this_one(ollama):
    text, _ = note_with_name_in_overlap("Ingrid Vasquez-Tolland")
    text = "Osei Lindqvist wrote this. " + text
    ollama.answer("", [("Osei Lindqvist", "NAME")])  # every chunk claims the name, only the first holds it
    llm = detector(ollama)
    assert found(text, llm.detect(text)) == [("Osei Lindqvist", "NAME")]
    assert llm.counts["invented"] == len(chunk_bounds(text)) - 1


def test_safe_harbor_rules_drop_what_may_stay_whatever_the_type(ollama):
    text = ("A 45-year-old seen Tuesday at 14:30, in 2019, room 312; her 92-year-old father, "
            "MRN 4410 and Dr. Hale.")
    ollama.answer("45-year-old", [("45-year-old", "AGE_OVER_89"), ("Tuesday", "NAME"), ("14:30", "DATE"),
                                  ("2019", "DATE"), ("312", "MEDICAL_RECORD_NUMBER"), ("92-year-old", "AGE_OVER_89"),
                                  ("4410", "MEDICAL_RECORD_NUMBER"), ("Hale", "NAME")])
    llm = detector(ollama)
    assert found(text, llm.detect(text)) == [("92-year-old", "AGE_OVER_89"), ("4410", "MEDICAL_RECORD_NUMBER"),
                                             ("Hale", "NAME")]
    assert llm.counts["safe_harbor"] == 5


@pytest.mark.parametrize("misbehave, reason", [
    ("slow", "no answer from the model server within 2 s"),
    ("500", "HTTP 500"),
    ("reset", "connection to the model server failed"),
    ("invalid-json", "not JSON again after splitting"),
    ("length", "cut at the output limit again after splitting"),
])
def test_each_failure_fails_closed_without_quoting_the_note(ollama, misbehave, reason):
    text = "Zyxwortel Quillan was seen by Dr. Hale. " * 3
    ollama.answer("Zyxwortel", misbehave=misbehave, delay=3 if misbehave == "slow" else 0)
    with pytest.raises(DetectorError, match=reason) as err:
        detector(ollama).detect(text)
    assert "Zyxwortel" not in str(err.value) and "Hale" not in str(err.value)


def test_an_answer_off_the_schema_is_asked_again_as_halves_then_fails_closed(ollama):
    ollama.answer("Quillan", raw={"items": [{"text": "Quillan", "type": "PERSON"}]})
    with pytest.raises(DetectorError, match="not the answer schema again after splitting"):
        detector(ollama).detect("Quillan was seen by Dr. Hale, then by Dr. Marchetti.")
    assert len(ollama.requests) == 2  # the chunk, then its first half: nothing is retried forever


def test_a_cut_answer_is_asked_again_as_two_halves_that_can_succeed(ollama):
    text = "Quillan Zyxwortel was seen by Dr. Osei Lindqvist for follow-up. " * 4
    ollama.answer("Quillan", misbehave="length", times=1)
    ollama.answer("Quillan", [("Quillan Zyxwortel", "NAME"), ("Osei Lindqvist", "NAME")])
    llm = detector(ollama)
    spans = found(text, llm.detect(text))
    assert spans.count(("Quillan Zyxwortel", "NAME")) == 4 and spans.count(("Osei Lindqvist", "NAME")) == 4
    assert llm.counts["split_retries"] == 1 and len(ollama.requests) == 3


def test_chunks_run_concurrently_in_a_bounded_pool(ollama):
    text = FILLER * 120  # about 6 chunks
    ollama.answer("Vitals", [], misbehave="slow", delay=0.3)
    llm = LlmDetector(LlmSettings(ollama.url, MODEL, timeout_s=2, concurrency=3))
    import time

    start = time.perf_counter()
    llm.detect(text)
    chunks = len(chunk_bounds(text))
    assert chunks >= 5 and time.perf_counter() - start < 0.3 * chunks - 0.3
    assert llm.endpoint._executor()._max_workers == 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_endpoint_no_server_or_no_model_make_the_detector_unavailable(ollama, monkeypatch):
    monkeypatch.delenv("DEID_ADAPTER_LLM_URL", raising=False)
    with pytest.raises(LlmUnavailable, match="no LLM endpoint configured"):
        LlmDetector(LlmSettings())
    with pytest.raises(LlmUnavailable, match="no usable Ollama server"):
        LlmDetector(LlmSettings(f"http://127.0.0.1:{free_port()}", MODEL))
    with pytest.raises(LlmUnavailable, match=f"ollama pull {DEFAULT_MODEL}"):
        LlmDetector(LlmSettings(ollama.url))
    monkeypatch.setenv("DEID_ADAPTER_LLM_URL", ollama.url)  # the edges read the environment (adapter/settings.py)
    monkeypatch.setenv("DEID_ADAPTER_LLM_MODEL", MODEL)
    assert LlmDetector(settings.llm()).model == MODEL
    monkeypatch.setenv("DEID_ADAPTER_LLM_NUM_CTX", "2048")
    with pytest.raises(LlmUnavailable, match="num_ctx 2048 is too small"):
        LlmDetector(settings.llm())


def test_the_detector_reads_no_environment(ollama, monkeypatch):
    monkeypatch.setenv("DEID_ADAPTER_LLM_URL", ollama.url)
    monkeypatch.setenv("DEID_ADAPTER_LLM_NUM_CTX", "2048")
    with pytest.raises(LlmUnavailable, match="no LLM endpoint configured"):
        LlmDetector(LlmSettings())
    assert LlmDetector(LlmSettings(ollama.url, MODEL)).endpoint.num_ctx == 8192


def test_the_prompt_version_and_hash_land_in_audit_records(ollama):
    llm = detector(ollama)
    label = prompts.load().label
    assert re.fullmatch(r"\S+ sha256:[0-9a-f]{64}", label)
    versions = engine_versions(SimpleNamespace(stack=TextStack("precision-first", [llm])))
    assert versions["versions"]["detectors"]["llm"] == {"version": "1", "model": MODEL, "prompt_version": label}


def test_the_hash_covers_every_prompt_file(tmp_path):
    base = prompts.load()
    for name in prompts.FILES:
        folder = tmp_path / name
        shutil.copytree(prompts.PROMPTS, folder)
        (folder / name).write_text((folder / name).read_text() + "\n")
        assert prompts.load(folder).sha256 != base.sha256, name


def test_the_few_shot_examples_are_forty_short_notes_a_dozen_without_phi_and_answers_that_locate():
    p = prompts.load()
    assert len(p.examples) == 40 and sum(not ex["items"] for ex in p.examples) == 12
    assert p.schema["properties"]["items"]["items"]["properties"]["type"]["enum"] == list(CATEGORIES)
    for ex in p.examples:
        assert len(ex["note"]) < 200
        for item in ex["items"]:
            assert item["type"] in CATEGORIES
            hits, exact = locate(ex["note"], item["text"])
            assert hits and exact, item["text"]
    assert {ex["verdict"] for ex in p.second_opinion_examples} == {"PHI", "NOT_PHI", "UNSURE"}
    assert len(chunk_bounds("x " * CHUNK_CHARS)) > 1
