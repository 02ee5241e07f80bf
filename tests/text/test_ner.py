"""The clinical NER detector: exact offsets, windowing, all-caps names, fail-closed, determinism, no torch."""
from __future__ import annotations

import copy
import json
import os
import shutil
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")

from text_deid.detectors import ner as ner_mod  # noqa: E402
from text_deid.detectors.ner import DEFAULT_MODEL, NerDetector, NerSettings, NerUnavailable  # noqa: E402
from adapter.engines import text_stack  # noqa: E402
from tests.conftest import DATA  # noqa: E402
from text_deid.spans import DetectorError  # noqa: E402
from text_deid.stack import StackUnavailable, build_stack
from text_deid.stack import DETECTORS, TextStack
from text_deid.stack import _ner
from text_deid.detectors.ner import DEFAULT_THRESHOLD

pytestmark = pytest.mark.skipif(not os.path.isdir(DEFAULT_MODEL), reason="default NER model not present")


@pytest.fixture(scope="module")
def det():
    # the mechanics (windows, offsets, casing) are tested at a fixed threshold, apart from the tuned default
    return NerDetector(threshold=0.5)


def test_default_threshold_is_the_tuned_one(monkeypatch):
    monkeypatch.delenv("DEID_ADAPTER_NER_THRESHOLD", raising=False)
    assert NerDetector().threshold == DEFAULT_THRESHOLD == 0.8


def _found(det, text):
    return [(text[s.start:s.end], s.category) for s in det.detect(text)]


def _span(text, value, start=0):
    i = text.index(value, start)
    return i, i + len(value)


def test_exact_offsets_name_place_date(det):
    text = "Pt Maria Gonzalez seen by Dr. Kowalski at Riverside Medical Center on 03/14/2023 for CHF."
    spans = det.detect(text)
    got = {(s.start, s.end, s.category) for s in spans}
    assert (*_span(text, "Maria Gonzalez"), "NAME") in got
    assert (*_span(text, "Kowalski"), "NAME") in got
    assert (*_span(text, "Riverside Medical Center"), "GEOGRAPHIC_LOCATION") in got
    assert (*_span(text, "03/14/2023"), "DATE") in got
    assert all(s.detector == "ner" and 0.0 < s.confidence <= 1.0 for s in spans)


def test_city_state_and_initial(det):
    text = "Referring case: Anna S., from Boise, Idaho, on Lasix."
    found = _found(det, text)
    assert ("Anna S.", "NAME") in found
    assert ("Boise, Idaho", "GEOGRAPHIC_LOCATION") in found
    assert not any("Lasix" in v for v, _ in found)


def test_all_caps_name(det):
    text = "PATIENT: SMITH, JOHN\nMRN: 48213377\nAdmission Date: 01/02/2024"
    spans = det.detect(text)
    for value in ("SMITH", "JOHN"):
        a, b = _span(text, value)
        assert any(x.category == "NAME" and x.start <= a and b <= x.end for x in spans), value


def test_hard_negatives_alone(det):
    text = "Hx of Parkinson's disease and Crohn's disease. Foley catheter in place. Will recheck BMP. May discharge."
    names = [v for v, c in _found(det, text) if c in ("NAME", "GEOGRAPHIC_LOCATION")]
    assert names == []


def _small(det, max_len=16, stride=4):
    small = copy.copy(det)  # same model, small windows
    small.max_len, small.stride = max_len, stride
    return small


def test_window_boundary_name_found_once(det):
    small = _small(det)
    name = "Maria Gonzalez"
    for n in range(12):  # find a prefix that puts a window edge inside the name
        text = "Will recheck BMP in AM and continue Lasix " + "as ordered " * n + f"today, pt {name} called her daughter."
        a, b = _span(text, name)
        offs = small.encode([text])[0][1]
        toks = [k for k, (s, e) in enumerate(offs) if s < b and e > a]
        wins = small._windows(len(offs))
        if len(wins) > 1 and any(toks[0] < w1 <= toks[-1] for _, w1 in wins[:-1]):
            break
    else:
        pytest.fail("no prefix put a window edge inside the name")
    names = [(s.start, s.end) for s in small.detect(text) if s.category == "NAME"]
    assert names.count((a, b)) == 1
    assert sum(1 for s, e in names if s < b and e > a) == 1
    # same spans as with one big window
    key = lambda spans: [(x.start, x.end, x.category) for x in spans if x.category == "NAME"]  # noqa: E731
    assert key(small.detect(text)) == key(det.detect(text))


