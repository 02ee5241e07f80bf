"""Tests for text_deid.evaluation: hand-computed metrics, bootstrap intervals, input checks."""
from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from text_deid.evaluation import (
    METRICS,
    _percentile,
    compare,
    evaluate,
    format_comparison,
    format_table,
    load_jsonl,
    span_forms,
)


def doc(doc_id, length, *spans):
    return {"id": doc_id, "text": "x" * length, "spans": [sp(*s) for s in spans]}


def sp(start, end, category="NAME"):
    return {"start": start, "end": end, "category": category}


def values(result):
    return {m: result[m]["value"] for m in METRICS}


def ev(gold, predicted, **kw):
    kw.setdefault("resamples", 50)
    return evaluate(gold, predicted, **kw)


# --------------------------------------------------------------------------- hand-computed examples


def test_perfect_prediction():
    gold = [doc("a", 20, (2, 5, "NAME"), (10, 14, "DATE"))]
    pred = {"a": [sp(2, 5, "NAME"), sp(10, 14, "DATE")]}
    r = ev(gold, pred)
    assert values(r) == {
        "span_recall": 1.0,
        "span_precision": 1.0,
        "char_recall": 1.0,
        "other_text_removed": 0.0,
        "hard_negative_over_redaction": 0.0,  # no hard negatives: nothing to over-redact
        "strict_precision": 1.0,
        "strict_recall": 1.0,
        "strict_f1": 1.0,
    }
    assert r["counts"]["missed_gold_spans"] == 0
    assert r["per_category"]["NAME"]["recall"]["value"] == 1.0
    assert r["per_category"]["DATE"]["recall"]["value"] == 1.0


def test_missed_span():
    gold = [doc("a", 20, (2, 5, "NAME"), (10, 14, "DATE"))]
    pred = {"a": [sp(2, 5, "NAME")]}
    r = ev(gold, pred)
    v = values(r)
    assert v["span_recall"] == 0.5
    assert v["span_precision"] == 1.0
    assert v["char_recall"] == pytest.approx(3 / 7)
    assert v["other_text_removed"] == 0.0
    assert v["strict_precision"] == 1.0
    assert v["strict_recall"] == 0.5
    assert v["strict_f1"] == pytest.approx(2 / 3)
    assert r["counts"]["missed_gold_spans"] == 1
    assert r["per_category"]["NAME"] == {
        "gold": 1, "missed": 0, "recall": r["per_category"]["NAME"]["recall"]}
    assert r["per_category"]["NAME"]["recall"]["value"] == 1.0
    assert r["per_category"]["DATE"]["recall"]["value"] == 0.0
    assert r["per_category"]["DATE"]["missed"] == 1


def test_partial_overlap():
    gold = [doc("a", 30, (10, 20, "NAME"))]
    pred = {"a": [sp(15, 25, "NAME")]}
    v = values(ev(gold, pred))
    assert v["span_recall"] == 1.0  # any overlap counts
    assert v["span_precision"] == 1.0
    assert v["char_recall"] == 0.5  # 5 of 10 gold characters
    assert v["other_text_removed"] == 0.25  # 5 of 20 other characters
    assert v["strict_precision"] == v["strict_recall"] == v["strict_f1"] == 0.0


def test_touching_spans_do_not_overlap():
    gold = [doc("a", 10, (0, 5))]
    pred = {"a": [sp(5, 8)]}
    v = values(ev(gold, pred))
    assert v["span_recall"] == 0.0
    assert v["span_precision"] == 0.0
    assert v["char_recall"] == 0.0
    assert v["other_text_removed"] == 3 / 5


def test_wrong_category_counts_for_overlap_not_strict():
    gold = [doc("a", 10, (0, 4, "NAME"))]
    pred = {"a": [sp(0, 4, "DATE")]}
    r = ev(gold, pred)
    v = values(r)
    assert v["span_recall"] == v["span_precision"] == v["char_recall"] == 1.0
    assert v["strict_precision"] == v["strict_recall"] == v["strict_f1"] == 0.0
    assert r["per_category"]["NAME"]["recall"]["value"] == 1.0
    assert "DATE" not in r["per_category"]  # per_category lists gold categories only
    assert r["counts"]["strict_matches"] == 0


