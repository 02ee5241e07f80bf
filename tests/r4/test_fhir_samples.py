"""End to end on every FHIR sample of tests/data: no leaks, references resolve, outputs re-parse, runs repeat byte for byte."""
from __future__ import annotations

import json
import re

import pytest
from fhir.resources.R4B import get_fhir_model_class

from conformance import safe_harbor as leak_check
from tests.conftest import DATA, run_cli
from tests.r4.r4_invariants import violations

FOLDERS = ["synthea-bundles", "bulk-ndjson", "hl7-r4-examples"]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, test_key_file, other_key_file):
    base = tmp_path_factory.mktemp("fhir-out")
    runs = {}
    for name, key in (("a", test_key_file), ("b", test_key_file), ("other", other_key_file)):
        proc = run_cli("fhir", str(DATA / "fhir"), str(base / name), "--today", "2026-01-15", "--keep-file-names",
                       key_file=key)
        runs[name] = (proc, base / name)
    return runs


def input_files():
    return sorted(p for p in (DATA / "fhir").rglob("*") if p.suffix in (".json", ".ndjson") and p.name != "log.ndjson")


def test_every_resource_file_is_written_and_the_log_is_skipped(outputs):
    proc, out = outputs["a"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    for path in input_files():
        assert (out / path.relative_to(DATA / "fhir")).exists(), path.name
    assert not (out / "bulk-ndjson" / "log.ndjson").exists()
    assert "log.ndjson: holds no FHIR resources" in proc.stderr


def test_independent_leak_check_finds_nothing(outputs):
    _, out = outputs["a"]
    checked = 0
    for path in input_files():
        n, found = leak_check.leaks(path, out / path.relative_to(DATA / "fhir"))
        checked += n
        assert found == [], f"{path.name}: leaked kinds {sorted(set(found))}"
    assert checked > 1000  # the check really looked at the samples' identifiers (1,225 in tests/data)


def test_every_reference_that_resolved_still_resolves(outputs):
    _, out = outputs["a"]
    resolved_in = resolved_out = 0
    for path in input_files():
        if path.suffix != ".json":
            continue
        src = leak_check.load(path)[0]
        dst = leak_check.load(out / path.relative_to(DATA / "fhir"))[0]
        names_in, refs_in = leak_check.references(src)
        names_out, refs_out = leak_check.references(dst)
        assert len(refs_in) == len(refs_out)
        for before, after in zip(refs_in, refs_out):
            if before in names_in:
                resolved_in += 1
                assert after in names_out, f"{path.name}: a reference no longer resolves"
                resolved_out += 1
    assert resolved_in > 200 and resolved_in == resolved_out  # 213 in tests/data


def test_urn_uuid_references_stay_uuids(outputs):
    _, out = outputs["a"]
    doc = json.loads(next((out / "synthea-bundles").glob("*.json")).read_text())
    urns = [v for k, v in leak_check.nodes(doc) if isinstance(v, str) and v.startswith("urn:uuid:")]
    assert urns and all(re.fullmatch(r"urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", u)
                        for u in urns)
    assert doc["type"] == "transaction" and all(e["request"]["url"] for e in doc["entry"])


def test_outputs_reparse_with_the_r4b_models(outputs):
    _, out = outputs["a"]
    for path in sorted(out.rglob("*")):
        if path.is_file():
            for doc in leak_check.load(path):
                get_fhir_model_class(doc["resourceType"]).model_validate(doc)


def test_second_run_is_byte_identical(outputs):
    _, a = outputs["a"]
    _, b = outputs["b"]
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_another_key_changes_every_pseudonym(outputs):
    _, a = outputs["a"]
    _, other = outputs["other"]
    compared = 0
    for path in sorted(a.rglob("*.json")):
        doc_a = json.loads(path.read_text())
        doc_o = json.loads((other / path.relative_to(a)).read_text())
        ids_a = [r.get("id") for r in leak_check.resources(doc_a) if r.get("id")]
        ids_o = [r.get("id") for r in leak_check.resources(doc_o) if r.get("id")]
        assert len(ids_a) == len(ids_o)
        for x, y in zip(ids_a, ids_o):
            assert x != y
            compared += 1
    assert compared > 80  # 90 .json resources in tests/data


def test_outputs_carry_security_labels_and_key_id(outputs):
    _, out = outputs["a"]
    doc = json.loads(next((out / "synthea-bundles").glob("*.json")).read_text())
    patient = doc["entry"][0]["resource"]
    codes = {c["code"] for c in patient["meta"]["security"]}
    assert {"REDACTED", "PSEUDED", "ABSTRED"} <= codes
    assert any(t["system"].endswith("key-id") for t in patient["meta"]["tag"])


def _records(path) -> list[dict]:
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".ndjson" else [json.loads(text)]


def test_every_output_resource_holds_the_dom_invariants(outputs):
    # dom-2..dom-6 (contained: no nesting, referenced, no versionId/lastUpdated, no security labels; narrative
    # kept) and no meta.profile claim, on every resource of every output
    _, out = outputs["a"]
    found, checked = [], 0
    for path in input_files():
        for given, written in zip(_records(path), _records(out / path.relative_to(DATA / "fhir")), strict=True):
            found += [f"{path.name}: {v}" for v in violations(written, given)]
            checked += 1
    assert checked > 500 and found == []  # 597 resources in tests/data
