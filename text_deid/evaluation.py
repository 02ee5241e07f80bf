"""Span-level evaluation of PHI detection against gold annotations (`deid-adapter eval`).

`evaluate(gold, predicted)` is a pure function.  Gold records are ASQ-PHI style
`{"id", "text", "spans": [{"start", "end", "category"}], ...}`; a record whose `spans` is empty is a
*hard negative* (a text with no PHI).  `predicted[id]` is the list of span dicts found for that
document (`{"start", "end", "category", ...}`); a document missing from `predicted` has no
predictions.  Offsets are Python `str` indices, end exclusive, and must satisfy
`0 <= start < end <= len(text)`; anything else raises ValueError.

Metrics (all micro-averaged over the whole set):

- `span_recall`: gold spans overlapped (any overlap, category ignored) by a predicted span / gold spans.
- `span_precision`: predicted spans overlapping at least one gold span / predicted spans.
- `char_recall`: gold characters covered by predictions / gold characters.
- `other_text_removed`: non-gold characters covered by predictions / non-gold characters.
- `hard_negative_over_redaction`: hard negatives with at least one prediction / hard negatives.
- `strict_precision`, `strict_recall`, `strict_f1`: a prediction is a true positive only when
  start, end and category all equal a gold span's (one-to-one: duplicates match once).
- `per_category[CAT]["recall"]`: `span_recall` restricted to gold spans of category CAT.
- `per_form[CAT][FORM]["recall"]`: the same restricted to the gold NAME and GEOGRAPHIC_LOCATION spans
  of a form (`FORMS`), read from the gold text: `single-token` (one part), `multi-part` (parts joined by
  spaces, hyphens or apostrophes), `lowercase` (letters, none upper case), `all-caps` (two or more
  letters, none lower case) and `non-ascii` (a letter outside ASCII). A span can have several forms.

Characters are counted on the union of spans, so overlapping predictions (or overlapping gold
spans) never count a character twice.

Zero denominators, by convention: recall-like metrics (`span_recall`, `char_recall`,
`strict_recall`) are 1.0 when there is nothing to find; precision-like metrics (`span_precision`,
`strict_precision`) are 1.0 when nothing was predicted; `strict_f1` is 1.0 when there are neither
gold nor predicted spans; over-redaction metrics (`other_text_removed`,
`hard_negative_over_redaction`) are 0.0 when there is nothing that could be over-redacted.

Each metric comes as `{"value": v, "ci95": [lo, hi]}`.  The interval is a percentile bootstrap over
documents: documents are resampled with replacement `resamples` times with `random.Random(seed)`,
the micro metric is recomputed on each resample, and the 2.5th and 97.5th percentiles (linear
interpolation between order statistics) are reported.  Resamples in which a metric's denominator is
zero (for instance a resample that happens to contain no hard negatives) are left out of that
metric's interval rather than filled in with the convention value; when the whole set has a zero
denominator the interval is `[value, value]`.  With `resamples=0` every `ci95` is None.

`cluster=FIELD` resamples groups instead of documents: the records sharing a value of FIELD (the
general PII set's `template`) are drawn together, since lines written from one template are not
independent and a bootstrap over lines would give too narrow an interval. Every record must then
have FIELD (a string or a number).
"""
from __future__ import annotations

import bisect
import json
import math
import os
import random
import re
from typing import Any, Iterable, Mapping, Sequence

from .spans import CATEGORIES

__all__ = ["evaluate", "compare", "format_table", "format_comparison", "load_jsonl", "METRICS", "FORMS"]

# Columns of the per-document count rows.
_GOLD, _GOLD_HIT, _PRED, _PRED_HIT = 0, 1, 2, 3
_GOLD_CHARS, _GOLD_CHARS_COV, _OTHER_CHARS, _OTHER_CHARS_COV = 4, 5, 6, 7
_HARD_NEG, _HARD_NEG_FLAGGED, _STRICT_TP, _DOCS = 8, 9, 10, 11
_N_BASE = 12

# name -> (numerator column, denominator column, value when the denominator is zero)
_RATIO_METRICS: dict[str, tuple[int, int, float]] = {
    "span_recall": (_GOLD_HIT, _GOLD, 1.0),
    "span_precision": (_PRED_HIT, _PRED, 1.0),
    "char_recall": (_GOLD_CHARS_COV, _GOLD_CHARS, 1.0),
    "other_text_removed": (_OTHER_CHARS_COV, _OTHER_CHARS, 0.0),
    "hard_negative_over_redaction": (_HARD_NEG_FLAGGED, _HARD_NEG, 0.0),
    "strict_precision": (_STRICT_TP, _PRED, 1.0),
    "strict_recall": (_STRICT_TP, _GOLD, 1.0),
}