def test_long_note_windows_cover_every_name(det):
    sentence = "Called Dr. Kowalski about BP; pt Maria Gonzalez resting. "
    text = sentence * 40  # about 600 tokens: several overlapping windows of 128
    assert len(det._windows(len(det.encode([text])[0][0]))) > 4
    spans = det.detect(text)
    for k in range(40):
        base = k * len(sentence)
        for value in ("Kowalski", "Maria Gonzalez"):
            a, b = _span(sentence, value)
            assert any(x.category == "NAME" and x.start <= base + a and base + b <= x.end for x in spans), (k, value)
    for x in spans:  # offsets map back to whole words
        assert text[x.start].isalnum() and (x.start == 0 or not text[x.start - 1].isalnum())
        assert x.end == len(text) or not (text[x.end].isalnum() and text[x.end - 1].isalnum())


def test_determinism(det):
    text = "Discharged to St. Mary's Hospital in Fresno, CA on March 3, 2021; f/u with Dr. Alvarez."
    first = det.detect(text)
    assert first and det.detect(text) == first == copy.copy(det).detect(text)


def test_missing_model_fails_closed(tmp_path):
    with pytest.raises(NerUnavailable, match="model folder not found"):
        NerDetector(model_path=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(NerUnavailable, match="weights"):
        NerDetector(model_path=str(tmp_path / "empty"))


def test_stack_unavailable_when_model_missing(monkeypatch, tmp_path):
    with pytest.raises(StackUnavailable, match="ner: model folder not found"):
        build_stack("ner-only", ner=NerSettings(model_path=str(tmp_path / "missing-model")))
    monkeypatch.setenv("DEID_ADAPTER_NER_MODEL", str(tmp_path / "missing-model"))  # the edges read it
    with pytest.raises(StackUnavailable, match="ner: model folder not found"):
        text_stack("ner-only")


def test_bad_label_map_fails(tmp_path):
    bad = tmp_path / "labels.json"
    bad.write_text('{"NAME": "NAME"}')  # the model has more types than this
    with pytest.raises(NerUnavailable, match="not in the label map"):
        NerDetector(labels_path=str(bad))
    bad.write_text('{"NAME": "PERSON"}')
    with pytest.raises(NerUnavailable, match="unknown category"):
        NerDetector(labels_path=str(bad))


class FailingSession:
    """An onnxruntime session stand-in whose run raises, quoting the text as a careless library might."""

    def __init__(self, secret="x"):
        self.secret = secret

    def run(self, names, feeds):
        raise RuntimeError(f"tensor problem near {self.secret}")


class OutputSession:
    """A session stand-in that answers `make(input_ids)` as the logits."""

    def __init__(self, make):
        self.make = make

    def run(self, names, feeds):
        return [self.make(feeds["input_ids"])]


def test_inference_error_fails_closed(det, monkeypatch):
    secret = "Maria Gonzalez"
    monkeypatch.setattr(det, "_session", FailingSession(secret))
    with pytest.raises(DetectorError) as e:
        det.detect(f"pt {secret} seen today")
    assert secret not in str(e.value) and "ner" in str(e.value)


def test_garbage_output_fails_closed(det, monkeypatch):
    labels = len(det._label_cat)
    monkeypatch.setattr(det, "_session", OutputSession(lambda ids: np.full((*ids.shape, labels), np.nan, np.float32)))
    with pytest.raises(DetectorError, match="not finite"):
        det.detect("pt Maria Gonzalez seen today")
    monkeypatch.setattr(det, "_session", OutputSession(lambda ids: np.zeros((1, 2, 3), np.float32)))
    with pytest.raises(DetectorError, match="shape"):
        det.detect("pt Maria Gonzalez seen today")


def test_stack_fails_record_on_ner_error(det):
    assert "ner" in DETECTORS
    ner = copy.copy(det)
    ner._session = FailingSession()
    stack = TextStack("t", [DETECTORS["patterns"](), ner])
    with pytest.raises(DetectorError):
        stack.detect("pt Maria Gonzalez seen today")


def test_label_prefixes():
    assert ner_mod._split_label("B-PATIENT") == ("B", "PATIENT")
    assert ner_mod._split_label("U-HOSP") == ("U", "HOSP")
    assert ner_mod._split_label("O") == (None, None)
    assert ner_mod._split_label("PERSON") == ("I", "PERSON")


def test_without_onnxruntime_the_stack_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if onnxruntime were not installed
    with pytest.raises(NerUnavailable, match="needs onnxruntime and tokenizers"):
        NerDetector()
    with pytest.raises(StackUnavailable, match="deid-adapter\\[ner\\]"):
        _ner(NerSettings())


def test_inference_needs_no_torch(monkeypatch):
    for name in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # as if the training packages were not installed
    text = "Pt Maria Gonzalez seen by Dr. Kowalski on 03/14/2023."
    assert ("Maria Gonzalez", "NAME") in [(text[s.start:s.end], s.category) for s in NerDetector().detect(text)]


def test_a_graph_exported_from_other_weights_is_refused(tmp_path):
    folder = tmp_path / "retrained"
    shutil.copytree(DEFAULT_MODEL, folder)
    with open(folder / "model.safetensors", "ab") as fh:  # new weights, the old graph left behind
        fh.write(b"\0")
    with pytest.raises(NerUnavailable, match="exported from other weights.*text_deid.ner_training.export"):
        NerDetector(model_path=str(folder))
    (folder / "model.onnx").unlink()
    with pytest.raises(NerUnavailable, match="no model weights \\(model.onnx\\).*text_deid.ner_training.export"):
        NerDetector(model_path=str(folder))


def _tuning_texts(n):
    path = DATA / "asq-phi" / "tuning.jsonl"
    if not path.is_file():
        pytest.skip("ASQ-PHI tuning half not present")
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()[:n]]


