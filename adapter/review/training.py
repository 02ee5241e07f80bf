"""Fine-tune the project's NER model on reviewer decisions plus synthetic notes (active learning).

Starts from the trained model (its tokenizer and labels are kept), encodes examples exactly as the NER training
does (`text_deid.ner_training.train.encode`), and draws each batch half from the review examples and half from
the synthetic corpus, so a site's few corrections move the model without it forgetting the rest.
"""
from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Optional, Sequence

from text_deid.detectors.ner import DEFAULT_MODEL
from text_deid.ner_training import export, synth, train
from text_deid.spans import CATEGORIES


def load_examples(path: Path) -> list[dict]:
    """Examples from `review export` with their text decrypted; sealed ones are refused."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ex = json.loads(line)
        except ValueError:
            raise ValueError(f"{path}: line {n}: invalid JSON") from None
        if not isinstance(ex.get("text"), str):
            raise ValueError(f"{path}: line {n}: no text (export with --review-key-file to a site-local path)")
        for s in ex.get("spans", []):
            if s.get("category") not in CATEGORIES or not 0 <= s["start"] < s["end"] <= len(ex["text"]):
                raise ValueError(f"{path}: line {n}: bad span")
        out.append(ex)
    return out


def default_model() -> Path:
    return Path(DEFAULT_MODEL)


def fine_tune(examples: Sequence[dict], out: Path, *, base: Optional[Path] = None, synthetic: int = 400,
              steps: int = 150, batch: int = 16, lr: float = 3e-4, seed: int = 13, max_len: int = 128) -> dict:
    """Fine-tune `base` (default: the project's model) into `out`; returns what was done (sizes, seconds)."""
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    t0 = time.time()
    base = Path(base or default_model())
    random.seed(seed)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = BertForTokenClassification.from_pretrained(base, torch_dtype=torch.float32)
    if [model.config.id2label[i] for i in range(len(train.LABELS))] != train.LABELS:
        raise ValueError(f"{base}: the model's labels are not the NER training's labels")
    reviewed = train.encode(tokenizer, list(examples), max_len)
    corpus = train.encode(tokenizer, synth.generate(synthetic, seed=seed, split="train"), max_len) if synthetic else []
    if not reviewed:
        raise ValueError("no review examples to train on")
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    half = batch // 2 if corpus else batch
    for _ in range(steps):
        picked = [rng.choice(reviewed) for _ in range(half)] + [rng.choice(corpus) for _ in range(batch - half)]
        width = max(len(x) for x, _ in picked)
        ids = torch.full((len(picked), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(picked), width), -100, dtype=torch.long)
        mask = torch.zeros((len(picked), width), dtype=torch.long)
        for r, (x, y) in enumerate(picked):
            ids[r, :len(x)], labels[r, :len(y)], mask[r, :len(x)] = torch.tensor(x), torch.tensor(y), 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.half().save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.copy(base / "labels.json", out / "labels.json")
    export.export(out)  # the graph the NER detector runs
    report = {"base": str(base), "review_examples": len(examples), "review_chunks": len(reviewed),
              "synthetic_docs": synthetic, "steps": steps, "batch": batch, "lr": lr, "seed": seed,
              "final_loss": round(float(loss.item()), 4), "seconds": round(time.time() - t0, 1)}
    (out / "training.json").write_text(json.dumps({**report, "fine_tuned_from_review": True}, indent=1))
    return report


def overlap_recall(detect, gold: Sequence[dict]) -> float:
    """Share of gold spans overlapped by a detected span (any category): what Safe Harbor removal needs."""
    hit = total = 0
    for ex in gold:
        found = detect(ex["text"])
        for g in ex["spans"]:
            total += 1
            hit += any(s.start < g["end"] and g["start"] < s.end for s in found)
    return hit / total if total else 1.0
