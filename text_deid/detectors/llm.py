"""The local LLM detector: an instruct model served by Ollama is asked for the PHI in a note, chunk by chunk.

Configuration
-------------
* `LlmSettings`: the endpoint and model, the time limit per request (default 120 s), the requests in flight
  per process (default 4) and `num_ctx` (default 8192; refused when the prompt could not fit, since Ollama
  would silently cut it). The edges fill them from options and the environment (adapter/settings.py); the
  detector never reads the environment. There is no default endpoint (an LLM stack without one is
  unavailable, exit 2); the default model is `DEFAULT_MODEL`, which a site pulls itself
  (`ollama pull qwen2.5:7b-instruct`).

Requests: temperature 0 and a fixed seed, thinking disabled on models that can think, `num_ctx` set, the
answer schema (`prompts/schema.json`) passed as the structured-output `format`.

Chunks of about `CHUNK_CHARS` overlapping by `OVERLAP_CHARS`, cut at whitespace, run concurrently. A
returned text must occur in its chunk as whole words (case-sensitive, else normalized: case, Unicode width,
quotes, whitespace); it is then located wherever it occurs in the note. Text the model invented or
reworded is dropped and counted. Safe Harbor's exceptions are dropped whatever type the model gave.

Fail closed: an answer cut at the output limit or not valid for the schema is asked again as two halves;
a second failure, a timeout, a connection or HTTP error raise DetectorError. Messages never quote the note.
"""
from __future__ import annotations

import contextvars
import dataclasses
import json
import os
import re
import threading
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TypeVar

from text_deid import budget, prompts
from text_deid.safe_harbor import keeps_whatever_category
from text_deid.spans import CATEGORIES, DetectorError, KnownIdentifier, Span

DETECTOR = "llm"
VERSION = "1"
DEFAULT_MODEL = "qwen2.5:7b-instruct"
CHUNK_CHARS, OVERLAP_CHARS = 2000, 200
NUM_PREDICT = 2048  # output tokens per chunk: room for about a hundred items
PROBE_TIMEOUT_S = 10.0
CHARS_PER_TOKEN = 3  # a pessimistic estimate for English clinical text and JSON
T = TypeVar("T")
R = TypeVar("R")


class LlmUnavailable(RuntimeError):
    """The LLM cannot be used here (no client, no endpoint, model not pulled): the stack is unavailable."""


class UnusableAnswer(Exception):
    """The model's answer was cut at the output limit or does not fit the schema."""


@dataclass(frozen=True)
class LlmSettings:
    """Where the LLM stacks find their model, and how long and how many requests they may run."""

    url: str | None = None
    model: str | None = None
    timeout_s: float = 120.0
    concurrency: int = 4
    num_ctx: int = 8192

    def resolved(self) -> LlmSettings:
        """These settings with the default model where none is named; LlmUnavailable for a limit below 1."""
        for name in ("timeout_s", "concurrency", "num_ctx"):
            if not getattr(self, name) > 0:
                raise LlmUnavailable(f"llm: {name} must be positive")
        return dataclasses.replace(self, model=self.model or DEFAULT_MODEL)