def test_a_texts_spans_do_not_depend_on_the_other_texts_of_its_record(det):
    texts = _tuning_texts(200)
    alone = [det.detect(t) for t in texts]
    assert det.detect_many(texts) == alone


def test_the_windows_of_a_records_texts_run_together(det, monkeypatch):
    calls = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def run(self, names, feeds):
            calls.append(feeds["input_ids"].shape[0])
            return self.inner.run(names, feeds)

    texts = ["pt Maria Gonzalez seen today", "", "Called Dr. Kowalski about BP. " * 30, "f/u in Fresno, CA"]
    windows = sum(len(det._windows(len(ids))) for ids, _ in det.encode([t for t in texts if t]))
    batched = copy.copy(det)
    batched._batch = 32
    monkeypatch.setattr(batched, "_session", Counting(det._session))
    found = batched.detect_many(texts)
    assert calls == [windows] and len(found) == 4 and found[1] == [] and found[0]


@pytest.mark.parametrize("text,names", [
    ("Options for a 61-year-old Caucasian woman with stage IV melanoma, Ines Okafor, seen last spring?", ["Ines Okafor"]),
    ("Plan for a 40yo male with Type 1 Diabetes, Teodoro V., on a pump?", ["Teodoro V."]),
    ("Questions about a patient named Halvard Q. and his CHA2DS2-VASc of 4.", ["Halvard Q."]),
])
def test_words_next_to_a_name_are_not_part_of_it(text, names):
    default = NerDetector()  # the tuned threshold
    found = [text[s.start:s.end].rstrip(".") for s in default.detect(text)]
    assert found == [n.rstrip(".") for n in names]

def test_the_record_deadline_stops_inference_within_one_batch(det, monkeypatch):
    """Issue #36: past the record's deadline the NER runs no further window batch (the work stops, not only
    the answer): a session taking 0.1 s a batch is called about as many times as the deadline allows."""
    import time

    from text_deid import budget

    labels = len(det._label_cat)
    calls = []

    def slow(ids):
        calls.append(time.monotonic())
        time.sleep(0.1)
        return np.zeros((*ids.shape, labels), np.float32)

    monkeypatch.setattr(det, "_session", OutputSession(slow))
    monkeypatch.setattr(det, "_batch", 1)
    text = " ".join(f"word{i}" for i in range(det.max_len * 40))  # some 50 windows
    start = time.monotonic()
    with budget.within(0.35), pytest.raises(DetectorError, match="ner: over its time budget"):
        det.detect(text)
    assert len(calls) <= 5 and time.monotonic() - start < 0.35 + 0.2  # one batch past the deadline at most
