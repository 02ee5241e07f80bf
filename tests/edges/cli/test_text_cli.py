"""`text detect`, `text redact` and `eval` follow the JSONL contracts of ../shared/DESIGN.md."""
from __future__ import annotations

import json

from text_deid.stack import DEFAULT_STACK
from tests.conftest import DATA, run_cli

NOTES = [
    {"id": "n1", "text": "Pt Quillan Zyxwortel seen 03/14/2024, MRN: 55-81234. Call 612-555-0111.",
     "known": [{"value": "Quillan Zyxwortel", "category": "NAME"}]},
    {"id": "n2", "text": "No PHI here: 45 year old with cough since 2021."},
]


def test_detect_returns_offsets_and_categories_never_text(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(n) + "\n" for n in NOTES))
    proc = run_cli("text", "detect", "--in", str(src), check=True)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["n1", "n2"]
    text = NOTES[0]["text"]
    found = {(text[s["start"]:s["end"]], s["category"]) for s in rows[0]["spans"]}
    assert ("Quillan Zyxwortel", "NAME") in found
    assert ("03/14/2024", "DATE") in found and ("612-555-0111", "PHONE_NUMBER") in found
    assert any(c == "MEDICAL_RECORD_NUMBER" for _, c in found)
    assert rows[1]["spans"] == []  # an age under 90 and a bare year are not PHI
    assert "Zyxwortel" not in proc.stdout
    assert set(rows[0]["spans"][0]) == {"start", "end", "category", "detector", "confidence"}


def test_redact_tags_and_keyed_surrogates(tmp_path, test_key_file):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(n) + "\n" for n in NOTES))
    tags = [json.loads(x) for x in run_cli("text", "redact", "--in", str(src), check=True).stdout.splitlines()]
    assert tags[0]["text"].startswith("Pt [NAME] seen [DATE]")
    out = tmp_path / "out.jsonl"
    run_cli("text", "redact", "--surrogates", "--in", str(src), "--out", str(out), key_file=test_key_file, check=True)
    first = out.read_text()
    run_cli("text", "redact", "--surrogates", "--in", str(src), "--out", str(out), key_file=test_key_file, check=True)
    assert out.read_text() == first  # consistent surrogates
    assert "Zyxwortel" not in first and "612-555-0111" not in first


def test_bad_jsonl_is_exit_2(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "x"}\n')
    proc = run_cli("text", "detect", "--in", str(src))
    assert proc.returncode == 2 and "line 1" in proc.stderr


def test_eval_on_the_tuning_half_prints_metrics_with_intervals(tmp_path):
    gold = tmp_path / "gold.jsonl"
    lines = (DATA / "asq-phi" / "tuning.jsonl").read_text().splitlines()[:60]
    gold.write_text("\n".join(lines) + "\n")
    proc = run_cli("eval", str(gold), "--json", check=True)
    result = json.loads(proc.stdout)
    assert result["stack"] == DEFAULT_STACK
    for metric in ("span_recall", "span_precision", "char_recall", "other_text_removed",
                   "hard_negative_over_redaction", "strict_f1"):
        lo, hi = result[metric]["ci95"]
        assert 0 <= lo <= result[metric]["value"] <= hi <= 1
    assert result["per_category"]["DATE"]["recall"]["value"] > 0.9
