"""Numbers for the NER model: per-category recall/precision on held-out synthetic notes, on held-out world
documents (`world.generate_world`, also recall per form: single, lowercase, upper, non-ascii, multi-part)
and on a gold JSONL (e.g. ASQ-PHI tuning), for the NER alone and for stacks, plus tokens/s on one thread.

    python -m text_deid.ner_training.measure --gold ../shared/data/asq-phi/tuning.jsonl --stacks patterns ner-only
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from text_deid.evaluation import evaluate
from text_deid.stack import build_stack
from text_deid.detectors.ner import NerDetector
from text_deid.ner_training.synth import generate
from text_deid.ner_training.world import generate_world


def per_category_precision(gold, pred):
    """Predicted spans per category that overlap a gold span of any category / predicted spans."""
    hit, tot = Counter(), Counter()
    for rec in gold:
        gs = rec["spans"]
        for p in pred.get(rec["id"], []):
            tot[p["category"]] += 1
            if any(g["start"] < p["end"] and p["start"] < g["end"] for g in gs):
                hit[p["category"]] += 1
    return {c: round(hit[c] / tot[c], 4) for c in sorted(tot)}


def per_form_recall(gold, pred):
    """Recall (any overlap, any category) of the gold spans that carry a "form", per category and form."""
    hit, tot = Counter(), Counter()
    for rec in gold:
        ps = pred.get(rec["id"], [])
        for g in rec["spans"]:
            if "form" not in g:
                continue
            key = f"{g['category']}/{g['form']}"
            tot[key] += 1
            hit[key] += any(p["start"] < g["end"] and g["start"] < p["end"] for p in ps)
    return {k: (round(hit[k] / tot[k], 4), tot[k]) for k in sorted(tot)}


def run(name, gold, detect):
    pred = {r["id"]: [s.to_json() for s in detect(r["text"])] for r in gold}
    res = evaluate(gold, pred, resamples=200, seed=0)
    out = {k: res[k]["value"]
           for k in ("span_recall", "span_precision", "char_recall", "hard_negative_over_redaction", "strict_f1")}
    out["per_category_recall"] = {c: (v["recall"]["value"], v["gold"]) for c, v in res["per_category"].items()}
    out["per_category_precision"] = per_category_precision(gold, pred)
    if any("form" in g for rec in gold for g in rec["spans"]):
        out["per_form_recall"] = per_form_recall(gold, pred)
    print(name, json.dumps(out), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--gold", action="append", default=[])
    ap.add_argument("--heldout", type=int, default=1500)
    ap.add_argument("--world", type=int, default=1500, help="held-out world documents (seed 3)")
    ap.add_argument("--stacks", nargs="*", default=["patterns", "ner-only"])
    ap.add_argument("--sweep", nargs="*", type=float, default=[], help="also score the NER alone at these thresholds")
    ap.add_argument("--model", default=None)
    a = ap.parse_args(argv)
    ner = NerDetector(model_path=a.model)
    sets = {"synthetic-heldout": generate(a.heldout, seed=2, split="heldout")}
    if a.world:
        sets["world-heldout"] = generate_world(a.world, seed=3, split="heldout")
    for g in a.gold:
        with open(g) as fh:
            sets[g] = [json.loads(line) for line in fh]
    for sname, gold in sets.items():
        run(f"{sname} | ner alone", gold, ner.detect)
        default = ner.threshold
        for th in a.sweep:
            ner.threshold = th
            run(f"{sname} | ner alone @{th}", gold, ner.detect)
        ner.threshold = default
        for st in a.stacks:
            stack = build_stack(st)
            run(f"{sname} | stack {st}", gold, stack.detect)
    # throughput, one thread
    texts = [r["text"] for r in sets["synthetic-heldout"]][:600]
    n_tok = sum(len(ids) for ids, _ in ner.encode(texts))
    t0 = time.perf_counter()
    for t in texts:
        ner.detect(t)
    dt = time.perf_counter() - t0
    long = "\n".join(texts[:200])
    n_long = len(ner.encode([long])[0][0])
    t1 = time.perf_counter()
    ner.detect(long)
    dt2 = time.perf_counter() - t1
    print(f"throughput per-doc: {n_tok} tokens in {dt:.2f}s = {n_tok / dt:.0f} tok/s; "
          f"one long note ({n_long} tokens, windowed): {n_long / dt2:.0f} tok/s")


if __name__ == "__main__":
    main()
