"""Concurrency harness: every stack, called from 8 threads on ASQ-PHI tuning notes and the sample notes, answers
each call exactly as the same call made alone."""
from __future__ import annotations

import base64
import html
import json
import os
import random
import threading

import pytest

from tests.conftest import DATA, run_cli
from tests.support import OllamaStub
from tests.support import post, serve
from text_deid.detectors.llm import LlmSettings
from text_deid.spans import KnownIdentifier
from text_deid.stack import StackUnavailable, TextStack, build_stack

THREADS = 8
MODEL = "stub-model"


def _tuning() -> list[dict]:
    return [json.loads(line) for line in (DATA / "asq-phi" / "tuning.jsonl").read_text().splitlines() if line]


def _sample_notes() -> list[str]:
    notes = []
    for line in (DATA / "fhir" / "bulk-ndjson" / "DocumentReference.000.ndjson").read_text().splitlines():
        for content in json.loads(line).get("content", []):
            if data := content.get("attachment", {}).get("data"):
                notes.append(base64.b64decode(data).decode("utf-8"))
    return notes


def _calls() -> list[tuple[tuple[str, ...], tuple[KnownIdentifier, ...]]]:
    """(texts, known) calls: tuning records in batches of 3 with their gold identifiers as the record's known
    values for every other batch (so the known-identifier detector works too), and each sample note alone."""
    records = _tuning()
    calls = []
    for i in range(0, len(records), 3):
        batch = records[i:i + 3]
        known = () if i % 2 else tuple(sorted(
            KnownIdentifier(r["text"][s["start"]:s["end"]], s["category"]) for r in batch for s in r["spans"]
            if s["category"] not in ("DATE", "AGE_OVER_89")))
        calls.append((tuple(r["text"] for r in batch), known))
    calls.extend(((note,), ()) for note in _sample_notes())
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


class GoldStub(OllamaStub):
    """Answers a detector request with the scripted items, and a question about a span only with a scripted verdict
    (UNSURE when none is scripted), though the question's excerpt may hold a record's text too."""

    def _rule(self, prompt: str):
        rule = super()._rule(prompt)
        question = prompt.startswith("Suggested type:")
        return rule if rule is None or question == ("verdict" in rule.answer) else None


@pytest.fixture(scope="module")
def ollama():
    """The test Ollama server, answering each tuning record's gold identifiers, and NOT_PHI about some spans."""
    saved = {k: os.environ.pop(k, None) for k in ("DEID_ADAPTER_LLM_URL", "DEID_ADAPTER_LLM_MODEL")}
    with GoldStub() as stub:
        for word in ("Parkinson", "Wilson", "Hodgkin", "Smith", "Boston"):  # the span, as the question marks it
            stub.verdict(f"⟦{word}", "NOT_PHI")
        for rec in _tuning():
            stub.answer(rec["text"][:60], [(rec["text"][s["start"]:s["end"]], s["category"]) for s in rec["spans"]])
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


def _patients() -> list[dict]:
    """Patients whose narrative is a tuning record or a sample note, holding an MRN that only the note gives."""
    notes = [r["text"] for r in _tuning()[:20]] + _sample_notes()[:4]
    return [{"resourceType": "Patient", "id": f"p{i}", "identifier": [{"system": "urn:mrn", "value": f"MRN-{i:06d}"}],
             "name": [{"family": f"Zelbrin{i}", "given": ["Quorva"]}],
             "text": {"status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">MRN 77{i:05d}. '
                      f'{html.escape(note)}</div>'}}
            for i, note in enumerate(notes)]


def test_the_service_under_8_concurrent_clients_answers_as_the_cli(tmp_path, test_key_file):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i, patient in enumerate(_patients()):
        (inputs / f"patient-{i:03d}.json").write_text(json.dumps(patient))
    for example in sorted((DATA / "fhir" / "hl7-r4-examples").glob("*.json")):
        (inputs / example.name).write_bytes(example.read_bytes())
    run_cli("fhir", str(inputs), str(tmp_path / "cli"), "--stack", "patterns", "--today", "2026-01-15", "--keep-file-names",
            key_file=test_key_file, check=True)
    names = sorted(p.name for p in inputs.iterdir())
    # the service serializes compactly, the CLI with indentation: the CLI's output in the service's bytes
    expected = {n: json.dumps(json.loads((tmp_path / "cli" / n).read_text()), ensure_ascii=False).encode() for n in names}
    workdir = tmp_path / "service"
    workdir.mkdir()
    compared, mismatches = [0], []
    lock = threading.Lock()
    with serve(workdir, test_key_file, "--stack", "patterns", "--workers", "2") as server:
        def client(seed: int) -> None:
            order = list(names)
            random.Random(seed).shuffle(order)
            for name in order:
                resp = post(server, (inputs / name).read_bytes())
                with lock:
                    compared[0] += 1
                    if resp.status_code != 200 or resp.content != expected[name]:
                        mismatches.append(name)

        threads = [threading.Thread(target=client, args=(seed,)) for seed in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(f"\nservice vs CLI: {THREADS} clients, {compared[0]} answers compared, {len(mismatches)} differ")
    assert compared[0] == THREADS * len(names)
    assert mismatches == []