def test_hard_negatives_with_and_without_prediction():
    gold = [doc("h1", 10), doc("h2", 10), doc("p", 10, (0, 5, "NAME"))]
    pred = {"h1": [sp(0, 3, "NAME")], "p": [sp(0, 5, "NAME")]}  # h2 absent: no predictions
    r = ev(gold, pred)
    v = values(r)
    assert v["hard_negative_over_redaction"] == 0.5
    assert v["other_text_removed"] == pytest.approx(3 / 25)  # 10 + 10 + 5 other characters
    assert v["span_recall"] == 1.0
    assert v["span_precision"] == 0.5
    assert v["strict_precision"] == 0.5
    assert v["strict_recall"] == 1.0
    assert v["strict_f1"] == pytest.approx(2 / 3)
    c = r["counts"]
    assert c["documents"] == 3
    assert c["hard_negatives"] == 2
    assert c["hard_negatives_with_predictions"] == 1
    assert c["gold_spans"] == 1
    assert c["predicted_spans"] == 2
    assert c["missed_gold_spans"] == 0


def test_overlapping_predictions_do_not_double_count_characters():
    gold = [doc("a", 20, (5, 10, "NAME"))]
    pred = {"a": [sp(0, 8, "NAME"), sp(6, 12, "NAME"), sp(7, 9, "DATE")]}
    r = ev(gold, pred)
    v = values(r)
    assert v["char_recall"] == 1.0
    # predicted union is [0, 12): other characters removed are [0, 5) and [10, 12) = 7 of 15
    assert v["other_text_removed"] == pytest.approx(7 / 15)
    assert v["span_precision"] == 1.0  # each of the three overlaps the gold span
    assert v["span_recall"] == 1.0
    assert v["strict_f1"] == 0.0
    assert r["counts"]["gold_characters_covered"] == 5
    assert r["counts"]["other_characters_removed"] == 7


def test_overlapping_gold_spans_do_not_double_count_characters():
    gold = [doc("a", 20, (0, 6, "NAME"), (4, 10, "GEOGRAPHIC_LOCATION"))]
    pred = {"a": [sp(0, 5, "NAME")]}
    r = ev(gold, pred)
    assert r["counts"]["gold_characters"] == 10
    assert r["counts"]["other_characters"] == 10
    assert r["char_recall"]["value"] == 0.5
    assert r["span_recall"]["value"] == 1.0  # [0, 5) touches both gold spans


def test_duplicate_predictions_match_strictly_once():
    gold = [doc("a", 10, (0, 4, "NAME"))]
    pred = {"a": [sp(0, 4, "NAME"), sp(0, 4, "NAME")]}
    v = values(ev(gold, pred))
    assert v["span_precision"] == 1.0
    assert v["strict_precision"] == 0.5
    assert v["strict_recall"] == 1.0
    assert v["strict_f1"] == pytest.approx(2 / 3)


def test_micro_average_over_documents():
    gold = [doc("a", 10, (0, 2), (3, 5), (6, 8)), doc("b", 10, (0, 2))]
    pred = {"a": [sp(0, 2), sp(3, 5), sp(6, 8)], "b": []}
    v = values(ev(gold, pred))
    assert v["span_recall"] == 0.75  # 3 of 4 spans, not the mean of 1.0 and 0.0
    assert v["char_recall"] == 0.75


def test_zero_denominator_conventions():
    # Only hard negatives, nothing predicted: recall/precision 1.0, over-redaction 0.0.
    r = ev([doc("h", 10)], {})
    assert values(r) == {
        "span_recall": 1.0,
        "span_precision": 1.0,
        "char_recall": 1.0,
        "other_text_removed": 0.0,
        "hard_negative_over_redaction": 0.0,
        "strict_precision": 1.0,
        "strict_recall": 1.0,
        "strict_f1": 1.0,
    }
    assert r["per_category"] == {}
    for m in METRICS:
        assert r[m]["ci95"] == [r[m]["value"]] * 2
    # Only hard negatives, something predicted: precision drops to 0.
    v = values(ev([doc("h", 10)], {"h": [sp(0, 10)]}))
    assert v["span_precision"] == 0.0
    assert v["strict_precision"] == 0.0
    assert v["strict_f1"] == 0.0
    assert v["span_recall"] == 1.0
    assert v["other_text_removed"] == 1.0
    assert v["hard_negative_over_redaction"] == 1.0
    # Gold spans covering the whole text: no other text to remove.
    v = values(ev([doc("a", 5, (0, 5))], {"a": [sp(0, 5)]}))
    assert v["other_text_removed"] == 0.0


