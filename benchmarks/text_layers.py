"""What each layer of the default stack adds: `no-llm` against `no-llm` with one layer off, paired on the same
resamples (the evaluation's `compare`), on a gold JSONL file.

Run: .venv/bin/python benchmarks/text_layers.py GOLD.jsonl [--cluster template] [--layers addresses,...]
A layer is a detector or a filter of the stack (`name-parts` is the filter `join_name_parts`). Prints counts and
rates only, never note text.
"""
from __future__ import annotations

import argparse

from text_deid import evaluation
from text_deid.stack import FILTERS, STACK_FILTERS, TextStack, build_stack

LAYERS = ("addresses", "unknown-words-in-context", "name-parts")


def without(stack: TextStack, layer: str) -> TextStack:
    """`stack` with the detector or filter named `layer` left out."""
    filters = [f for name, f in zip(STACK_FILTERS[stack.name], stack.filters) if name != layer]
    return TextStack(f"{stack.name}-without-{layer}", [d for d in stack.detectors if d.name != layer], filters=filters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gold")
    parser.add_argument("--cluster", default=None, help="bootstrap over the groups sharing this field")
    parser.add_argument("--layers", default=",".join(LAYERS))
    args = parser.parse_args()
    gold = evaluation.load_jsonl(args.gold)
    full = build_stack("no-llm")

    def predict(stack: TextStack) -> dict:
        return {r["id"]: [s.to_json() for s in stack.detect(r["text"])] for r in gold}

    ours = predict(full)
    for layer in args.layers.split(","):
        if layer not in {d.name for d in full.detectors} | set(FILTERS):
            parser.error(f"no layer {layer!r} in no-llm")
        other = without(full, layer)
        print(evaluation.format_comparison(evaluation.compare(gold, ours, predict(other), cluster=args.cluster),
                                           full.name, other.name))


if __name__ == "__main__":
    main()
