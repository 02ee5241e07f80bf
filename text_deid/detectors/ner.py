"""Clinical NER: a Hugging Face token classifier on disk, run on CPU with torch.

Configuration
-------------
Settings come in `NerSettings` (the edges fill them from the environment, adapter/settings.py; the detector
never reads it):

* Model folder: `model_path`, else the project's
  model in `text_deid/models/ner-tiny-cased` (a 4-layer cased BERT trained on synthetic notes by
  `python -m text_deid.ner_training.train`).  The folder must hold a *fast* tokenizer (offsets are
  taken from its `offset_mapping`) and a `*ForTokenClassification` model.
* Label map: `labels.json` / `labels.yaml` in the model folder, or `labels_path`
  (a JSON or YAML file): model entity type → our category, e.g. for an i2b2 model
  `{"PATIENT": "NAME", "STAFF": "NAME", "HOSP": "GEOGRAPHIC_LOCATION", "DATE": "DATE", "AGE": null}`.
  Model labels are read as `O` or `PREFIX-TYPE` with PREFIX in B, I, L, U, E, S (BIO/BILOU/BIOES);
  `null` ignores a type on purpose.  A model type that is missing from the map is a configuration
  error (never silently dropped).
* Threads: `torch.set_num_threads(threads or 1)`.
* Threshold: a token is PHI when 1 - P(O) >= `threshold` (default 0.8, chosen on the
  ASQ-PHI tuning half as the lowest of 0.5/0.8/0.9/0.95 at which `no-llm` keeps the upper 95% bound of
  hard negatives flagged under 5% and the lower bound of precision over 97%: a low threshold keeps the
  most NER recall for text the other layers miss); its category is the most probable non-O type.
  Confidence of a span = mean over its tokens of 1 - P(O).

Windowing: the whole text is tokenized once; windows of `max_len` tokens overlap by `stride` tokens and
each token takes its prediction from the window in which it sits furthest from an edge, so a name on
a window boundary is decoded once, from full context.  Spans are widened to whole words (a word being
a run of letters/digits) and mapped back to characters through the tokenizer's offsets.

Fail closed: a missing model, missing torch/transformers or a bad label map raise `NerUnavailable`
(the stack turns it into `StackUnavailable`, exit 2); anything going wrong during inference, or an
output that is not a finite probability table of the right shape, raises `DetectorError`.  Messages
never contain text from the record.
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Sequence

from text_deid import budget
from text_deid.spans import CATEGORIES, DetectorError, KnownIdentifier, Span

DETECTOR = "ner"
DEFAULT_THRESHOLD = 0.8


def _weights_digest(path: str) -> str:
    """A short digest of the model's weight files, so audit records name the exact model."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if name.endswith((".safetensors", ".bin")):
            with open(os.path.join(path, name), "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:12]
DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "ner-tiny-cased")
_PREFIXES = ("B", "I", "L", "U", "E", "S")
_WORD_CHAR = re.compile(r"\w")


_TRIM_TRAIL = set(",;:!?()[]{}\"'`/\\-–—") | {" ", "\t", "\n", "\r"}
_ABBREV_DOT = re.compile(r"(?:\b[A-Z]|\b(?:St|Mt|Dr|Jr|Sr|Ft|Ave|Blvd|Rd|Ln|Ct|Apt|Ste|Hosp|Ctr|Inc|Co))\.$")


def _trim(text: str, a: int, b: int) -> tuple[int, int]:
    """No span starts or ends on punctuation or space; a final '.' stays only after an initial or abbreviation."""
    while a < b and not text[a].isalnum():
        if text[a] == "+" or (text[a] == "(" and ")" in text[a:b] and a + 1 < b and text[a + 1].isdigit()):
            break
        a += 1
    while b > a:
        ch = text[b - 1]
        if ch == ")" and "(" in text[a:b - 1]:
            break
        if ch in _TRIM_TRAIL:
            b -= 1
        elif ch == "." and not _ABBREV_DOT.search(text[a:b]):
            b -= 1
        else:
            break
    return a, b


class NerUnavailable(RuntimeError):
    """The NER detector cannot be built here (missing package, model file or label map)."""


