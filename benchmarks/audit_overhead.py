"""De-identification throughput with the audit trail on versus off, on SQLite and on PostgreSQL.

Run: .venv/bin/python benchmarks/audit_overhead.py [--repeat N] [--pg URL]
Works as the `fhir` command does: one audit record per output record, committed (fsync) once per output
file before that file would be written. Two workloads from ../shared/data/fhir: the Synthea bundles (one
record per file) and the bulk NDJSON files (many records per file). Validation is off (the fast path), which
makes the audit's share of the time as large as it gets. Prints each time and the ratio; target ≤ 10%.
Also prints raw append rates (single-record transactions and batches of 100) and verify time.
"""
from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from adapter import fhir_files
from adapter.audit import AuditEntry, AuditSession, AuditTrail
from adapter.audit_cli import record_file
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.record import Deidentifier
from fhir_transforms.rules import load_profile
from text_deid.stack import build_stack

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "fhir"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def workloads() -> dict[str, list[tuple[bool, list[dict]]]]:
    """Each workload: files, each (is NDJSON, its resources)."""
    bundles = [(False, [json.loads(p.read_text())]) for p in sorted((DATA / "synthea-bundles").glob("*.json"))]
    ndjson = []
    for p in sorted((DATA / "bulk-ndjson").glob("*.ndjson")):
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        if rows and all("resourceType" in r for r in rows):
            ndjson.append((True, rows))
    return {"synthea bundles (1 record/file)": bundles, "bulk ndjson (many records/file)": ndjson}


def run(engine: Deidentifier, files: list[tuple[bool, list[dict]]], trail: AuditTrail | None) -> float:
    session = AuditSession(trail, engine, actor="benchmark", channel="cli", data_format="fhir")
    start = time.perf_counter()
    for ndjson, resources in files:
        out, audited = [], []
        for res in resources:
            result = engine.deidentify(res, "input")
            out.append(result.resource)
            audited.append((res, result.findings, "input"))
        data = fhir_files.serialize(out, ndjson)  # the command serializes its output in any case
        if trail:
            record_file(session, audited, data, ndjson)
    return time.perf_counter() - start


def append_rates(trail: AuditTrail) -> str:
    entry = AuditEntry("deidentify", "benchmark", "cli", "fhir", "0" * 64, "1" * 64, "safe-harbor", "1", "patterns",
                       {}, "k-x", [["Patient.text.div", 0, 4, "NAME", "known", 1.0]] * 5)
    start = time.perf_counter()
    for _ in range(200):
        trail.append([entry])
    single = 200 / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(20):
        trail.append([entry] * 100)
    batched = 2000 / (time.perf_counter() - start)
    start = time.perf_counter()
    report = trail.verify()
    verify_s = time.perf_counter() - start
    return (f"appends: {single:.0f} records/s one per transaction, {batched:.0f} records/s in batches of 100; "
            f"verify: {report.records} records in {verify_s:.3f} s ({report.records / verify_s:.0f}/s, ok={report.ok})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL URL ('' to skip)")
    args = parser.parse_args()
    secret = secrets.token_bytes(32)  # throwaway keys
    engine = Deidentifier(load_profile("safe-harbor"), Pseudonymizer(Key(key_id_for(secret), secret)),
                          build_stack("patterns"), validate=False)
    audit_secret = secrets.token_bytes(32)
    ring = [Key(key_id_for(audit_secret, "audit"), audit_secret)]
    tmp = tempfile.mkdtemp(prefix="audit-bench-")
    stores = {"sqlite": f"sqlite:///{tmp}/audit.sqlite"}
    schema = f"audit_bench_{secrets.token_hex(4)}"
    admin = None
    if args.pg:
        admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        stores["postgresql"] = f"{args.pg}?options=-csearch_path%3D{schema}"
    try:
        trails = {name: AuditTrail(url, ring) for name, url in stores.items()}
        for label, files in workloads().items():
            n = sum(len(f) for _, f in files)
            run(engine, files, None)  # warm caches
            # Interleave off/on repeats so drifting machine load hits both alike; keep the best of each.
            best = {name: float("inf") for name in ("off", *trails)}
            for _ in range(args.repeat):
                best["off"] = min(best["off"], run(engine, files, None))
                for name, trail in trails.items():
                    best[name] = min(best[name], run(engine, files, trail))
            print(f"{label}: {len(files)} files, {n} records, best of {args.repeat}")
            print(f"  audit off        {best['off']:7.3f} s  {n / best['off']:8.1f} records/s")
            for name in trails:
                print(f"  audit {name:10s} {best[name]:7.3f} s  {n / best[name]:8.1f} records/s  "
                      f"overhead {best[name] / best['off'] - 1:+.1%}  (target <= +10%)")
        for name, trail in trails.items():
            print(f"{name}: {append_rates(trail)}")
            trail.close()
    finally:
        if admin is not None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            admin.dispose()


if __name__ == "__main__":
    main()
