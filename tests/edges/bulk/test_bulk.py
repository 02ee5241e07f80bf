"""`deid-adapter bulk` with the local engine: same bytes on every run, patients linked across files,
refusals reported without stopping the export, a summary without PHI, and resume after SIGKILL."""
from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import pytest

from conformance import safe_harbor
from adapter.bulk.job import SUMMARY_NAME, WORK_DIR, linked_patients
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.walker import age_limit
from tests.support import SAMPLE, TODAY, assert_same_tree, reference_output, refusing_export, run_bulk
from tests.conftest import ROOT, SHARED_TOOLS, TEST_SECRET, needs_shared_tools

LEAK_TOOL = SHARED_TOOLS / "fhir_leak.py"
PSEUDO = Pseudonymizer(Key(key_id_for(TEST_SECRET), TEST_SECRET))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return reference_output(tmp_path_factory)


def ndjson(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def patient_names(patient: dict) -> set[str]:
    return {part for n in patient["name"] for part in n.get("given", []) + [n["family"]]}


def note_text(doc_ref: dict) -> str:
    return "".join(base64.b64decode(c["attachment"]["data"]).decode() for c in doc_ref["content"])


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adapter.cli", *args], cwd=ROOT, capture_output=True, text=True, **kwargs)


def test_layout_manifest_and_summary(reference):
    names = sorted(p.name for p in reference.iterdir())
    resource_files = sorted(p.name for p in SAMPLE.glob("*.ndjson") if p.name != "log.ndjson")
    assert names == sorted(resource_files + ["manifest.json", SUMMARY_NAME])  # the client log is not copied
    manifest = json.loads((reference / "manifest.json").read_text())
    assert [o["url"] for o in manifest["output"]] == resource_files
    assert manifest["transactionTime"] == "2024-08-06T18:12:57Z"  # the export's, from the client log: not the run's
    summary = json.loads((reference / SUMMARY_NAME).read_text())
    assert summary["resources"]["DocumentReference"] == 78 and summary["refused"] == {}
    assert summary["skipped"] == [{"file": "log.ndjson", "reason": "no FHIR resources (a bulk client log); not copied"}]


def test_rerun_with_other_workers_and_chunks_writes_the_same_bytes(reference, tmp_path):
    assert_same_tree(run_bulk(tmp_path / "out", workers=2, chunk_bytes=16 * 1024), reference)
    assert_same_tree(run_bulk(tmp_path / "out", workers=2, chunk_bytes=16 * 1024), reference)  # over its own output


def test_a_note_is_masked_with_the_known_identifiers_of_a_patient_from_another_file(reference):
    patients = {p["id"]: p for p in ndjson(SAMPLE / "Patient.000.ndjson")}
    notes_in = ndjson(SAMPLE / "DocumentReference.000.ndjson")
    notes_out = ndjson(reference / "DocumentReference.000.ndjson")
    assert "Sumiko254 Larue605" in note_text(notes_in[0])  # the name is only in Patient.000.ndjson and the note
    assert len(notes_out) == len(notes_in) == 78
    for before, after in zip(notes_in, notes_out):
        names = patient_names(patients[before["subject"]["reference"].split("/")[1]])
        assert any(name in note_text(before) for name in names)
        assert not [name for name in names if name in note_text(after)]


LINKED_CASES = [
    ({"resourceType": "Observation", "subject": {"reference": "Patient/p1"}}, {"p1"}),
    ({"resourceType": "Claim", "patient": {"reference": "https://fhir.example.org/r4/Patient/p2/_history/3"},
      "provider": {"reference": "Practitioner/d1"}}, {"p2"}),
    ({"resourceType": "Composition", "section": [{"entry": [{"reference": "urn:uuid:5b1d3f0e-1f0a-4a59-9c43-2f3e0b3a7c11"}]}]},
     {"5b1d3f0e-1f0a-4a59-9c43-2f3e0b3a7c11"}),
    ({"resourceType": "Observation", "subject": {"reference": "Patient/p4"}, "note": [{"text": 'said "reference": "Patient/x"'}]},
     {"p4"}),  # a quote in a string: escaped, so the walk decides
    ({"resourceType": "Observation", "subject": {"reference": "Patient/p5", "display": "Zo\u00eb"}},
     {"p5"}),  # once escaped, once in UTF-8
    ({"resourceType": "Observation", "subject": {"display": "no reference"}, "code": {"text": "reference"}}, set()),
]


@pytest.mark.parametrize("doc, ids", LINKED_CASES)
@pytest.mark.parametrize("spacing", [(",", ":"), (" , ", " : ")], ids=["compact", "spaced"])
def test_linked_patients_from_the_line_are_those_of_the_walk(doc, ids, spacing):
    for line in (json.dumps(doc, separators=spacing).encode(), json.dumps(doc, separators=spacing, ensure_ascii=False).encode()):
        assert linked_patients(json.loads(line), line) == linked_patients(json.loads(line)) == ids


def test_linked_patients_of_every_sample_resource_agree():
    for path in SAMPLE.glob("*.ndjson"):
        for line in path.read_bytes().splitlines():
            doc = json.loads(line)
            assert linked_patients(doc, line) == linked_patients(doc), (path.name, doc.get("id"))


def test_one_patient_shifts_by_one_offset_in_every_file(tmp_path):
    out = run_bulk(tmp_path / "out", profile="longitudinal", workers=2)
    patients = {p["id"] for p in ndjson(SAMPLE / "Patient.000.ndjson")}
    over_90 = {p["id"]: age_limit(p.get("birthDate"), date.fromisoformat(TODAY))
               for p in ndjson(SAMPLE / "Patient.000.ndjson")}
    starts = {"Encounter": lambda r: r["period"].get("start"), "Condition": lambda r: r.get("onsetDateTime"),
              "DocumentReference": lambda r: r["context"]["period"].get("start")}
    shifts: dict[str, set[int]] = {}
    for name, start in starts.items():
        for r_in, r_out in zip(ndjson(SAMPLE / f"{name}.000.ndjson"), ndjson(out / f"{name}.000.ndjson")):
            patient = r_in["subject"]["reference"].split("/")[1]
            if start(r_out) is None:  # removed by the 90+ rule: in or before the year the patient turned 90
                assert over_90[patient] and int(start(r_in)[:4]) <= over_90[patient]
                shifts.setdefault(patient, set())
                continue
            days = (date.fromisoformat(start(r_out)[:10]) - date.fromisoformat(start(r_in)[:10])).days
            shifts.setdefault(patient, set()).add(days)
    assert set(shifts) == patients
    assert all(days <= {PSEUDO.day_offset(p)} for p, days in shifts.items())
    assert len({PSEUDO.day_offset(p) for p in patients}) > 1


@needs_shared_tools
def test_independent_leak_check_finds_nothing(reference, tmp_path):
    resources_only = tmp_path / "in"
    shutil.copytree(SAMPLE, resources_only, ignore=shutil.ignore_patterns("log.ndjson"))
    done = subprocess.run([sys.executable, str(LEAK_TOOL), str(resources_only), str(reference)], capture_output=True, text=True)
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["leaks"] == 0 and result["files"] == 9, result


def test_summary_and_manifest_hold_no_phi(reference):
    phi = {v for p in SAMPLE.glob("*.ndjson") if p.name != "log.ndjson" for r in ndjson(p)
           for _, v in safe_harbor.identifying_values(r) if len(v) >= 3}
    phi |= {r["id"] for p in SAMPLE.glob("*.ndjson") if p.name != "log.ndjson" for r in ndjson(p)}
    for name in (SUMMARY_NAME, "manifest.json"):
        text = (reference / name).read_text()
        assert not [v for v in phi if v in text], name


def test_a_refused_resource_is_listed_and_the_rest_is_exported(tmp_path, test_key_file):
    root, refused_id = refusing_export(tmp_path)
    audit_key = tmp_path / "audit.key"
    assert cli("keys", "init", "--purpose", "audit", str(audit_key)).returncode == 0
    audit_opts = ("--audit", str(tmp_path / "audit.sqlite"), "--audit-key-file", str(audit_key))
    done = cli("bulk", str(root), str(tmp_path / "out"), "--key-file", str(test_key_file), "--today", TODAY,
               "--workers", "2", "--stack", "patterns", *audit_opts)
    assert done.returncode == 3, done.stderr
    # every resource, written or refused, has its record in one verified chain
    records = json.loads(cli("audit", "export", "--format", "json", *audit_opts).stdout)
    records = records["records"] if isinstance(records, dict) else records
    ops = [r["operation"] for r in records if r["channel"] == "bulk"]
    assert ops.count("deidentify") == 588 and ops.count("refuse") == 1
    assert cli("audit", "verify", *audit_opts).returncode == 0
    assert refused_id not in (tmp_path / "audit.sqlite").read_bytes().decode("latin-1")
    summary = json.loads((tmp_path / "out" / SUMMARY_NAME).read_text())
    assert summary["refused"] == {"unknown-modifier-extension": 1}
    assert summary["refusals"] == [{"file": "Condition.000.ndjson", "line": 6, "id": PSEUDO.resource_id(refused_id),
                                    "reason": "unknown-modifier-extension"}]
    assert summary["resources"]["Condition"] == 210 and sum(summary["resources"].values()) == 588
    assert refused_id not in (tmp_path / "out" / "Condition.000.ndjson").read_text()
    assert not (tmp_path / "out" / WORK_DIR).exists()


def test_fail_fast_stops_at_the_first_refusal(tmp_path, test_key_file):
    root, _ = refusing_export(tmp_path)
    done = cli("bulk", str(root), str(tmp_path / "out"), "--key-file", str(test_key_file), "--today", TODAY,
               "--workers", "1", "--stack", "patterns", "--fail-fast")
    assert done.returncode == 3 and "--fail-fast" in done.stderr
    assert not (tmp_path / "out" / SUMMARY_NAME).exists()


def test_not_an_export_is_bad_usage(tmp_path, test_key_file):
    done = cli("bulk", str(SAMPLE / "Patient.000.ndjson"), str(tmp_path / "out"), "--key-file", str(test_key_file))
    assert done.returncode == 2 and "not a folder" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_dangling_link_or_an_output_inside_the_export_is_bad_usage(tmp_path, test_key_file):
    """Issue #36: a file of the export that a link no longer leads to is reported, not left out without a word;
    OUT inside IN is refused, or the next run would read its own outputs as the export."""
    root = tmp_path / "export"
    root.mkdir()
    shutil.copy(SAMPLE / "Patient.000.ndjson", root)
    (root / "Observation.000.ndjson").symlink_to(tmp_path / "nowhere")
    done = cli("bulk", str(root), str(tmp_path / "out"), "--key-file", str(test_key_file), "--stack", "patterns")
    assert done.returncode == 2 and "lead nowhere" in done.stderr and "Observation.000.ndjson" in done.stderr
    assert not (tmp_path / "out").exists()
    (root / "Observation.000.ndjson").unlink()
    done = cli("bulk", str(root), str(root / "out"), "--key-file", str(test_key_file), "--stack", "patterns")
    assert done.returncode == 2 and "inside" in done.stderr
    assert not (root / "out").exists()


def journal_entries(out: Path) -> int:
    path = out / WORK_DIR / "journal.ndjson"
    return max(len(path.read_bytes().splitlines()) - 1, 0) if path.exists() else 0


def planned_chunks(log: Path) -> int | None:
    """The chunk count pass 1 prints ("... 589 resources in 92 chunks ..."), once it has printed it."""
    found = re.search(r" in (\d+) chunks", log.read_text()) if log.exists() else None
    return int(found.group(1)) if found else None


def test_killed_at_random_points_and_resumed_writes_the_same_bytes(reference, tmp_path, test_key_file):
    """SIGKILL the whole run (driver and pool) several times, at random moments, then let it finish.

    Kills are placed by the journal's progress, well before the run's last chunk (the whole run takes about a
    second here): a kill that came after the run had finished would leave nothing to resume."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "adapter.cli", "bulk", str(SAMPLE), str(out), "--key-file", str(test_key_file),
            "--today", TODAY, "--workers", "2", "--stack", "patterns", "--chunk-kb", "8"]
    kills = []
    log = tmp_path / "attempt.log"
    total = None
    for attempt in range(3):
        with log.open("w") as err:
            proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        # the first kill lands early (start-up, pass 1, or the first third of pass 2); the others once the
        # journal has passed a few more chunks, so they land in pass 2, each long before the last chunk
        deadline = time.monotonic() + (rng.uniform(0.2, 1.5) if attempt == 0 else 120)
        first_share = rng.uniform(0.05, 0.3)
        target = None
        while proc.poll() is None and time.monotonic() < deadline:
            total = total or planned_chunks(log)
            if target is None and total:
                done = journal_entries(out)
                target = int(total * first_share) if attempt == 0 else min(done + rng.randint(1, 8), total // 2 + attempt)
            if target is not None and journal_entries(out) >= target:
                break
            time.sleep(0.01)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills.append(journal_entries(out))
    assert total, f"pass 1 did not print its chunk count (seed {seed})"
    assert len(kills) == 3 and 0 < max(kills) < total, f"kills after {kills} of {total} chunks (seed {seed})"
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stderr
    assert_same_tree(out, reference, f"(seed {seed}, killed after {kills} journaled chunks)")


def test_a_90_plus_patient_from_another_file_loses_the_years_that_tell_their_age(tmp_path):
    """Issue #20: in a bulk export the Patient and their Encounters sit in different files; pass 1 tells pass 2
    the year a 90+ patient turned 90, so an Encounter dated in or before it loses its year too (a later one keeps
    its year), exactly as in a bundle that holds the Patient."""
    export = tmp_path / "export"
    export.mkdir()
    old = {"resourceType": "Patient", "id": "p-old", "birthDate": "1931-05-02", "name": [{"family": "Quarrington"}]}
    young = {"resourceType": "Patient", "id": "p-young", "birthDate": "1980-05-02"}
    (export / "Patient.000.ndjson").write_text(json.dumps(old) + "\n" + json.dumps(young) + "\n")
    encounters = [{"resourceType": "Encounter", "id": f"e{n}", "status": "finished",
                   "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
                   "subject": {"reference": f"Patient/{who}"}, "period": {"start": start}}
                  for n, (who, start) in enumerate([("p-old", "2015-03-04"), ("p-old", "2025-06-07"),
                                                    ("p-young", "2015-03-04")])]
    (export / "Encounter.000.ndjson").write_text("".join(json.dumps(e) + "\n" for e in encounters))
    out = run_bulk(tmp_path / "out", root=export)
    starts = [e.get("period", {}).get("start") for e in ndjson(out / "Encounter.000.ndjson")]
    # 1931 + 90 = 2021: the 2015 encounter of the 94-year-old tells their age; 2025 and the young patient's keep a year
    assert starts == [None, "2025", "2015"]
    assert "Quarrington" not in (out / "Encounter.000.ndjson").read_text()


def test_a_part_edited_with_its_digest_is_done_again_not_published(tmp_path):
    """Issue #36: the journal is keyed, so a raw line appended to a finished part, its sha256 put in the journal
    to match, does not pass as finished work on resume (the chunk is de-identified again)."""
    from adapter.bulk.job import Chunk, Journal
    import hashlib

    run = {"export": "x"}
    first = Journal(tmp_path / "work", run, TEST_SECRET)
    first.open("2026-01-15", lambda: "2026-01-15")
    first.record(Chunk(0, "Patient.000.ndjson", 0, 10, 1, 1), b'{"resourceType": "Patient"}\n', {"written": 1})
    first.record(Chunk(1, "Patient.000.ndjson", 10, 10, 2, 1), b'{"resourceType": "Patient"}\n', {"written": 1})
    first.close()
    part = first.part(1)
    tampered = part.read_bytes() + b'{"resourceType": "Patient", "name": [{"family": "Zyxwortel"}]}\n'
    part.write_bytes(tampered)
    journal = first.path.read_text().splitlines()
    entry = json.loads(journal[2])
    entry["sha256"] = hashlib.sha256(tampered).hexdigest()
    journal[2] = json.dumps(entry)
    first.path.write_text("\n".join(journal) + "\n")
    again = Journal(tmp_path / "work", run, TEST_SECRET)
    again.open(None, lambda: "2026-01-15")
    assert set(again.done) == {0}
    other_key = Journal(tmp_path / "work", run, bytes(32))
    other_key.open(None, lambda: "2026-01-15")
    assert other_key.done == {}  # a journal written under another key is no one's finished work
