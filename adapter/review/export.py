"""Reviewer decisions as labeled training examples, one per reviewed text, shaped like the gold files
(`{id, text, spans: [{start, end, category}]}`): the spans are the ones the reviewer kept, changed or added, so a
rejected span is a negative example. Without the review key the text stays sealed (the row's ciphertext, which
only the review key opens); with it the text is written in the clear, to a local file of mode 0600.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

from adapter.review.queue import QueueRow, ReviewQueue

KEPT = ("confirm", "change", "add")


def labeled_spans(decisions: list[dict], text_index: int) -> list[dict]:
    """The spans a text was released with, by the reviewer's decisions, sorted."""
    return sorted(({"start": d["start"], "end": d["end"], "category": d["category"]} for d in decisions
                   if d["text"] == text_index and d["action"] in KEPT), key=lambda s: (s["start"], s["end"]))


def examples(rows: Iterable[tuple[QueueRow, str, str, str]], queue: Optional[ReviewQueue]):
    """One example per reviewed text; `queue` (holding the review key) decrypts the text, None keeps it sealed."""
    for row, key_id, nonce, ciphertext in rows:
        texts = None
        if queue is not None:
            texts = json.loads(queue.unseal(row.id, row.site, key_id, nonce, ciphertext))["texts"]
        indices = sorted({d["text"] for d in row.decisions})
        for t in indices:
            example = {"id": f"{row.id}:{t}", "site": row.site, "reviewer": row.reviewer,
                       "spans": labeled_spans(row.decisions, t),
                       "decisions": [{k: d[k] for k in ("start", "end", "category", "action", "original_category")}
                                     for d in row.decisions if d["text"] == t]}
            if texts is not None:
                example["text"] = texts[t]["text"]
            else:
                example["sealed"] = {"item": row.id, "text_index": t, "review_key_id": key_id, "nonce": nonce,
                                     "ciphertext": ciphertext}
            yield example


def export_examples(rows, queue: Optional[ReviewQueue], out: Path) -> int:
    """Write the examples as JSONL to `out` (mode 0600, replaced atomically); returns how many."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for example in examples(rows, queue):
                f.write(json.dumps(example, ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n