def test_result_is_json_serialisable():
    gold = [doc("a", 20, (2, 5, "NAME")), doc("h", 5)]
    r = ev(gold, {"a": [sp(2, 4)]})
    assert json.loads(json.dumps(r)) == r


# --------------------------------------------------------------------------- bootstrap


def _mixed_gold_pred(n_docs=40, seed=7):
    rnd = random.Random(seed)
    gold, pred = [], {}
    cats = ["NAME", "DATE", "GEOGRAPHIC_LOCATION", "PHONE_NUMBER"]
    for i in range(n_docs):
        length = rnd.randint(20, 120)
        spans = []
        pos = rnd.randint(0, 5)
        while rnd.random() < 0.7 and pos + 8 < length:
            end = pos + rnd.randint(1, 8)
            spans.append((pos, end, rnd.choice(cats)))
            pos = end + rnd.randint(1, 15)
        gold.append(doc(f"d{i}", length, *spans))
        p = []
        for s, e, c in spans:
            x = rnd.random()
            if x < 0.6:
                p.append(sp(s, e, c))
            elif x < 0.8:
                p.append(sp(s, min(e + 2, length), c))
        if rnd.random() < 0.2:
            p.append(sp(length - 3, length, "NAME"))
        pred[f"d{i}"] = p
    return gold, pred


def test_ci_contains_value_and_is_ordered():
    gold, pred = _mixed_gold_pred()
    r = evaluate(gold, pred, resamples=500, seed=3)
    entries = [r[m] for m in METRICS] + [c["recall"] for c in r["per_category"].values()]
    for e in entries:
        lo, hi = e["ci95"]
        assert 0.0 <= lo <= e["value"] <= hi <= 1.0


def test_ci_deterministic_for_fixed_seed():
    gold, pred = _mixed_gold_pred()
    a = evaluate(gold, pred, resamples=300, seed=11)
    b = evaluate(gold, pred, resamples=300, seed=11)
    c = evaluate(gold, pred, resamples=300, seed=12)
    assert a == b
    assert any(a[m]["ci95"] != c[m]["ci95"] for m in METRICS)
    assert all(a[m]["value"] == c[m]["value"] for m in METRICS)
    assert a["bootstrap"]["resamples"] == 300 and a["bootstrap"]["seed"] == 11


def test_default_is_1000_resamples_seed_0():
    gold, pred = _mixed_gold_pred(n_docs=10)
    assert evaluate(gold, pred) == evaluate(gold, pred, resamples=1000, seed=0)
    assert evaluate(gold, pred)["bootstrap"]["resamples"] == 1000


def test_zero_resamples_gives_no_interval():
    gold, pred = _mixed_gold_pred(n_docs=5)
    r = evaluate(gold, pred, resamples=0)
    assert all(r[m]["ci95"] is None for m in METRICS)
    assert "95% CI" in format_table(r)


def test_bootstrap_matches_brute_force_resampling():
    """Each resample equals evaluating the resampled documents from scratch."""
    gold, pred = _mixed_gold_pred(n_docs=12, seed=5)
    resamples, seed = 200, 9
    r = evaluate(gold, pred, resamples=resamples, seed=seed)
    rng = random.Random(seed)
    samples = {m: [] for m in METRICS}
    for _ in range(resamples):
        idx = rng.choices(range(len(gold)), k=len(gold))
        g = [dict(gold[i], id=f"{k}") for k, i in enumerate(idx)]
        p = {f"{k}": pred[gold[i]["id"]] for k, i in enumerate(idx)}
        rr = evaluate(g, p, resamples=0)
        c = rr["counts"]
        # Left out where the metric's denominator is zero in the resample.
        defined = {
            "span_recall": c["gold_spans"] > 0,
            "span_precision": c["predicted_spans"] > 0,
            "char_recall": c["gold_characters"] > 0,
            "other_text_removed": c["other_characters"] > 0,
            "hard_negative_over_redaction": c["hard_negatives"] > 0,
            "strict_precision": c["predicted_spans"] > 0,
            "strict_recall": c["gold_spans"] > 0,
            "strict_f1": c["gold_spans"] + c["predicted_spans"] > 0,
        }
        for m in METRICS:
            if defined[m]:
                samples[m].append(rr[m]["value"])
    for m in METRICS:
        s = sorted(samples[m])
        assert r[m]["ci95"] == pytest.approx([_percentile(s, 0.025), _percentile(s, 0.975)])


