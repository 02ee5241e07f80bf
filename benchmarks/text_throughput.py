"""Text-stack throughput beside presidio-analyzer's AnalyzerEngine (pattern recognizers only, no spaCy
model: the `no_op` NLP engine), on the same text, measured side by side in one run.

Run: .venv/bin/python benchmarks/text_throughput.py [--repeat N] [--stacks patterns,no-llm]
Text: the ASQ-PHI tuning queries (../shared/data/asq-phi/tuning.jsonl), one call per query. Prints chars/s
for each and the ratio each stack has over Presidio's pattern-only analyzer (target: patterns >= 10x), and
the NER detector's tokens/s on one thread (target: >= 5,000).
A stack whose detectors are not available here (no-llm without the NER model) is reported and skipped.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

from text_deid.stack import StackUnavailable, build_stack

GOLD = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "asq-phi" / "tuning.jsonl"


def presidio_pattern_analyzer():
    """AnalyzerEngine with its predefined recognizers and the no_op NLP engine; tldextract kept offline."""
    import tldextract
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NoOpNlpEngine
    from presidio_analyzer.predefined_recognizers.generic import email_recognizer

    # EmailRecognizer's tldextract would try to fetch the Public Suffix List (../shared/research/env-probe.md).
    email_recognizer.tldextract = SimpleNamespace(extract=tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None))
    engine = AnalyzerEngine(nlp_engine=NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "no_op"}]), supported_languages=["en"])
    return lambda text: engine.analyze(text, language="en")


def chars_per_second(fn, texts: list[str], repeat: int) -> float:
    fn(texts[0])  # warm-up: lazy compilation and caches
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for t in texts:
            fn(t)
        best = min(best, time.perf_counter() - start)
    return sum(map(len, texts)) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stacks", default="patterns,gazetteer,no-llm")
    args = parser.parse_args()
    texts = [json.loads(line)["text"] for line in GOLD.read_text(encoding="utf-8").splitlines() if line.strip()]
    total = sum(map(len, texts))
    print(f"text: {len(texts)} queries, {total:,} chars; best of {args.repeat}")
    presidio = chars_per_second(presidio_pattern_analyzer(), texts, args.repeat)
    print(f"{'presidio pattern-only (no_op nlp)':<36} {presidio:>12,.0f} chars/s")
    for name in args.stacks.split(","):
        try:
            stack = build_stack(name)
        except StackUnavailable as e:
            print(f"{name:<36} skipped: {e}")
            continue
        # one detector thread pool per call is part of the stack's cost, so it is measured
        cps = chars_per_second(lambda t: stack.detect(t, ()), texts, args.repeat)
        print(f"{name:<36} {cps:>12,.0f} chars/s  {cps / presidio:6.1f}x presidio pattern-only")
    ner_tokens_per_second(texts, args.repeat)


def ner_tokens_per_second(texts: list[str], repeat: int) -> None:
    """The NER detector alone, one call per query, on one thread (DEID_ADAPTER_NER_THREADS, default 1)."""
    from text_deid.detectors.ner import NerDetector, NerUnavailable

    try:
        ner = NerDetector()
    except NerUnavailable as e:
        print(f"{'ner':<36} skipped: {e}")
        return
    tokens = sum(len(ner.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    cps = chars_per_second(lambda t: ner.detect(t, ()), texts, repeat)
    seconds = sum(map(len, texts)) / cps
    print(f"{'ner detector alone':<36} {cps:>12,.0f} chars/s  {tokens / seconds:,.0f} tokens/s on one thread")


if __name__ == "__main__":
    main()
