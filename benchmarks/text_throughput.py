"""Text-stack throughput beside presidio-analyzer's AnalyzerEngine on the same text, measured side by side
in one run: Presidio with its pattern recognizers only (no spaCy model: the `no_op` NLP engine), and
Presidio with those recognizers plus the project's NER model through its HuggingFaceNerRecognizer.

Run: .venv/bin/python benchmarks/text_throughput.py [--repeat N] [--stacks patterns,gazetteer,no-llm]
Text: the ASQ-PHI tuning queries (../shared/data/asq-phi/tuning.jsonl), one call per query. Prints chars per
CPU-second (every thread of this process, so the figure holds on a busy machine) and per wall second for
each, the ratio of `patterns` and `gazetteer` over Presidio pattern-only (target: patterns >= 10x), the ratio
of `no-llm` over Presidio with the same NER model, and the NER detector's tokens/s on one thread (target:
>= 5,000). torch runs on one thread everywhere (DEID_ADAPTER_NER_THREADS, default 1).
A stack or engine whose parts are not installed here (no-llm without the NER model) is reported and skipped.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

from text_deid.stack import StackUnavailable, build_stack

GOLD = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "asq-phi" / "tuning.jsonl"


def presidio_analyzer(ner_model: str | None = None):
    """AnalyzerEngine with its predefined recognizers and the no_op NLP engine (tldextract kept offline),
    plus, with `ner_model`, a HuggingFaceNerRecognizer on that local model folder."""
    import tldextract
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NoOpNlpEngine
    from presidio_analyzer.predefined_recognizers.generic import email_recognizer

    # EmailRecognizer's tldextract would try to fetch the Public Suffix List (../shared/research/env-probe.md).
    email_recognizer.tldextract = SimpleNamespace(extract=tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None))
    engine = AnalyzerEngine(nlp_engine=NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "no_op"}]),
                            supported_languages=["en"])
    if ner_model:
        from presidio_analyzer.predefined_recognizers.ner.huggingface_ner_recognizer import HuggingFaceNerRecognizer

        labels = json.loads((Path(ner_model) / "labels.json").read_text())
        recognizer = HuggingFaceNerRecognizer(model_name=ner_model, label_mapping=labels, device="cpu",
                                              threshold=0.5, aggregation_strategy="simple")
        recognizer.load()
        engine.registry.add_recognizer(recognizer)
    return lambda text: engine.analyze(text, language="en")


def chars_per_second(fn, texts: list[str], repeat: int) -> tuple[float, float]:
    """(chars per CPU-second, chars per wall second), each the best of `repeat` runs."""
    fn(texts[0])  # warm-up: lazy compilation and caches
    best_cpu = best_wall = float("inf")
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        for t in texts:
            fn(t)
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    total = sum(map(len, texts))
    return total / best_cpu, total / best_wall


def line(name: str, rates: tuple[float, float], note: str = "") -> None:
    print(f"{name:<40} {rates[0]:>12,.0f} {rates[1]:>12,.0f}  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stacks", default="patterns,gazetteer,no-llm")
    args = parser.parse_args()
    texts = [json.loads(line)["text"] for line in GOLD.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(f"text: {len(texts)} queries, {sum(map(len, texts)):,} chars; best of {args.repeat}")
    print(f"{'':<40} {'chars/CPU-s':>12} {'chars/s':>12}")
    presidio = chars_per_second(presidio_analyzer(), texts, args.repeat)
    line("presidio pattern-only (no_op nlp)", presidio)
    presidio_ner = presidio_with_ner(texts, args.repeat)
    for name in args.stacks.split(","):
        try:
            stack = build_stack(name)
        except StackUnavailable as e:
            print(f"{name:<40} skipped: {e}")
            continue
        rates = chars_per_second(lambda t: stack.detect(t, ()), texts, args.repeat)
        if "ner" in [d.name for d in stack.detectors]:
            note = f"{rates[0] / presidio_ner[0]:6.1f}x presidio + same NER (CPU)" if presidio_ner else ""
        else:
            note = f"{rates[0] / presidio[0]:6.1f}x presidio pattern-only (CPU)"
        line(name, rates, note)
    ner_tokens_per_second(texts, args.repeat)


def presidio_with_ner(texts: list[str], repeat: int) -> tuple[float, float] | None:
    try:
        import torch

        from text_deid.detectors.ner import DEFAULT_MODEL
    except ImportError as e:
        print(f"{'presidio + same NER model':<40} skipped: {type(e).__name__} (install the ner extra)")
        return None
    torch.set_num_threads(1)
    rates = chars_per_second(presidio_analyzer(DEFAULT_MODEL), texts, repeat)
    line("presidio + same NER model (HF pipeline)", rates)
    return rates


def ner_tokens_per_second(texts: list[str], repeat: int) -> None:
    """The NER detector alone, one call per query, on one thread (DEID_ADAPTER_NER_THREADS, default 1)."""
    from text_deid.detectors.ner import NerDetector, NerUnavailable

    try:
        ner = NerDetector()
    except NerUnavailable as e:
        print(f"{'ner':<40} skipped: {e}")
        return
    tokens = sum(len(ner.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    rates = chars_per_second(lambda t: ner.detect(t, ()), texts, repeat)
    per_cpu_second = tokens / (sum(map(len, texts)) / rates[0])
    line("ner detector alone", rates, f"{per_cpu_second:,.0f} tokens per CPU-second on one thread")


if __name__ == "__main__":
    main()
