"""Clinical NER: a Hugging Face token classifier on disk, exported to ONNX and run on CPU with onnxruntime.

Configuration
-------------
Settings come in `NerSettings` (the edges fill them from the environment, adapter/settings.py; the detector
never reads it):

* Model folder: `model_path`, else the project's
  model in `text_deid/models/ner-tiny-cased` (a 4-layer cased BERT trained on synthetic notes by
  `python -m text_deid.ner_training.train`).  The folder must hold a *fast* tokenizer (`tokenizer.json`:
  offsets are taken from it), the model's `config.json` (labels, positions) and its graph `model.onnx`
  as `python -m text_deid.ner_training.export` writes it (int8 weights).  Inference needs onnxruntime,
  tokenizers and numpy, not torch; torch is for training and export only.  A `model.onnx` exported
  from other weights than the folder's `model.safetensors` (a retrained model) is refused.
* Label map: `labels.json` / `labels.yaml` in the model folder, or `labels_path`
  (a JSON or YAML file): model entity type → our category, e.g. for an i2b2 model
  `{"PATIENT": "NAME", "STAFF": "NAME", "HOSP": "GEOGRAPHIC_LOCATION", "DATE": "DATE", "AGE": null}`.
  Model labels are read as `O` or `PREFIX-TYPE` with PREFIX in B, I, L, U, E, S (BIO/BILOU/BIOES);
  `null` ignores a type on purpose.  A model type that is missing from the map is a configuration
  error (never silently dropped).
* Threads: onnxruntime's intra-op threads, `threads or 1`.
* Threshold: a token is PHI when 1 - P(O) >= `threshold` (default 0.8, chosen on the
  ASQ-PHI tuning half as the lowest of 0.5/0.8/0.9/0.95 at which `no-llm` keeps the upper 95% bound of
  hard negatives flagged under 5% and the lower bound of precision over 97%: a low threshold keeps the
  most NER recall for text the other layers miss); its category is the most probable non-O type.
  Confidence of a span = mean over its tokens of 1 - P(O).

Windowing: the whole text is tokenized once; windows of `max_len` tokens overlap by `stride` tokens and
each token takes its prediction from the window in which it sits furthest from an edge, so a name on
a window boundary is decoded once, from full context.  The windows of all the texts of a record
(`detect_many`) run together, in batches of similar length.  Spans are widened to whole words (a word being
a run of letters/digits) and mapped back to characters through the tokenizer's offsets.

Fail closed: a missing or stale model, missing onnxruntime/tokenizers or a bad label map raise `NerUnavailable`
(the stack turns it into `StackUnavailable`, exit 2); anything going wrong during inference, or an
output that is not a finite probability table of the right shape, raises `DetectorError`.  Messages
never contain text from the record.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Sequence

from text_deid import budget
from text_deid.spans import CATEGORIES, DetectorError, KnownIdentifier, Span

DETECTOR = "ner"
DEFAULT_THRESHOLD = 0.8


ONNX_FILE = "model.onnx"
WEIGHT_FILES = (".safetensors", ".bin")  # the torch weights an ONNX graph is exported from
BATCH_WINDOWS = 32  # windows per onnxruntime call for an fp32 graph; the record's deadline is checked between calls
# A long text is tokenized in pieces cut after a space or line break, with the record's deadline checked between
# pieces, when the tokenizer splits words at whitespace anyway (the tokens are then the same); decoding looks at the
# deadline every BUDGET_TOKENS tokens.
ENCODE_PIECE_CHARS = 1 << 16
BUDGET_TOKENS = 1 << 14
_PIECE_END = re.compile(r"[ \t\n\r]")
_SPLITS_AT_SPACES = ("BertPreTokenizer", "Whitespace", "WhitespaceSplit")


def _file_digest(path: str, digest=None):
    digest = digest or hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _has_weights(folder: str) -> bool:
    return any(name.endswith(WEIGHT_FILES) for name in os.listdir(folder))


def weights_digest(folder: str) -> str:
    """sha256 of the folder's torch weight files, in name order: what its ONNX graph must be exported from."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(WEIGHT_FILES):
            _file_digest(os.path.join(folder, name), digest)
    return digest.hexdigest()


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
    text_bound = True  # CPU work in proportion to the text: in the calling thread on a short record

    def __init__(self, model_path: str | None = None, labels_path: str | None = None, *,
                 max_len: int | None = None, stride: int | None = None, threshold: float | None = None,
                 threads: int | None = None):
        path = model_path or DEFAULT_MODEL
        if not os.path.isdir(path):
            raise NerUnavailable(f"ner: model folder not found: {path} (set DEID_ADAPTER_NER_MODEL)")
        onnx_path = os.path.join(path, ONNX_FILE)
        if not os.path.isfile(onnx_path):
            raise NerUnavailable(f"ner: no model weights ({ONNX_FILE}) in {path}; "
                                 f"export them: python -m text_deid.ner_training.export {path}")
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
            import numpy
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as e:
            raise NerUnavailable(
                f"ner: needs onnxruntime and tokenizers ({e.name} is not installed; pip install 'deid-adapter[ner]')"
            ) from None
        self._np = numpy
        try:
            self.tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
            self.tokenizer.no_truncation()
            self.tokenizer.no_padding()
            self._pieces = type(self.tokenizer.pre_tokenizer).__name__ in _SPLITS_AT_SPACES
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = max(1, threads or 1)
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # CPU for work, not waiting
            options.log_severity_level = 3
            self._session = onnxruntime.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
            meta = self._session.get_modelmeta().custom_metadata_map
        except Exception as e:
            raise NerUnavailable(f"ner: cannot load model from {path} ({type(e).__name__})") from None
        if {i.name for i in self._session.get_inputs()} != {"input_ids", "attention_mask"}:
            raise NerUnavailable(f"ner: {path}/{ONNX_FILE} must take input_ids and attention_mask")
        if "labels" in meta and json.loads(meta["labels"]) != labels:
            raise NerUnavailable(f"ner: labels of {path}/{ONNX_FILE} differ from {path}/config.json")
        if "source_sha256" in meta and _has_weights(path) and meta["source_sha256"] != weights_digest(path):
            raise NerUnavailable(f"ner: {path}/{ONNX_FILE} was exported from other weights than the folder's; "
                                 f"export them again: python -m text_deid.ner_training.export {path}")
        self._special = self._special_ids(path)
        # An int8 graph quantizes its activations with one scale per call, so windows batched together would
        # shift each other's results: a text's spans would depend on the other texts of its record. Only a graph
        # exported as fp32 is batched (one of unknown precision may be quantized).
        self._batch = BATCH_WINDOWS if meta.get("precision") == "fp32" else 1
        self._cats = sorted({c for c in self._label_cat if c})
        limit = self._positions
        self.max_len = max_len or min(128, limit)
        if self.max_len > limit:
            raise NerUnavailable("ner: max_len exceeds the model's positions")
        self.stride = stride if stride is not None else self.max_len // 4
        if not 0 <= self.stride < (self.max_len - 2) // 2 + 1:
            raise NerUnavailable("ner: stride must be smaller than half the window")
        self.threshold = threshold if threshold is not None else DEFAULT_THRESHOLD
        self.model_path = path
        # what the audit trail records: which graph runs, at which threshold (never the model object)
        self.version = (f"{os.path.basename(os.path.normpath(path))} sha256:{_file_digest(onnx_path)[:12]} "
                        f"threshold={self.threshold}")

    def _special_ids(self, path: str) -> tuple[int, int, int]:
        """([CLS], [SEP], [PAD]) ids, named by tokenizer_config.json (BERT's names where it does not say)."""
        try:
            with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as fh:
                named = json.load(fh)
        except (OSError, ValueError):
            named = {}
        ids = []
        for key, default in (("cls_token", "[CLS]"), ("sep_token", "[SEP]"), ("pad_token", "[PAD]")):
            token = named.get(key) if isinstance(named.get(key), str) else default
            ids.append(self.tokenizer.token_to_id(token))
        if ids[0] is None or ids[1] is None:
            raise NerUnavailable(f"ner: the tokenizer in {path} has no [CLS]/[SEP] tokens")
        return ids[0], ids[1], ids[2] if ids[2] is not None else 0

    def _parse_labels(self, path: str, label_map: dict, labels_path: str) -> list[str]:
        """Model labels from config.json, checked against the label map before any weights are loaded."""
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
                config = json.load(fh)
            id2label = config["id2label"]
            labels = [str(id2label[str(i)]) for i in range(len(id2label))]
            self._positions = int(config.get("max_position_embeddings", 512))
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

    def encode(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """(token ids, character offsets) of each text, without special tokens."""
        whole = [t for t in texts if not self._pieces or len(t) <= ENCODE_PIECE_CHARS]
        encoded = iter(self.tokenizer.encode_batch(whole, add_special_tokens=False) if whole else ())
        out = []
        for t in texts:
            if not self._pieces or len(t) <= ENCODE_PIECE_CHARS:
                e = next(encoded)
                out.append((e.ids, e.offsets))
            else:
                out.append(self._encode_long(t))
        return out

    def _encode_long(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        start = 0
        while start < len(text):
            budget.check(DETECTOR)
            cut = _PIECE_END.search(text, start + ENCODE_PIECE_CHARS)
            end = cut.end() if cut else len(text)
            e = self.tokenizer.encode(text[start:end], add_special_tokens=False)
            ids += e.ids
            offsets += [(a + start, b + start) for a, b in e.offsets]
            start = end
        return ids, offsets

    def _logits(self, rows: list[list[int]]):
        """Logits (rows x longest x labels) of one batch of windows, each row [CLS] ids [SEP], padded."""
        np = self._np
        width = max(map(len, rows))
        ids = np.full((len(rows), width), self._special[2], dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, row in enumerate(rows):
            ids[r, :len(row)] = row
            mask[r, :len(row)] = 1
        logits = self._session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        if getattr(logits, "shape", None) != (len(rows), width, len(self._label_cat)):
            raise DetectorError("ner: model output has the wrong shape")
        return logits

    def _probs(self, encoded: list[list[int]]) -> list:
        """Per text, per-token class probabilities (tokens x labels): the windows of every text run in
        batches of similar length, and each token takes the window in which it sits furthest from an edge."""
        np = self._np
        cls, sep, _ = self._special
        windows = [(t, a, b) for t, ids in enumerate(encoded) for a, b in self._windows(len(ids)) if ids]
        windows.sort(key=lambda w: w[2] - w[1], reverse=True)  # less padding per batch
        out = [np.empty((len(ids), len(self._label_cat)), dtype=np.float32) for ids in encoded]
        best = [np.full(len(ids), -1) for ids in encoded]
        for i in range(0, len(windows), self._batch):
            budget.check(DETECTOR)  # past the record's deadline, no more inference
            batch = windows[i:i + self._batch]
            logits = self._logits([[cls, *encoded[t][a:b], sep] for t, a, b in batch])
            with np.errstate(over="ignore", invalid="ignore"):
                exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
                probs = exp / exp.sum(axis=-1, keepdims=True)
            if not np.isfinite(probs).all():
                raise DetectorError("ner: model output is not finite")
            for row, (t, a, b) in enumerate(batch):
                k = np.arange(a, b)
                margin = np.minimum(k - a, b - 1 - k)  # distance to the window's nearer edge
                better = margin > best[t][a:b]
                best[t][k[better]] = margin[better]
                out[t][k[better]] = probs[row, 1 + k[better] - a]
        return out

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        return self.detect_many([text], known)[0]

    def detect_many(self, texts: Sequence[str], known: Sequence[KnownIdentifier] = ()) -> list[list[Span]]:
        """Spans for each text; the windows of all the texts run together."""
        if not all(isinstance(t, str) for t in texts):
            raise DetectorError("ner: input is not text")
        live = [t for t in texts if t.strip()]
        if not live:
            return [[] for _ in texts]
        budget.check(DETECTOR)
        try:
            encoded = self.encode(live)
            probs = self._probs([ids for ids, _ in encoded])
            found = [self._decode(t, p, offs) for t, p, (_, offs) in zip(live, probs, encoded)]
        except DetectorError:
            raise
        except Exception as e:  # never let a foreign message (which may quote text) escape
            raise DetectorError(f"ner: inference failed ({type(e).__name__})") from None
        in_order = iter(found)
        return [next(in_order) if t.strip() else [] for t in texts]

    def _decode(self, text: str, probs, offs) -> list[Span]:
        o = self._o
        p_phi = (1.0 - probs[:, o]).tolist()
        pr = probs.copy()
        pr[:, o] = -1.0
        arg = pr.argmax(axis=-1).tolist()
        spans: list[list] = []  # [start, end, cat, [scores]]
        prev_cat = None
        prev_end = -1
        for k, (a, b) in enumerate(offs):
            if not k % BUDGET_TOKENS:
                budget.check(DETECTOR)
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
