"""The shipped NER graph (model.onnx) against the weights it is exported from (model.safetensors): the export
is deterministic and the shipped file is what it writes; its predictions are the torch model's."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx")

from transformers import AutoModelForTokenClassification  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from text_deid.detectors.ner import DEFAULT_MODEL, ONNX_FILE, NerDetector  # noqa: E402
from text_deid.ner_training.export import export  # noqa: E402

TEXTS = [
    "Pt Maria Gonzalez seen by Dr. Kowalski at Riverside Medical Center on 03/14/2023 for CHF.",
    "Referring case: Anna S., from Boise, Idaho, on Lasix. Call 555-201-3344 or anna.s@example.org.",
    "PATIENT: SMITH, JOHN\nMRN: 48213377\nAdmission Date: 01/02/2024",
    "Hx of Parkinson's disease and Crohn's disease. Foley catheter in place. Will recheck BMP. May discharge.",
    "Discharged to St. Mary's Hospital in Fresno, CA on March 3, 2021; f/u with Dr. Alvarez.",
]


@pytest.fixture(scope="module")
def weights():
    hf_logging.disable_progress_bar()
    return AutoModelForTokenClassification.from_pretrained(DEFAULT_MODEL, local_files_only=True,
                                                           dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    """The project's model folder with an fp32 graph in place of the shipped int8 one."""
    folder = tmp_path_factory.mktemp("fp32") / "ner-tiny-cased"
    shutil.copytree(DEFAULT_MODEL, folder)
    export(folder, "fp32")
    return NerDetector(model_path=str(folder))


def torch_probs(det, weights, text):
    """The torch model's per-token probabilities for a text of one window, as the detector lays it out."""
    ids, _ = det.encode([text])[0]
    cls, sep, _ = det._special
    with torch.inference_mode():
        logits = weights(input_ids=torch.tensor([[cls, *ids, sep]])).logits[0, 1:-1]
    return torch.softmax(logits, dim=-1).numpy()


def test_the_shipped_graph_is_what_the_export_writes(tmp_path):
    again = export(DEFAULT_MODEL, "int8", tmp_path / ONNX_FILE)
    with open(f"{DEFAULT_MODEL}/{ONNX_FILE}", "rb") as fh:
        assert again.read_bytes() == fh.read(), "re-run: python -m text_deid.ner_training.export"


@pytest.mark.parametrize("text", TEXTS)
def test_the_shipped_graph_finds_the_spans_of_the_weights(weights, text):
    det = NerDetector()
    offsets = det.encode([text])[0][1]
    shipped, reference = det.detect(text), det._decode(text, torch_probs(det, weights, text), offsets)
    assert [(s.start, s.end, s.category) for s in shipped] == [(s.start, s.end, s.category) for s in reference]
    assert all(abs(s.confidence - r.confidence) < 0.02 for s, r in zip(shipped, reference))  # int8 weights


def test_an_fp32_graph_gives_the_weights_probabilities(weights, fp32):
    for text in TEXTS:
        ids, _ = fp32.encode([text])[0]
        onnx_probs = fp32._probs([ids])[0]
        assert np.abs(onnx_probs - torch_probs(fp32, weights, text)).max() < 1e-4


def test_an_fp32_graph_batches_the_texts_of_a_record_without_changing_their_spans(fp32):
    assert fp32._batch > 1
    texts = TEXTS + ["Called Dr. Kowalski about BP; pt Maria Gonzalez resting. " * 20]
    assert fp32.detect_many(texts) == [fp32.detect(t) for t in texts]