def test_percentile_interpolates_linearly():
    s = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert _percentile(s, 0.0) == 0.0
    assert _percentile(s, 1.0) == 4.0
    assert _percentile(s, 0.5) == 2.0
    assert _percentile(s, 0.025) == pytest.approx(0.1)
    assert _percentile([7.0], 0.975) == 7.0


# --------------------------------------------------------------------------- input checks


SECRET = "Jane Roe lives at 12 Elm St"


@pytest.mark.parametrize(
    "bad",
    [
        sp(-1, 3),
        sp(0, len(SECRET) + 1),
        sp(5, 5),
        sp(6, 4),
        {"start": 0.0, "end": 3, "category": "NAME"},
        {"start": True, "end": 3, "category": "NAME"},
        {"start": 0, "end": 3},
        "not a span",
    ],
)
def test_bad_predicted_span_raises_without_text(bad):
    gold = [{"id": "a", "text": SECRET, "spans": [sp(0, 8)]}]
    with pytest.raises(ValueError) as exc:
        evaluate(gold, {"a": [bad]}, resamples=0)
    assert "'a'" in str(exc.value)
    assert "Jane" not in str(exc.value) and "Elm" not in str(exc.value)


def test_bad_gold_span_raises():
    gold = [{"id": "a", "text": SECRET, "spans": [sp(0, 99)]}]
    with pytest.raises(ValueError, match="out of range"):
        evaluate(gold, {}, resamples=0)


@pytest.mark.parametrize(
    "gold, pred, match",
    [
        ([], {}, "no gold"),
        ([doc("a", 5), doc("a", 5)], {}, "duplicate"),
        ([doc("a", 5)], {"b": []}, "not in gold"),
        ([{"id": "a", "text": "xxxxx"}], {}, "spans"),
        ([{"id": 1, "text": "xxxxx", "spans": []}], {}, "id"),
        ([{"id": "a", "text": None, "spans": []}], {}, "text"),
        ([doc("a", 5)], {"a": sp(0, 1)}, "list"),
    ],
)
def test_bad_input_raises(gold, pred, match):
    with pytest.raises(ValueError, match=match):
        evaluate(gold, pred, resamples=0)


def test_negative_resamples_rejected():
    with pytest.raises(ValueError):
        evaluate([doc("a", 5)], {}, resamples=-1)


def test_extra_span_keys_are_ignored():
    gold = [doc("a", 10, (0, 4))]
    pred = {"a": [dict(sp(0, 4), detector="patterns", confidence=0.9)]}
    assert evaluate(gold, pred, resamples=0)["strict_f1"]["value"] == 1.0


# --------------------------------------------------------------------------- format_table / load_jsonl


def test_format_table():
    gold = [doc("a", 20, (2, 5, "NAME"), (10, 14, "DATE")), doc("h", 5)]
    r = ev(gold, {"a": [sp(2, 5, "NAME")]})
    table = format_table(r)
    lines = table.splitlines()
    assert lines[0].split() == ["Metric", "Value", "95%", "CI"]
    for label in ("Span recall", "Span precision", "Character recall", "Other text removed",
                  "Hard-negative over-redaction", "Strict F1"):
        assert any(line.startswith(label) for line in lines), label
    recall_line = next(line for line in lines if line.startswith("Span recall"))
    assert "0.5000" in recall_line and "[" in recall_line
    assert "NAME (n=1)" in table and "DATE (n=1)" in table
    # The value column is aligned across metric rows.
    metric_lines = lines[2:2 + len(METRICS)]
    assert len({line.index("[") for line in metric_lines}) == 1


def test_load_jsonl(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"id": "a", "text": "x", "spans": []}\n\n{"id": "b", "text": "y"}\n')
    assert load_jsonl(p) == [{"id": "a", "text": "x", "spans": []}, {"id": "b", "text": "y"}]