def _load_label_map(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = fh.read()
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(raw)
        else:
            data = json.loads(raw)
    except (OSError, ValueError) as e:
        raise NerUnavailable(f"ner: cannot read label map {path} ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise NerUnavailable(f"ner: label map {path} must map model entity types to categories")
    for k, v in data.items():
        if v is not None and v not in CATEGORIES:
            raise NerUnavailable(f"ner: label map {path}: {k!r} maps to unknown category {v!r}")
    return data


def _split_label(label: str) -> tuple[str | None, str | None]:
    """'B-NAME' -> ('B', 'NAME'); 'O' -> (None, None); a bare 'NAME' -> ('I', 'NAME')."""
    if label in ("O", "o", "OUT", "0"):
        return None, None
    for sep in ("-", "_"):
        head, _, tail = label.partition(sep)
        if tail and head.upper() in _PREFIXES:
            return head.upper(), tail
    return "I", label


@dataclass(frozen=True)
class NerSettings:
    """Which model, label map, threads and threshold the NER detector runs with (None: the defaults)."""

    model_path: str | None = None
    labels_path: str | None = None
    threads: int | None = None
    threshold: float | None = None


class NerDetector:
    name = DETECTOR

    def __init__(self, model_path: str | None = None, labels_path: str | None = None, *,
                 max_len: int | None = None, stride: int | None = None, threshold: float | None = None,
                 threads: int | None = None):
        path = model_path or DEFAULT_MODEL
        if not os.path.isdir(path):
            raise NerUnavailable(f"ner: model folder not found: {path} (set DEID_ADAPTER_NER_MODEL)")
        if not any(os.path.isfile(os.path.join(path, f)) for f in ("model.safetensors", "pytorch_model.bin")):
            raise NerUnavailable(f"ner: no model weights (model.safetensors) in {path}")
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            raise NerUnavailable(f"ner: no fast tokenizer (tokenizer.json) in {path}")
        if not labels_path:
            for f in ("labels.json", "labels.yaml", "labels.yml"):
                if os.path.isfile(os.path.join(path, f)):
                    labels_path = os.path.join(path, f)
                    break
        if not labels_path:
            raise NerUnavailable(f"ner: no label map (labels.json) in {path} (set DEID_ADAPTER_NER_LABELS)")
        label_map = _load_label_map(labels_path)
        labels = self._parse_labels(path, label_map, labels_path)
        try:
            import torch
            from transformers import AutoModelForTokenClassification, AutoTokenizer
        except ImportError as e:
            raise NerUnavailable(
                f"ner: needs torch and transformers ({e.name} is not installed; pip install 'deid-adapter[ner]')"
            ) from None
        self._torch = torch
        n_threads = threads or 1
        torch.set_num_threads(max(1, n_threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        except Exception:  # pragma: no cover - cosmetic only
            pass
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.model = AutoModelForTokenClassification.from_pretrained(path, local_files_only=True,
                                                                         dtype=torch.float32)
        except Exception as e:
            raise NerUnavailable(f"ner: cannot load model from {path} ({type(e).__name__})") from None
        if not getattr(self.tokenizer, "is_fast", False):
            raise NerUnavailable(f"ner: the tokenizer in {path} is not a fast tokenizer (no character offsets)")
        self.model.eval()
        if [str(self.model.config.id2label[i]) for i in range(self.model.config.num_labels)] != labels:
            raise NerUnavailable(f"ner: labels of the loaded model differ from {path}/config.json")
        self._cats = sorted({c for c in self._label_cat if c})
        limit = int(getattr(self.model.config, "max_position_embeddings", 512))
        self.max_len = max_len or min(128, limit)
        if self.max_len > limit:
            raise NerUnavailable("ner: max_len exceeds the model's positions")
        self.stride = stride if stride is not None else self.max_len // 4
        if not 0 <= self.stride < (self.max_len - 2) // 2 + 1:
            raise NerUnavailable("ner: stride must be smaller than half the window")
        self.threshold = threshold if threshold is not None else DEFAULT_THRESHOLD
        self.model_path = path
        # what the audit trail records: which weights, at which threshold (never the model object)
        self.version = f"{os.path.basename(os.path.normpath(path))} sha256:{_weights_digest(path)} threshold={self.threshold}"
        self._lock = threading.Lock()

    def _parse_labels(self, path: str, label_map: dict, labels_path: str) -> list[str]:
        """Model labels from config.json, checked against the label map before any weights are loaded."""
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
                id2label = json.load(fh)["id2label"]
            labels = [str(id2label[str(i)]) for i in range(len(id2label))]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise NerUnavailable(f"ner: cannot read the labels in {path}/config.json ({type(e).__name__})") from None
        # per label id: category (None for O / ignored types) and whether it opens a span
        self._label_cat: list[str | None] = []
        self._begin: list[bool] = []
        o_ids = []
        for i, lab in enumerate(labels):
            prefix, typ = _split_label(lab)
            if typ is None:
                o_ids.append(i)
                self._label_cat.append(None)
                self._begin.append(False)
                continue
            if typ not in label_map:
                raise NerUnavailable(f"ner: model label {lab!r} is not in the label map {labels_path}")
            self._label_cat.append(label_map[typ])
            self._begin.append(prefix in ("B", "U", "S"))
        if len(o_ids) != 1:
            raise NerUnavailable("ner: the model must have exactly one 'O' label")
        self._o = o_ids[0]
        return labels

    # ------------------------------------------------------------------------------ inference
    def _windows(self, n: int) -> list[tuple[int, int]]:
        body = self.max_len - 2
        if n <= body:
            return [(0, n)]
        step = body - self.stride
        out, i = [], 0
        while True:
            out.append((i, min(i + body, n)))
            if i + body >= n:
                return out
            i += step

    def _probs(self, ids: list[int]):
        """Per-token class probabilities (n_tokens x n_labels) over windows, best window per token."""
        torch = self._torch
        tok = self.tokenizer
        wins = self._windows(len(ids))
        batch = [[tok.cls_token_id] + ids[a:b] + [tok.sep_token_id] for a, b in wins]
        L = max(len(x) for x in batch)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        inp = torch.full((len(batch), L), pad, dtype=torch.long)
        att = torch.zeros((len(batch), L), dtype=torch.long)
        for r, x in enumerate(batch):
            inp[r, :len(x)] = torch.tensor(x, dtype=torch.long)
            att[r, :len(x)] = 1
        with self._lock, torch.inference_mode():
            logits = self.model(input_ids=inp, attention_mask=att).logits
        if logits.dim() != 3 or logits.shape[0] != len(batch) or logits.shape[1] != L \
                or logits.shape[2] != len(self._label_cat):
            raise DetectorError("ner: model output has the wrong shape")
        probs = torch.softmax(logits.float(), dim=-1)
        if not bool(torch.isfinite(probs).all()):
            raise DetectorError("ner: model output is not finite")
        out = torch.empty((len(ids), probs.shape[2]))
        best = [-1] * len(ids)
        for w, (a, b) in enumerate(wins):
            for k in range(a, b):
                margin = min(k - a, b - 1 - k)  # distance to the window's nearer edge
                if margin > best[k]:
                    best[k] = margin
                    out[k] = probs[w, 1 + k - a]
        return out

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        if not isinstance(text, str):
            raise DetectorError("ner: input is not text")
        if not text.strip():
            return []
        budget.check(DETECTOR)  # past the record's deadline, no more inference
        try:
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, offs = enc["input_ids"], enc["offset_mapping"]
            if not ids:
                return []
            probs = self._probs(ids)
            return self._decode(text, probs, offs)
        except DetectorError:
            raise
        except Exception as e:  # never let a foreign message (which may quote text) escape
            raise DetectorError(f"ner: inference failed ({type(e).__name__})") from None

    def _decode(self, text: str, probs, offs) -> list[Span]:
        o = self._o
        p_phi = (1.0 - probs[:, o]).tolist()
        pr = probs.clone()
        pr[:, o] = -1.0
        arg = pr.argmax(dim=-1).tolist()
        spans: list[list] = []  # [start, end, cat, [scores]]
        prev_cat = None
        prev_end = -1
        for k, (a, b) in enumerate(offs):
            if b <= a:
                continue
            if p_phi[k] < self.threshold or self._label_cat[arg[k]] is None:
                prev_cat = None
                continue
            cat = self._label_cat[arg[k]]
            begin = self._begin[arg[k]]
            cont = (prev_cat == cat and not begin and spans) or (
                prev_cat == cat and spans and a == prev_end)  # a word piece never starts a new span
            if cont:
                spans[-1][1] = b
                spans[-1][3].append(p_phi[k])
            else:
                spans.append([a, b, cat, [p_phi[k]]])
            prev_cat, prev_end = cat, b
        out = []
        n = len(text)
        for a, b, cat, scores in spans:
            while a > 0 and _WORD_CHAR.match(text[a - 1]) and _WORD_CHAR.match(text[a]):
                a -= 1
            while b < n and _WORD_CHAR.match(text[b]) and _WORD_CHAR.match(text[b - 1]):
                b += 1
            a, b = _trim(text, a, b)
            if b <= a:
                continue
            if out and a < out[-1].end:  # widening made two spans touch: join them
                last = out.pop()
                a = last.start
                scores = scores + [last.confidence]
            out.append(Span(a, b, cat, DETECTOR, float(sum(scores) / len(scores))))
        return out
