"""Text-stack throughput beside presidio-analyzer's AnalyzerEngine on the same text, measured side by side
in one run: Presidio with its pattern recognizers only (no spaCy model: the `no_op` NLP engine), and
Presidio with those recognizers plus the project's NER model through its HuggingFaceNerRecognizer.

Run: .venv/bin/python benchmarks/text_throughput.py [--repeat N] [--stacks patterns,gazetteer,no-llm]
Text: the ASQ-PHI tuning queries (../shared/data/asq-phi/tuning.jsonl), one call per query. The engines are
timed in rounds, each round timing every engine in turn over enough passes to take ~0.5 s, since this
machine's speed drifts between minutes. Prints, from the best round, chars per CPU-second (every thread of
this process, so the figure holds on a busy machine) and per wall second; the ratio of `patterns` and
`gazetteer` over Presidio pattern-only (target: patterns >= 10x) and of `no-llm` over Presidio with the same
NER model, each the median of the per-round ratios with their range; and the NER detector's tokens per
CPU-second on one thread (target: >= 5,000). torch runs on one thread everywhere (DEID_ADAPTER_NER_THREADS,
default 1).
A stack or engine whose parts are not installed here (no-llm without the NER model) is reported and skipped.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

from text_deid.stack import StackUnavailable, build_stack
from text_deid.detectors.ner import NerDetector, NerUnavailable

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


PRESIDIO = "presidio pattern-only (no_op nlp)"
PRESIDIO_NER = "presidio + same NER model (HF pipeline)"
NER = "ner detector alone"
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

    # name -> (the call, the name of the engine it is compared with, or None)
    engines: dict[str, tuple] = {PRESIDIO: (presidio_analyzer(), None)}
    ner_model = ner_model_or_none()
    if ner_model:
        engines[PRESIDIO_NER] = (presidio_analyzer(ner_model), None)
    for name in args.stacks.split(","):
        try:
            stack = build_stack(name)
        except StackUnavailable as e:
            print(f"{name:<40} skipped: {e}")
            continue
        uses_ner = "ner" in [d.name for d in stack.detectors]
        engines[name] = (lambda t, stack=stack: stack.detect(t, ()), PRESIDIO_NER if uses_ner else PRESIDIO)
    ner = ner_detector_or_none()
    if ner:
        engines[NER] = (lambda t: ner.detect(t, ()), None)
    passes = {name: passes_for(fn, texts) for name, (fn, _) in engines.items()}

    # Rounds, each timing every engine once in turn: this machine's speed drifts by tens of percent between
    # minutes, so a ratio is taken between passes seconds apart, per round, and its median printed.
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for _ in range(args.repeat):
        for name, (fn, _) in engines.items():
            times[name].append(timed(fn, texts, passes[name]))

    print(f"text: {len(texts)} queries, {chars:,} chars; {args.repeat} rounds, each engine once per round "
          f"for at least ~{MIN_PASS_S} s (passes over the text: {max(passes.values())} at most)")
    print(f"{'':<40} {'chars/CPU-s':>12} {'chars/s':>12}  (best round)")
    for name, (_, baseline) in engines.items():
        cpu = min(c for c, _ in times[name])
        wall = min(w for _, w in times[name])
        note = ""
        if baseline in times:
            ratios = sorted(b[0] / t[0] for b, t in zip(times[baseline], times[name]))
            note = (f"{statistics.median(ratios):5.1f}x {baseline.split(' (')[0]} (CPU; median of rounds, "
                    f"{ratios[0]:.1f}-{ratios[-1]:.1f})")
        if name == NER:
            tokens = sum(len(ner.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
            note = f"{tokens / cpu:,.0f} tokens per CPU-second on one thread"
        print(f"{name:<40} {chars / cpu:>12,.0f} {chars / wall:>12,.0f}  {note}")


def ner_model_or_none() -> str | None:
    """The default NER model's folder, with torch on one thread; None (and why) without the ner extra."""
    try:
        import torch

        from text_deid.detectors.ner import DEFAULT_MODEL
    except ImportError as e:
        print(f"{PRESIDIO_NER:<40} skipped: {type(e).__name__} (install the ner extra)")
        return None
    torch.set_num_threads(1)
    return DEFAULT_MODEL


def ner_detector_or_none():
    """The NER detector alone, on one thread (DEID_ADAPTER_NER_THREADS, default 1); None when unavailable."""
    try:
        return NerDetector()
    except NerUnavailable as e:
        print(f"{NER:<40} skipped: {e}")
        return None


if __name__ == "__main__":
    main()