class OllamaEndpoint:
    """One Ollama server and model: JSON answers for a schema, a bounded pool of requests in flight."""

    def __init__(self, settings: LlmSettings, component: str = DETECTOR):
        try:
            import httpx
            import ollama
        except ImportError:
            raise LlmUnavailable(f"{component}: the ollama client is not installed "
                                 "(pip install 'deid-adapter[llm]')") from None
        settings = settings.resolved()
        if not settings.url:
            raise LlmUnavailable(f"{component}: no LLM endpoint configured: set --llm-url or DEID_ADAPTER_LLM_URL "
                                 "(Ollama listens on http://127.0.0.1:11434 by default)")
        self.component, self.url, self.model = component, settings.url, settings.model
        self.timeout_s, self.concurrency, self.num_ctx = settings.timeout_s, settings.concurrency, settings.num_ctx
        self._ollama, self._httpx = ollama, httpx
        self._client = ollama.Client(host=self.url, timeout=self.timeout_s)
        self.thinks = self._probe()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._pool_lock = threading.Lock()

    def _probe(self) -> bool:
        """Check that the server answers and holds the model; True when the model can think (so we turn it off)."""
        probe = self._ollama.Client(host=self.url, timeout=PROBE_TIMEOUT_S)
        try:
            names = {m.model for m in probe.list().models}
            if self.model not in names and f"{self.model}:latest" not in names:
                raise LlmUnavailable(f"{self.component}: model {self.model!r} is not pulled at {self.url} "
                                     f"(run: ollama pull {self.model}, or set --llm-model)")
            capabilities = probe.show(self.model).capabilities or []
        except LlmUnavailable:
            raise
        except Exception as e:  # connection refused, HTTP error, garbage: the endpoint is not usable
            raise LlmUnavailable(f"{self.component}: no usable Ollama server at {self.url} ({type(e).__name__})") from None
        return "thinking" in capabilities

    def check_fits(self, messages: list[dict], num_predict: int) -> None:
        """Refuse a configuration where the prompt might not fit `num_ctx` (Ollama would cut it silently)."""
        tokens = sum(len(m["content"]) for m in messages) // CHARS_PER_TOKEN + 8 * len(messages) + num_predict
        if tokens > self.num_ctx:
            raise LlmUnavailable(f"{self.component}: num_ctx {self.num_ctx} is too small for the prompt "
                                 f"(up to about {tokens} tokens): raise DEID_ADAPTER_LLM_NUM_CTX")

    def ask(self, messages: list[dict], schema: dict, num_predict: int):
        """The answer parsed from JSON; UnusableAnswer when cut or not JSON, DetectorError when the request fails."""
        options = {"temperature": 0, "seed": 0, "num_ctx": self.num_ctx, "num_predict": num_predict}
        extra = {"think": False} if self.thinks else {}
        name = self.component
        try:
            response = self._client.chat(model=self.model, messages=messages, format=schema, options=options, **extra)
        except self._httpx.TimeoutException:
            raise DetectorError(f"{name}: no answer from the model server within {self.timeout_s:g} s") from None
        except self._ollama.ResponseError as e:  # its message is the server's text: not repeated
            raise DetectorError(f"{name}: the model server answered HTTP {e.status_code}") from None
        except (ConnectionError, self._httpx.HTTPError) as e:
            raise DetectorError(f"{name}: connection to the model server failed ({type(e).__name__})") from None
        except Exception as e:
            raise DetectorError(f"{name}: unreadable response from the model server ({type(e).__name__})") from None
        if response.done_reason == "length" or (response.prompt_eval_count or 0) + (response.eval_count or 0) >= self.num_ctx:
            raise UnusableAnswer("cut at the output limit")
        try:
            return json.loads(response.message.content or "")
        except json.JSONDecodeError:
            raise UnusableAnswer("not JSON") from None

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """fn over items on the bounded pool, in order; the first error cancels what has not started."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        # each request runs in a copy of the caller's context: under the record's deadline (budget)
        futures = [self._executor().submit(contextvars.copy_context().run, fn, x) for x in items]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:  # one pool per process: threads do not survive a fork
            if self._pool is None or self._pool_pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=self.component)
                self._pool_pid = os.getpid()
            return self._pool


def chunk_bounds(text: str, size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> list[tuple[int, int]]:
    """[start, end) windows of at most `size` characters covering `text`, overlapping by up to `overlap`,
    cut at whitespace where there is any in reach (a word shorter than the overlap lies whole in some window)."""
    n = len(text)
    bounds: list[tuple[int, int]] = []
    start = 0
    while True:
        end = min(start + size, n)
        if end < n:
            cut = _last_space(text, start + size // 2, end)
            end = cut if cut > start else end
        bounds.append((start, end))
        if end >= n:
            return bounds
        nxt = max(end - overlap, start + 1)
        space = next((i for i in range(nxt, end) if text[i].isspace()), None)
        start = space + 1 if space is not None and space + 1 < end else nxt


def halves(text: str, start: int, end: int, overlap: int = OVERLAP_CHARS) -> list[tuple[int, int]]:
    """Two halves of [start, end) overlapping around the middle, cut at whitespace: asked after an unusable answer."""
    middle = (start + end) // 2
    overlap = min(overlap, (end - start) // 4)
    left_end = _first_space(text, min(middle + overlap // 2, end), end)
    space = _last_space(text, start, max(middle - overlap // 2, start))
    right_start = space + 1 if space >= 0 else max(middle - overlap // 2, start)
    return [(start, left_end), (right_start, end)]


def _last_space(text: str, lo: int, hi: int) -> int:
    """Index of the last whitespace in text[lo:hi], or -1."""
    for i in range(hi - 1, lo - 1, -1):
        if text[i].isspace():
            return i
    return -1


def _first_space(text: str, lo: int, hi: int) -> int:
    """Index of the first whitespace in text[lo:hi], or hi."""
    for i in range(lo, hi):
        if text[i].isspace():
            return i
    return hi


_QUOTES = str.maketrans({"‘": "'", "’": "'", "‚": "'", "“": '"', "”": '"', "„": '"', "–": "-", "—": "-", "‐": "-"})
_EDGE_NOISE = "\"'“”‘’,;:"


def normalize(s: str) -> tuple[str, list[int]]:
    """`s` folded for matching (case, Unicode compatibility forms, quotes and dashes, whitespace runs as one
    space), with the index in `s` of the character each folded character comes from."""
    out: list[str] = []
    index: list[int] = []
    for i, ch in enumerate(s):
        if ch.isspace():
            if out and out[-1] == " ":
                continue
            folded = " "
        else:
            folded = unicodedata.normalize("NFKC", ch).translate(_QUOTES).casefold()
        out.extend(folded)
        index.extend([i] * len(folded))
    return "".join(out), index


def clean(needle: str) -> str:
    """A returned text without the whitespace, quotes and separators models put around values."""
    previous = None
    while previous != needle:
        previous, needle = needle, needle.strip().strip(_EDGE_NOISE)
    return needle


def _whole_word(text: str, s: int, e: int) -> bool:
    before_ok = s == 0 or not (text[s - 1].isalnum() and text[s].isalnum())
    after_ok = e == len(text) or not (text[e].isalnum() and text[e - 1].isalnum())
    return before_ok and after_ok


def locate(text: str, needle: str, start: int = 0, end: int | None = None) -> tuple[list[tuple[int, int]], bool]:
    """Where `needle` occurs in text[start:end] as whole words: case-sensitive matches if there are any
    (exact=True), else matches after `normalize` (exact=False). Offsets index `text`."""
    end = len(text) if end is None else end
    needle = clean(needle)
    if not needle:
        return [], True
    hits = []
    i = text.find(needle, start, end)
    while i != -1:
        if _whole_word(text, i, i + len(needle)):
            hits.append((i, i + len(needle)))
        i = text.find(needle, i + 1, end)
    if hits:
        return hits, True
    folded, index = normalize(text[start:end])
    target = normalize(needle)[0].strip()
    if not target:
        return [], False
    i = folded.find(target)
    while i != -1:
        j = i + len(target)
        aligned = (i == 0 or index[i - 1] != index[i]) and (j == len(folded) or index[j] != index[j - 1])
        s, e = start + index[i], start + index[j - 1] + 1
        if aligned and _whole_word(text, s, e):
            hits.append((s, e))
        i = folded.find(target, i + 1)
    return hits, False


def parse_items(answer) -> list[tuple[str, str]]:
    """(text, type) pairs from an answer; UnusableAnswer unless it is exactly `{"items": [{"text", "type"}]}`."""
    if not isinstance(answer, dict) or set(answer) != {"items"} or not isinstance(answer["items"], list):
        raise UnusableAnswer("not the answer schema")
    items = []
    for item in answer["items"]:
        if (not isinstance(item, dict) or set(item) != {"text", "type"} or not isinstance(item["text"], str)
                or not item["text"].strip() or item["type"] not in CATEGORIES):
            raise UnusableAnswer("not the answer schema")
        items.append((item["text"], item["type"]))
    return items


def _words(s: str) -> set[str]:
    return set(re.findall(r"\w+", s.casefold()))


class LlmDetector:
    """The `llm` layer: PHI as the model reports it, kept only where its text is really in the note."""

    name = DETECTOR
    version = VERSION

    def __init__(self, settings: LlmSettings | None = None, *, chunk_chars: int = CHUNK_CHARS,
                 overlap_chars: int = OVERLAP_CHARS, prompt_set: prompts.PromptSet | None = None,
                 endpoint: OllamaEndpoint | None = None):
        try:
            self.prompts = prompt_set or prompts.load()
        except ValueError as e:
            raise LlmUnavailable(f"llm: {e}") from None
        self.endpoint = endpoint or OllamaEndpoint(settings or LlmSettings())
        self.model = self.endpoint.model
        self.prompt_version = self.prompts.label
        self.chunk_chars, self.overlap_chars = chunk_chars, overlap_chars
        self.endpoint.check_fits(self.prompts.detector_messages("x" * chunk_chars), NUM_PREDICT)
        self.counts: Counter[str] = Counter()  # chunks, split_retries, items, invented, reworded, safe_harbor
        self._counts_lock = threading.Lock()

    def _count(self, key: str, n: int = 1) -> None:
        with self._counts_lock:
            self.counts[key] += n

    def detect(self, text: str, known: Sequence[KnownIdentifier] = ()) -> list[Span]:
        answers = self.endpoint.map(lambda b: self._answers(text, *b), chunk_bounds(text, self.chunk_chars, self.overlap_chars))
        spans: set[Span] = set()
        for chunk_start, chunk_end, items in (a for per_chunk in answers for a in per_chunk):
            for needle, category in items:
                spans.update(self._spans(text, needle, category, chunk_start, chunk_end))
        return sorted(spans)

    def _answers(self, text: str, start: int, end: int, retry: bool = False) -> list[tuple[int, int, list[tuple[str, str]]]]:
        """The items the model reports for text[start:end]; an unusable answer is asked again once, as two halves."""
        budget.check("llm")  # past the record's deadline, no more requests
        self._count("chunks")
        try:
            answer = self.endpoint.ask(self.prompts.detector_messages(text[start:end]), self.prompts.schema, NUM_PREDICT)
            return [(start, end, parse_items(answer))]
        except UnusableAnswer as e:
            if retry or end - start < 2:
                raise DetectorError(f"llm: answer {e} again after splitting the chunk") from None
            self._count("split_retries")
            return [a for s, e_ in halves(text, start, end, self.overlap_chars) for a in self._answers(text, s, e_, True)]

    def _spans(self, text: str, needle: str, category: str, chunk_start: int, chunk_end: int) -> Iterable[Span]:
        self._count("items")
        in_chunk, _ = locate(text, needle, chunk_start, chunk_end)
        if not in_chunk:  # reworded: its words are all there; invented: they are not
            self._count("reworded" if _words(needle) <= _words(text[chunk_start:chunk_end]) else "invented")
            return []
        found = [Span(s, e, category, DETECTOR) for s, e in locate(text, needle)[0]
                 if not keeps_whatever_category(text[s:e], category)]
        if not found:
            self._count("safe_harbor")
        return found
