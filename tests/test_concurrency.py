"""Concurrency harness: every stack, called from 8 threads on the ASQ-PHI tuning half and the shared notes, answers
each call exactly as the same call made alone."""
from __future__ import annotations

import base64
import json
import os
import random
import threading
from pathlib import Path

import pytest

from tests.conftest import SHARED
from tests.ollama_stub import OllamaStub
from text_deid.detectors.llm import LlmSettings
from text_deid.spans import KnownIdentifier
from text_deid.stack import StackUnavailable, TextStack, build_stack

THREADS = 8
MODEL = "stub-model"


def _tuning() -> list[dict]:
    return [json.loads(line) for line in (SHARED / "asq-phi" / "tuning.jsonl").read_text().splitlines() if line]


def _shared_notes() -> list[str]:
    notes = []
    for line in (SHARED / "fhir" / "bulk-ndjson" / "DocumentReference.000.ndjson").read_text().splitlines():
        for content in json.loads(line).get("content", []):
            if data := content.get("attachment", {}).get("data"):
                notes.append(base64.b64decode(data).decode("utf-8"))
    return notes


def _calls() -> list[tuple[tuple[str, ...], tuple[KnownIdentifier, ...]]]:
    """(texts, known) calls: tuning records in batches of 3 with their gold identifiers as the record's known
    values for every other batch (so the known-identifier detector works too), and each shared note alone."""
    records = _tuning()
    calls = []
    for i in range(0, len(records), 3):
        batch = records[i:i + 3]
        known = () if i % 2 else tuple(sorted(
            KnownIdentifier(r["text"][s["start"]:s["end"]], s["category"]) for r in batch for s in r["spans"]
            if s["category"] not in ("DATE", "AGE_OVER_89")))
        calls.append((tuple(r["text"] for r in batch), known))
    calls.extend(((note,), ()) for note in _shared_notes())
    return calls


CALLS = _calls()


def compare_concurrently(stack: TextStack, calls, rounds: int = 1) -> tuple[int, int]:
    """(calls compared, mismatches): each thread makes every call `rounds` times in its own order and compares each
    answer with the answer to the same call made alone, before any thread started."""
    alone = [stack.detect_many(texts, known) for texts, known in calls]
    compared, mismatches, errors = [0], [0], []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def worker(seed: int) -> None:
        order = [i for _ in range(rounds) for i in range(len(calls))]
        random.Random(seed).shuffle(order)
        start.wait()
        done = bad = 0
        try:
            for i in order:
                texts, known = calls[i]
                bad += stack.detect_many(texts, known) != alone[i]
                done += 1
        except Exception as e:  # noqa: BLE001 - reported below, as a failure of the harness
            errors.append(repr(e))
        with lock:
            compared[0] += done
            mismatches[0] += bad

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    return compared[0], mismatches[0]


def report(name: str, compared: int, mismatches: int) -> None:
    print(f"\nconcurrency {name}: {THREADS} threads, {compared} calls compared, {mismatches} mismatches")


@pytest.mark.parametrize("name", ["patterns", "gazetteer"])
def test_the_regex_stacks_answer_every_concurrent_call_as_alone(name):
    stack = build_stack(name)
    compared, mismatches = compare_concurrently(stack, CALLS, rounds=2)
    report(name, compared, mismatches)
    assert compared == THREADS * 2 * len(CALLS)
    assert mismatches == 0


def test_the_no_llm_stack_answers_every_concurrent_call_as_alone():
    try:
        stack = build_stack("no-llm")
    except StackUnavailable as e:
        pytest.skip(str(e))
    calls = CALLS[::4]  # the NER costs ~100x the patterns per text: a quarter of the calls keeps this under a minute
    compared, mismatches = compare_concurrently(stack, calls)
    report("no-llm", compared, mismatches)
    assert compared == THREADS * len(calls)
    assert mismatches == 0


@pytest.fixture(scope="module")
def ollama():
    """The test Ollama server, answering each tuning record's gold identifiers, and NOT_PHI for some questions."""
    saved = {k: os.environ.pop(k, None) for k in ("DEID_ADAPTER_LLM_URL", "DEID_ADAPTER_LLM_MODEL")}
    with OllamaStub() as stub:
        for rec in _tuning():
            stub.answer(rec["text"][:60], [(rec["text"][s["start"]:s["end"]], s["category"]) for s in rec["spans"]])
        for word in ("Parkinson", "Wilson", "Hodgkin", "the"):
            stub.verdict(word, "NOT_PHI")
        yield stub
    os.environ.update({k: v for k, v in saved.items() if v is not None})


@pytest.mark.parametrize("name", ["precision-first", "recall-first", "balanced"])
def test_the_llm_stacks_answer_every_concurrent_call_as_alone(ollama, name):
    try:
        stack = build_stack(name, LlmSettings(ollama.url, MODEL))
    except StackUnavailable as e:
        pytest.skip(str(e))
    calls = CALLS[:60:2] + CALLS[-6:]
    compared, mismatches = compare_concurrently(stack, calls)
    report(name, compared, mismatches)
    assert compared == THREADS * len(calls)
    assert mismatches == 0