def test_load_jsonl_bad_json_names_line_not_text(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text('{"id": "a"}\n\n{"id": "b", "text": "Jane Roe SECRET\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 3") as exc:
        load_jsonl(p)
    assert "SECRET" not in str(exc.value) and "Jane" not in str(exc.value)


def test_load_jsonl_rejects_non_objects_and_bad_utf8(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text('{"id": "a"}\n["Jane"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        load_jsonl(p)
    p.write_bytes(b'{"id": "a"}\n{"id": "\xff"}\n')
    with pytest.raises(ValueError, match="line 2"):
        load_jsonl(p)


# --------------------------------------------------------------------------- properties

CATS = st.sampled_from(["NAME", "DATE", "GEOGRAPHIC_LOCATION", "MEDICAL_RECORD_NUMBER"])


@st.composite
def documents(draw):
    n = draw(st.integers(1, 6))
    gold = []
    for i in range(n):
        length = draw(st.integers(1, 60))
        spans = []
        for _ in range(draw(st.integers(0, 4))):
            s = draw(st.integers(0, length - 1))
            e = draw(st.integers(s + 1, length))
            spans.append(sp(s, e, draw(CATS)))
        gold.append({"id": f"d{i}", "text": "x" * length, "spans": spans})
    return gold


@settings(max_examples=150, deadline=None)
@given(documents(), st.integers(0, 2**32))
def test_predicting_gold_exactly_is_perfect(gold, seed):
    pred = {d["id"]: [dict(s) for s in d["spans"]] for d in gold}
    r = evaluate(gold, pred, resamples=20, seed=seed)
    for m in ("span_recall", "span_precision", "char_recall", "strict_precision",
              "strict_recall", "strict_f1"):
        assert r[m]["value"] == 1.0, m
        assert r[m]["ci95"] == [1.0, 1.0], m
    assert r["other_text_removed"]["value"] == 0.0
    assert r["hard_negative_over_redaction"]["value"] == 0.0
    assert r["counts"]["missed_gold_spans"] == 0
    assert all(c["recall"]["value"] == 1.0 for c in r["per_category"].values())


@st.composite
def gold_and_predictions(draw):
    gold = draw(documents())
    pred = {}
    for d in gold:
        length = len(d["text"])
        spans = []
        for _ in range(draw(st.integers(0, 4))):
            s = draw(st.integers(0, length - 1))
            e = draw(st.integers(s + 1, length))
            spans.append(sp(s, e, draw(CATS)))
        pred[d["id"]] = spans
    return gold, pred


def _char_reference(gold, pred):
    """Character metrics by brute force over sets of positions."""
    g_cov = g_all = o_cov = o_all = 0
    for d in gold:
        g = {i for s in d["spans"] for i in range(s["start"], s["end"])}
        p = {i for s in pred[d["id"]] for i in range(s["start"], s["end"])}
        g_all += len(g)
        g_cov += len(g & p)
        o_all += len(d["text"]) - len(g)
        o_cov += len(p - g)
    return (g_cov / g_all if g_all else 1.0), (o_cov / o_all if o_all else 0.0)


@settings(max_examples=150, deadline=None)
@given(gold_and_predictions())
def test_metrics_match_brute_force_and_stay_in_range(data):
    gold, pred = data
    r = evaluate(gold, pred, resamples=20, seed=1)
    char_recall, other = _char_reference(gold, pred)
    assert r["char_recall"]["value"] == pytest.approx(char_recall)
    assert r["other_text_removed"]["value"] == pytest.approx(other)

    def overlap(a, b):
        return a["start"] < b["end"] and b["start"] < a["end"]

    gold_spans = [(d["id"], s) for d in gold for s in d["spans"]]
    pred_spans = [(i, s) for i, ps in pred.items() for s in ps]
    hit = sum(any(overlap(g, p) for p in pred[i]) for i, g in gold_spans)
    phit = sum(any(overlap(p, g) for g in next(d for d in gold if d["id"] == i)["spans"])
               for i, p in pred_spans)
    assert r["counts"]["missed_gold_spans"] == len(gold_spans) - hit
    assert r["span_recall"]["value"] == (hit / len(gold_spans) if gold_spans else 1.0)
    assert r["span_precision"]["value"] == (phit / len(pred_spans) if pred_spans else 1.0)
    for m in METRICS:
        v, (lo, hi) = r[m]["value"], r[m]["ci95"]
        assert 0.0 <= v <= 1.0 and 0.0 <= lo <= hi <= 1.0
        assert not math.isnan(v)


# --------------------------------------------------------------------------- forms and clusters


@pytest.mark.parametrize("value, forms", [
    ("Rubija", ["single-token"]),
    ("Okonkwo Adebayo", ["multi-part"]),
    ("Garcia-Reyes", ["multi-part"]),
    ("O'Brien", ["multi-part"]),
    ("maría", ["single-token", "lowercase", "non-ascii"]),
    ("SØNDERBORG", ["single-token", "all-caps", "non-ascii"]),
    ("Nguyễn Văn An", ["multi-part", "non-ascii"]),
])
def test_span_forms(value, forms):
    assert span_forms(value) == forms


def test_recall_per_form_reads_the_gold_text():
    text = "maría met Okonkwo Adebayo in OSLO"
    gold = [{"id": "a", "text": text, "spans": [
        sp(0, 5, "NAME"), sp(10, 25, "NAME"), sp(29, 33, "GEOGRAPHIC_LOCATION")]}]
    r = ev(gold, {"a": [sp(10, 17, "NAME")]})  # only the multi-part name is (partly) found
    names = r["per_form"]["NAME"]
    assert {f: (i["gold"], i["missed"]) for f, i in names.items()} == {
        "single-token": (1, 1), "multi-part": (1, 0), "lowercase": (1, 1), "non-ascii": (1, 1)}
    assert names["multi-part"]["recall"]["value"] == 1.0
    assert r["per_form"]["GEOGRAPHIC_LOCATION"]["all-caps"]["recall"]["value"] == 0.0
    assert "Recall by form" in format_table(r) and "NAME lowercase (n=1)" in format_table(r)


def _templated(n_templates=6, per_template=5, seed=3):
    rng = random.Random(seed)
    gold, pred = [], {}
    for t in range(n_templates):
        found = rng.random() < 0.5  # one template's lines are all found or all missed
        for k in range(per_template):
            doc_id = f"t{t}-{k}"
            gold.append({"id": doc_id, "template": str(t), "text": "x" * 20, "spans": [sp(2, 6)]})
            pred[doc_id] = [sp(2, 6)] if found else []
    return gold, pred


def test_cluster_bootstrap_resamples_groups_of_records():
    """Each resample equals evaluating whole templates drawn with replacement, from scratch."""
    gold, pred = _templated()
    r = evaluate(gold, pred, resamples=200, seed=4, cluster="template")
    templates = sorted({g["template"] for g in gold})
    rng = random.Random(4)
    samples = []
    for _ in range(200):
        picked = rng.choices(templates, k=len(templates))
        docs = [g for t in picked for g in gold if g["template"] == t]
        samples.append(sum(bool(pred[g["id"]]) for g in docs) / len(docs))
    s = sorted(samples)
    assert r["span_recall"]["ci95"] == pytest.approx([_percentile(s, 0.025), _percentile(s, 0.975)])
    assert r["bootstrap"]["cluster"] == "template" and r["bootstrap"]["units"] == 6
    assert r["counts"]["documents"] == 30
    # lines of one template move together: the interval over lines is narrower than over templates
    by_line = evaluate(gold, pred, resamples=200, seed=4)["span_recall"]["ci95"]
    assert by_line[1] - by_line[0] < r["span_recall"]["ci95"][1] - r["span_recall"]["ci95"][0]


def test_cluster_comparison_is_paired_over_groups():
    gold, pred = _templated()
    c = compare(gold, pred, {}, resamples=100, cluster="template")
    assert c["difference"]["span_recall"]["value"] == evaluate(gold, pred, resamples=0)["span_recall"]["value"]
    assert c["bootstrap"]["units"] == 6 and "template" in c["bootstrap"]["method"]
    assert "NAME single-token" in format_comparison(c, "a", "b")


def test_cluster_field_missing_is_an_error_without_text():
    gold, pred = _templated()
    del gold[3]["template"]
    with pytest.raises(ValueError, match="#4 has no string or number 'template'") as e:
        evaluate(gold, pred, cluster="template")
    assert "xxxx" not in str(e.value)
