"""Active learning: review decisions that fix a systematic miss (the site's trauma aliases, two upper-case code
words) fine-tune the project's NER, and recall on held-out aliases (unseen words) goes up."""
from __future__ import annotations

import json
import random

from adapter.review.training import fine_tune, load_examples
from text_deid.detectors.ner import NerDetector

WORDS_REVIEWED = ["ZEBRA", "PURPLE", "TANGO", "COBALT", "HERON", "MAPLE", "QUARTZ", "DELTA", "OTTER", "AMBER",
                  "FALCON", "IVORY", "CEDAR", "BISON", "COPPER", "LYNX"]
WORDS_HELD_OUT = ["WALRUS", "CRIMSON", "OSPREY", "SAFFRON", "GRANITE", "JACKAL", "INDIGO", "PUMA"]
TEMPLATES = ["Trauma alias {} assigned at triage.", "ED board lists the patient as {} pending registration.",
             "Registered under alias {} per unidentified-patient protocol.", "Labs drawn for {} at 0300."]
TEMPLATES_HELD_OUT = ["Alias {} kept until identity confirmed.", "Per protocol the trauma alias {} stays on all orders."]


def aliases(words, templates, n, seed):
    """Notes with one alias each, labeled as a reviewer labels them (the alias added as NAME)."""
    rng, out = random.Random(seed), []
    for i in range(n):
        alias, template = f"{rng.choice(words)} {rng.choice(words)}", rng.choice(templates)
        start = template.index("{}")
        out.append({"id": f"{seed}-{i}", "text": template.format(alias),
                    "spans": [{"start": start, "end": start + len(alias), "category": "NAME"}]})
    return out


def covered_recall(detector, gold) -> float:
    """Share of gold spans whose every non-space character is inside a detected span."""
    hit = total = 0
    for ex in gold:
        found = detector.detect(ex["text"])
        for g in ex["spans"]:
            total += 1
            hit += all(any(s.start <= i < s.end for s in found)
                       for i in range(g["start"], g["end"]) if not ex["text"][i].isspace())
    return hit / total


def test_review_decisions_raise_recall_on_the_missed_pattern(tmp_path):
    exported = tmp_path / "examples.jsonl"
    exported.write_text("".join(json.dumps(e) + "\n" for e in aliases(WORDS_REVIEWED, TEMPLATES, 40, 1)))
    held_out = aliases(WORDS_HELD_OUT, TEMPLATES + TEMPLATES_HELD_OUT, 40, 2)
    before = covered_recall(NerDetector(), held_out)
    report = fine_tune(load_examples(exported), tmp_path / "model", synthetic=40, steps=80, batch=8)
    after = covered_recall(NerDetector(model_path=str(tmp_path / "model")), held_out)
    print(f"held-out alias recall before {before:.3f} after {after:.3f} ({report['seconds']} s fine-tuning)")
    assert after > before