#: Metric names, in the order `format_table` shows them.
METRICS = (
    "span_recall",
    "span_precision",
    "char_recall",
    "other_text_removed",
    "hard_negative_over_redaction",
    "strict_precision",
    "strict_recall",
    "strict_f1",
)


#: Forms a gold span of these categories is also counted under (`per_form`), in report order.
FORMS = ("single-token", "multi-part", "lowercase", "all-caps", "non-ascii")
_FORM_CATEGORIES = ("NAME", "GEOGRAPHIC_LOCATION")
_PART_SEPARATOR = re.compile(r"[\s\-\u2010\u2011'\u2019]+")


def span_forms(value: str) -> list[str]:
    """The forms (`FORMS`) of one gold value, e.g. `["multi-part", "non-ascii"]` for "Nguyễn Văn An"."""
    parts = [p for p in _PART_SEPARATOR.split(value.strip()) if p]
    letters = [c for c in value if c.isalpha()]
    forms = ["single-token" if len(parts) <= 1 else "multi-part"]
    if letters and not any(c.isupper() for c in letters):
        forms.append("lowercase")
    if len(letters) > 1 and not any(c.islower() for c in letters):
        forms.append("all-caps")
    if any(ord(c) > 127 for c in letters):
        forms.append("non-ascii")
    return forms


def _form_key(category: str, form: str) -> str:
    return f"{category}/{form}"


# --------------------------------------------------------------------------- validation


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _spans_of(doc_id: str, text_len: int, spans: Any, kind: str) -> list[tuple[int, int, str]]:
    if not isinstance(spans, (list, tuple)):
        raise ValueError(f"document {doc_id!r}: {kind} spans must be a list")
    out = []
    for k, sp in enumerate(spans):
        if not isinstance(sp, Mapping):
            raise ValueError(f"document {doc_id!r}: {kind} span #{k} is not an object")
        start, end, cat = sp.get("start"), sp.get("end"), sp.get("category")
        if not (_is_int(start) and _is_int(end)):
            raise ValueError(f"document {doc_id!r}: {kind} span #{k} needs integer start and end")
        if not isinstance(cat, str) or not cat:
            raise ValueError(f"document {doc_id!r}: {kind} span #{k} needs a category string")
        if not 0 <= start < end <= text_len:
            raise ValueError(
                f"document {doc_id!r}: {kind} span #{k} [{start}, {end}) is out of range "
                f"for a text of length {text_len} (need 0 <= start < end <= length)"
            )
        out.append((start, end, cat))
    return out


# --------------------------------------------------------------------------- interval helpers


def _merge(spans: Iterable[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """Union of half-open intervals, sorted and disjoint (touching intervals are joined)."""
    merged: list[list[int]] = []
    for s, e in sorted((s, e) for s, e, _ in spans):
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1][1] = e
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _overlaps(start: int, end: int, merged: list[tuple[int, int]], starts: list[int]) -> bool:
    """Does [start, end) share at least one character with the disjoint sorted intervals?"""
    # Last interval starting before `end`; the intervals are disjoint, so only it can reach `start`.
    i = bisect.bisect_left(starts, end) - 1
    return i >= 0 and merged[i][1] > start


def _length(merged: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in merged)


def _intersection_length(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


# --------------------------------------------------------------------------- per-document counts


def _doc_row(
    text: str,
    gold: list[tuple[int, int, str]],
    pred: list[tuple[int, int, str]],
    cat_index: Mapping[str, int],
) -> list[int]:
    gold_u = _merge(gold)
    pred_u = _merge(pred)
    gold_starts = [s for s, _ in gold_u]
    pred_starts = [s for s, _ in pred_u]

    text_len = len(text)
    row = [0] * (_N_BASE + 2 * len(cat_index))
    row[_DOCS] = 1
    row[_GOLD] = len(gold)
    row[_PRED] = len(pred)
    for s, e, cat in gold:
        hit = _overlaps(s, e, pred_u, pred_starts)
        row[_GOLD_HIT] += hit
        keys = [cat]
        if cat in _FORM_CATEGORIES:
            keys += [_form_key(cat, f) for f in span_forms(text[s:e])]
        for key in keys:
            c = _N_BASE + 2 * cat_index[key]
            row[c] += 1
            row[c + 1] += hit
    row[_PRED_HIT] = sum(1 for s, e, _ in pred if _overlaps(s, e, gold_u, gold_starts))

    gold_chars = _length(gold_u)
    covered = _intersection_length(gold_u, pred_u)
    row[_GOLD_CHARS] = gold_chars
    row[_GOLD_CHARS_COV] = covered
    row[_OTHER_CHARS] = text_len - gold_chars
    row[_OTHER_CHARS_COV] = _length(pred_u) - covered
    if not gold:
        row[_HARD_NEG] = 1
        row[_HARD_NEG_FLAGGED] = 1 if pred else 0

    # Strict matches, one-to-one: size of the multiset intersection of (start, end, category).
    remaining: dict[tuple[int, int, str], int] = {}
    for g in gold:
        remaining[g] = remaining.get(g, 0) + 1
    for p in pred:
        if remaining.get(p, 0) > 0:
            remaining[p] -= 1
            row[_STRICT_TP] += 1
    return row


# --------------------------------------------------------------------------- metric arithmetic


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def _metric_values(t: Sequence[int], n_cats: int) -> list[float | None]:
    """All metrics from summed columns; None where the denominator is zero."""
    vals: list[float | None] = [_ratio(t[num], t[den]) for num, den, _ in _RATIO_METRICS.values()]
    f1_den = t[_GOLD] + t[_PRED]
    vals.append(2 * t[_STRICT_TP] / f1_den if f1_den else None)
    for k in range(n_cats):
        c = _N_BASE + 2 * k
        vals.append(_ratio(t[c + 1], t[c]))
    return vals


def _percentile(sorted_vals: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default method)."""
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    frac = pos - lo
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * frac


# --------------------------------------------------------------------------- public API


def evaluate(
    gold: Sequence[Mapping[str, Any]],
    predicted: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    resamples: int = 1000,
    seed: int = 0,
    cluster: str | None = None,
) -> dict:
    """Score `predicted` spans against `gold` records; see the module docstring for definitions.

    Returns a JSON-serialisable dict: one `{"value", "ci95"}` entry per name in `METRICS`,
    `per_category` (gold categories only: `{"gold", "missed", "recall": {"value", "ci95"}}`),
    `per_form` (`{CAT: {FORM: {"gold", "missed", "recall"}}}`, forms that occur only),
    `counts` and `bootstrap` (resamples, seed, method, cluster and how many clusters).
    `cluster`: resample the groups of records sharing that field's value instead of records.
    Raises ValueError on malformed input: no documents, a record without a string `id`/`text` or a
    `spans` list, duplicate ids, predictions for an id not in `gold`, or a span whose offsets are
    not integers with `0 <= start < end <= len(text)`.  Messages never quote document text.
    """
    if not _is_int(resamples) or resamples < 0:
        raise ValueError("resamples must be a non-negative integer")
    rows, cats = _count_rows(gold, predicted)
    return _summarize(_clustered(rows, gold, cluster), cats, resamples, seed, cluster)


def _clustered(rows: list[tuple[int, ...]], gold: Sequence[Mapping[str, Any]],
               cluster: str | None) -> list[tuple[int, ...]]:
    """The rows to resample: one per document, or the summed rows of each value of `cluster`."""
    if cluster is None:
        return rows
    groups: dict[str, list[int]] = {}
    for n, (row, rec) in enumerate(zip(rows, gold)):
        value = rec.get(cluster)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"gold record #{n + 1} has no string or number {cluster!r} to cluster on")
        key = str(value)
        if key in groups:
            groups[key] = [a + b for a, b in zip(groups[key], row)]
        else:
            groups[key] = list(row)
    return [tuple(g) for g in groups.values()]


def _count_rows(
    gold: Sequence[Mapping[str, Any]], predicted: Mapping[str, Sequence[Mapping[str, Any]]]
) -> tuple[list[tuple[int, ...]], list[str]]:
    """Validate the input; one row of integer counts per document, and the gold categories."""
    if not isinstance(predicted, Mapping):
        raise ValueError("predicted must map document id to a list of spans")
    if not gold:
        raise ValueError("no gold documents to evaluate")
    docs: list[tuple[int, list, list]] = []
    seen: set[str] = set()
    for n, rec in enumerate(gold):
        if not isinstance(rec, Mapping):
            raise ValueError(f"gold record #{n} is not an object")
        doc_id, text = rec.get("id"), rec.get("text")
        if not isinstance(doc_id, str):
            raise ValueError(f"gold record #{n} has no string 'id'")
        if not isinstance(text, str):
            raise ValueError(f"document {doc_id!r}: 'text' must be a string")
        if doc_id in seen:
            raise ValueError(f"duplicate document id {doc_id!r} in gold")
        seen.add(doc_id)
        if "spans" not in rec:
            raise ValueError(f"document {doc_id!r}: gold record has no 'spans' list")
        g = _spans_of(doc_id, len(text), rec["spans"], "gold")
        p = _spans_of(doc_id, len(text), predicted.get(doc_id, []), "predicted")
        docs.append((text, g, p))
    unknown = sorted(k for k in predicted if k not in seen)
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ValueError(f"predictions for document ids not in gold: {shown}{more}")

    gold_cats = {cat for _, g, _ in docs for _, _, cat in g}
    cats = [c for c in CATEGORIES if c in gold_cats] + sorted(gold_cats - set(CATEGORIES))
    found_forms = {_form_key(cat, f) for text, g, _ in docs for s, e, cat in g
                   if cat in _FORM_CATEGORIES for f in span_forms(text[s:e])}
    cats += [_form_key(c, f) for c in _FORM_CATEGORIES for f in FORMS if _form_key(c, f) in found_forms]
    cat_index = {c: k for k, c in enumerate(cats)}

    return [tuple(_doc_row(text, g, p, cat_index)) for text, g, p in docs], cats


def _summarize(rows: list[tuple[int, ...]], cats: list[str], resamples: int, seed: int,
               cluster: str | None) -> dict:
    totals = [sum(col) for col in zip(*rows)]
    names = list(METRICS) + [f"category:{c}" for c in cats]
    empty_values = [v for _, _, v in _RATIO_METRICS.values()] + [1.0] + [1.0] * len(cats)
    point = [
        v if v is not None else e for v, e in zip(_metric_values(totals, len(cats)), empty_values)
    ]

    # Bootstrap: each resample only sums the precomputed integer rows.
    samples: list[list[float]] = [[] for _ in names]
    if resamples:
        rng = random.Random(seed)
        n_docs = len(rows)
        population = range(n_docs)
        n_cats = len(cats)
        for _ in range(resamples):
            picked = [rows[i] for i in rng.choices(population, k=n_docs)]
            t = list(map(sum, zip(*picked)))
            for k, v in enumerate(_metric_values(t, n_cats)):
                if v is not None:
                    samples[k].append(v)

    def entry(k: int) -> dict:
        value = point[k]
        if not resamples:
            ci = None
        elif not samples[k]:
            ci = [value, value]
        else:
            s = sorted(samples[k])
            ci = [_percentile(s, 0.025), _percentile(s, 0.975)]
        return {"value": value, "ci95": ci}

    result: dict[str, Any] = {name: entry(k) for k, name in enumerate(METRICS)}
    per_category: dict[str, dict] = {}
    per_form: dict[str, dict[str, dict]] = {}
    for k, c in enumerate(cats):
        col = _N_BASE + 2 * k
        info = {"gold": totals[col], "missed": totals[col] - totals[col + 1], "recall": entry(len(METRICS) + k)}
        category, _, form = c.partition("/")
        if form:
            per_form.setdefault(category, {})[form] = info
        else:
            per_category[c] = info
    result["per_category"] = per_category
    result["per_form"] = per_form
    result["counts"] = {
        "documents": totals[_DOCS],
        "hard_negatives": totals[_HARD_NEG],
        "hard_negatives_with_predictions": totals[_HARD_NEG_FLAGGED],
        "gold_spans": totals[_GOLD],
        "predicted_spans": totals[_PRED],
        "missed_gold_spans": totals[_GOLD] - totals[_GOLD_HIT],
        "predicted_spans_overlapping_gold": totals[_PRED_HIT],
        "strict_matches": totals[_STRICT_TP],
        "gold_characters": totals[_GOLD_CHARS],
        "gold_characters_covered": totals[_GOLD_CHARS_COV],
        "other_characters": totals[_OTHER_CHARS],
        "other_characters_removed": totals[_OTHER_CHARS_COV],
    }
    result["bootstrap"] = {
        "resamples": resamples,
        "seed": seed,
        "method": _method("percentile bootstrap", cluster),
        "cluster": cluster,
        "units": len(rows),
    }
    return result


def _units(boot: Mapping[str, Any]) -> str:
    method = str(boot.get("method", "")).removesuffix(", 95%")
    return f"{method} ({boot['units']})" if boot.get("cluster") else method


def _method(kind: str, cluster: str | None) -> str:
    unit = f"clusters of records sharing {cluster!r}" if cluster else "documents"
    return f"{kind} over {unit}, 95%"


_LABELS = {
    "span_recall": "Span recall (any overlap)",
    "span_precision": "Span precision (any overlap)",
    "char_recall": "Character recall",
    "other_text_removed": "Other text removed",
    "hard_negative_over_redaction": "Hard-negative over-redaction",
    "strict_precision": "Strict precision",
    "strict_recall": "Strict recall",
    "strict_f1": "Strict F1",
}


def _fmt_entry(e: Mapping[str, Any]) -> tuple[str, str]:
    value = f"{e['value']:.4f}"
    ci = e.get("ci95")
    return value, (f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "-")


def format_table(result: Mapping[str, Any]) -> str:
    """Render an `evaluate` result as a fixed-width table for the terminal."""
    lines: list[tuple[str, str, str]] = [("Metric", "Value", "95% CI")]
    for name in METRICS:
        if name in result:
            lines.append((_LABELS.get(name, name), *_fmt_entry(result[name])))
    per_cat = result.get("per_category") or {}
    cat_lines = [
        (f"  {cat} (n={info['gold']})", *_fmt_entry(info["recall"])) for cat, info in per_cat.items()
    ]
    form_lines = [
        (f"  {cat} {form} (n={info['gold']})", *_fmt_entry(info["recall"]))
        for cat, forms in (result.get("per_form") or {}).items() for form, info in forms.items()
    ]
    w0 = max(len(r[0]) for r in lines + cat_lines + form_lines)
    w1 = max(len(r[1]) for r in lines + cat_lines + form_lines)
    w2 = max(len(r[2]) for r in lines + cat_lines + form_lines)

    def fmt(r: tuple[str, str, str]) -> str:
        return f"{r[0]:<{w0}}  {r[1]:>{w1}}  {r[2]:<{w2}}".rstrip()

    rule = "-" * (w0 + w1 + w2 + 4)
    out = [fmt(lines[0]), rule] + [fmt(r) for r in lines[1:]]
    if cat_lines:
        out += ["", fmt(("Recall by category", "", "")), rule] + [fmt(r) for r in cat_lines]
    if form_lines:
        out += ["", fmt(("Recall by form", "", "")), rule] + [fmt(r) for r in form_lines]
    counts = result.get("counts") or {}
    if counts:
        out += ["", "Counts", rule]
        wc = max(len(k) for k in counts)
        out += [f"{k.replace('_', ' '):<{wc}}  {v}" for k, v in counts.items()]
    boot = result.get("bootstrap") or {}
    if boot:
        out += ["", f"95% CI: {_units(boot)}, {boot.get('resamples')} resamples, seed {boot.get('seed')}"]
    return "\n".join(out) + "\n"


# JSON numbers as JSON has them: NaN, Infinity and a number that overflows to infinity (1e400) are refused.
# `json.loads(text, **STRICT_NUMBERS)` raises NotFinite; every input edge (adapter/json_input.py) reads with it too.
class NotFinite(ValueError):
    """NaN or Infinity where JSON allows only finite numbers."""


def _refuse_constant(_name: str):
    raise NotFinite


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400 and the like: json reads them as inf
        raise NotFinite
    return value


STRICT_NUMBERS = {"parse_constant": _refuse_constant, "parse_float": _finite_float}


def load_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL file of objects; blank lines are skipped.

    Raises ValueError naming the file and line number (never the line's content) on invalid UTF-8,
    invalid JSON or a line that is not a JSON object.
    """
    records: list[dict] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{os.fspath(path)}: line {lineno}: not valid UTF-8") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line, **STRICT_NUMBERS)
            except NotFinite:
                raise ValueError(f"{os.fspath(path)}: line {lineno}: invalid JSON (NaN or Infinity)") from None
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{os.fspath(path)}: line {lineno}: invalid JSON "
                    f"({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(obj, dict):
                raise ValueError(f"{os.fspath(path)}: line {lineno}: expected a JSON object")
            records.append(obj)
    return records


def _point(t: Sequence[int], n_cats: int) -> list[float]:
    empty = [v for _, _, v in _RATIO_METRICS.values()] + [1.0] + [1.0] * n_cats
    return [v if v is not None else e for v, e in zip(_metric_values(t, n_cats), empty)]


def compare(
    gold: Sequence[Mapping[str, Any]],
    predicted: Mapping[str, Sequence[Mapping[str, Any]]],
    other: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    resamples: int = 1000,
    seed: int = 0,
    cluster: str | None = None,
) -> dict:
    """Paired comparison of two span sets on the same documents: `predicted` minus `other`.

    Each bootstrap resample picks the same documents for both, so the 95% interval is that of the
    difference, not two separate intervals. Returns `{"difference": {metric: {"value", "ci95"}},
    "per_category": {cat: {"value", "ci95"}}, "per_form": {cat: {form: {"value", "ci95"}}}, "bootstrap"}`
    (recall differences; `cluster` as in `evaluate`); resamples where either side's metric
    has a zero denominator are left out of that metric's interval. Counts and rates only.
    """
    if not _is_int(resamples) or resamples < 0:
        raise ValueError("resamples must be a non-negative integer")
    rows_a, cats = _count_rows(gold, predicted)
    rows_b, _ = _count_rows(gold, other)
    rows_a, rows_b = _clustered(rows_a, gold, cluster), _clustered(rows_b, gold, cluster)
    n_cats = len(cats)
    point = [a - b for a, b in zip(_point([sum(c) for c in zip(*rows_a)], n_cats),
                                   _point([sum(c) for c in zip(*rows_b)], n_cats))]
    samples: list[list[float]] = [[] for _ in point]
    if resamples:
        rng = random.Random(seed)
        population = range(len(rows_a))
        for _ in range(resamples):
            picked = rng.choices(population, k=len(rows_a))
            va = _metric_values(list(map(sum, zip(*(rows_a[i] for i in picked)))), n_cats)
            vb = _metric_values(list(map(sum, zip(*(rows_b[i] for i in picked)))), n_cats)
            for k, (x, y) in enumerate(zip(va, vb)):
                if x is not None and y is not None:
                    samples[k].append(x - y)

    def entry(k: int) -> dict:
        if not resamples:
            return {"value": point[k], "ci95": None}
        s = sorted(samples[k]) or [point[k]]
        return {"value": point[k], "ci95": [_percentile(s, 0.025), _percentile(s, 0.975)]}

    per_category: dict[str, dict] = {}
    per_form: dict[str, dict[str, dict]] = {}
    for k, c in enumerate(cats):
        category, _, form = c.partition("/")
        if form:
            per_form.setdefault(category, {})[form] = entry(len(METRICS) + k)
        else:
            per_category[c] = entry(len(METRICS) + k)
    return {
        "difference": {name: entry(k) for k, name in enumerate(METRICS)},
        "per_category": per_category,
        "per_form": per_form,
        "bootstrap": {"resamples": resamples, "seed": seed, "cluster": cluster, "units": len(rows_a),
                      "method": _method("paired percentile bootstrap", cluster)},
    }


def format_comparison(result: Mapping[str, Any], name: str, other: str) -> str:
    """Render a `compare` result: each metric's difference (NAME minus OTHER) with its 95% CI."""
    rows = [(f"Metric ({name} - {other})", "Diff", "95% CI")]
    rows += [(_LABELS.get(m, m), *_fmt_signed(e)) for m, e in result["difference"].items()]
    rows += [(f"  recall {c}", *_fmt_signed(e)) for c, e in result["per_category"].items()]
    rows += [(f"  recall {c} {form}", *_fmt_signed(e))
             for c, forms in result.get("per_form", {}).items() for form, e in forms.items()]
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    out = [f"{r[0]:<{w0}}  {r[1]:>{w1}}  {r[2]}".rstrip() for r in rows]
    out.insert(1, "-" * (w0 + w1 + 24))
    boot = result["bootstrap"]
    out.append(f"\n95% CI: {_units(boot)}, {boot['resamples']} resamples, seed {boot['seed']}")
    return "\n".join(out) + "\n"


def _fmt_signed(e: Mapping[str, Any]) -> tuple[str, str]:
    ci = e.get("ci95")
    return f"{e['value']:+.4f}", (f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "-")
