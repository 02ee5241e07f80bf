"""De-identification throughput with the audit trail on versus off, on SQLite and on PostgreSQL.

Run: .venv/bin/python benchmarks/audit_overhead.py [--repeat N] [--pg URL]

Each run works through a workload as the `fhir` command does, file by file: de-identify every record
(validation off, the fast path, where the audit's share is largest) and serialize the output; with the
trail on, append one record per output record and commit them (one transaction, one fsync); then write
the output file atomically (write, fsync, rename) into a scratch folder. Two workloads from
../shared/data/fhir: the Synthea bundles (one large record per file) and the bulk NDJSON files (many
small records per file). Each file goes through the modes off, off again, SQLite and PostgreSQL back to
back, in a rotating order, N rounds after a warm-up round; every (mode, file, part) keeps its best, and a
mode's time is the sum over files.

Prints per workload: seconds and records/s per mode, and the overhead (on / off - 1; target <= +10%).
"Off again" is an A/A control: the same work as "off", so its difference from "off" is the noise in
the overheads. Then the audit's own cost, timed around the audit calls inside the "on" runs (hashing,
chaining, signing, insert and commit), which does not drown in that noise: microseconds per record and
its share of the de-identification time alone (de-identify + serialize, without the output write), in
wall-clock time and in this thread's CPU time (on a loaded machine wall-clock time also counts waiting
for a core; the audit also waits for the commit's fsync, which varies with the disk's load, and for the
PostgreSQL server). Last, raw append rates (one record per transaction, batches of 100) and verify speed,
and what the anchor file costs: one-record appends with and without it, in alternating rounds, each keeping
its best (`--appends-only` runs only these).
"""
from __future__ import annotations

import argparse
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from adapter import files as fhir_files
from adapter.audit.trail import AuditEntry, AuditSession, AuditTrail
from adapter.cli.auditing import record_file
from adapter.cli.common import tune_gc
from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.rules import load_profile
from text_deid.stack import build_stack

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "fhir"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PARTS = ("deidentify", "audit", "write")  # wall-clock seconds; "... cpu": this thread's CPU time in that part
TIMES = (*PARTS, "deidentify cpu", "audit cpu", "total")


def workloads() -> dict[str, list[fhir_files.FhirFile]]:
    """Each workload: its files, read as the `fhir` command reads them."""
    def read(folder: str, pattern: str) -> list[fhir_files.FhirFile]:
        files = []
        for p in sorted((DATA / folder).glob(pattern)):
            try:
                files.append(fhir_files.read(p, Path(p.name)))
            except fhir_files.NoResources:
                continue  # the bulk client's log.ndjson
        return files
    return {"synthea bundles (1 record/file)": read("synthea-bundles", "*.json"),
            "bulk ndjson (many records/file)": read("bulk-ndjson", "*.ndjson")}


def process(engine: Deidentifier, f: fhir_files.FhirFile, session: AuditSession, target: Path) -> dict:
    """One input file as the `fhir` command handles it; the seconds spent in each part."""
    t0, c0 = time.perf_counter(), time.thread_time()
    results, audited = [], []
    for res, raw in zip(f.resources, f.raw):
        result = engine.deidentify(res, "input")
        results.append(result.resource)
        audited.append((raw, res["resourceType"], result.findings, "input"))
    data = fhir_files.serialize(results, f.ndjson)
    t1, c1 = time.perf_counter(), time.thread_time()
    record_file(session, audited, data, f.ndjson)  # durable before the output exists (nothing to do when off)
    t2, c2 = time.perf_counter(), time.thread_time()
    fhir_files.write_atomic(target, data)
    t3 = time.perf_counter()
    return {"deidentify": t1 - t0, "audit": t2 - t1, "write": t3 - t2, "deidentify cpu": c1 - c0, "audit cpu": c2 - c1,
            "total": t3 - t0}


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


def anchor_ratio(trail: AuditTrail, rounds: int = 7, per_round: int = 100) -> str:
    """One-record appends with the anchor line written and without, alternating; the ratio of the best rounds."""
    entry = AuditEntry("deidentify", "benchmark", "cli", "fhir", "0" * 64, "1" * 64, "safe-harbor", "1", "patterns",
                       {}, "k-x", [["Patient.text.div", 0, 4, "NAME", "known", 1.0]] * 5)
    anchor, best = trail.anchor, {"with anchor": float("inf"), "without": float("inf")}
    for r in range(rounds):
        for mode in (("with anchor", "without") if r % 2 else ("without", "with anchor")):
            trail.anchor = anchor if mode == "with anchor" else None
            start = time.perf_counter()
            for _ in range(per_round):
                trail.append([entry])
            best[mode] = min(best[mode], (time.perf_counter() - start) / per_round)
    trail.anchor = anchor
    return (f"anchor: {best['with anchor'] * 1e3:.2f} ms per one-record append with it, {best['without'] * 1e3:.2f} ms "
            f"without ({best['with anchor'] / best['without']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL URL ('' to skip)")
    parser.add_argument("--appends-only", action="store_true", help="only the append rates and the anchor's cost")
    args = parser.parse_args()
    tune_gc()  # as every deid-adapter command does
    secret = secrets.token_bytes(32)  # throwaway keys
    engine = Deidentifier(load_profile("safe-harbor"), Pseudonymizer(Key(key_id_for(secret), secret)),
                          build_stack("patterns"), validate=False)
    audit_secret = secrets.token_bytes(32)
    ring = [Key(key_id_for(audit_secret, "audit"), audit_secret)]
    tmp = Path(tempfile.mkdtemp(prefix="audit-bench-"))
    out = tmp / "out"
    out.mkdir()
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
        modes = {"off": None, "off again": None, **trails}  # "off again": the same work, to show the noise
        sessions = {mode: AuditSession(trail, engine, actor="benchmark", channel="cli", data_format="fhir")
                    for mode, trail in modes.items()}
        for label, files in ({} if args.appends_only else workloads()).items():
            n = sum(len(f.resources) for f in files)
            # Each file goes through every mode back to back, so drifting machine load hits the modes alike, in
            # an order that rotates (a run can leave caches warm for the next); each (mode, file, part) keeps its
            # best of N. Round 0 warms caches, connections and statements.
            best = {mode: [dict.fromkeys(TIMES, float("inf")) for _ in files] for mode in modes}
            order = list(sessions.items())
            for round_ in range(args.repeat + 1):
                for i, f in enumerate(files):
                    k = (round_ + i) % len(order)
                    for mode, session in order[k:] + order[:k]:
                        spent = process(engine, f, session, out / f"{i}.{'ndjson' if f.ndjson else 'json'}")
                        if round_:
                            best[mode][i] = {part: min(best[mode][i][part], spent[part]) for part in spent}
            sums = {mode: {part: sum(f[part] for f in per_file) for part in per_file[0]}
                    for mode, per_file in best.items()}
            deidentify = min(m["deidentify"] for m in sums.values())
            deidentify_cpu = min(m["deidentify cpu"] for m in sums.values())
            off = sums["off"]["total"]
            print(f"{label}: {len(files)} files, {n} records, best of {args.repeat}")
            print(f"  {'mode':10s} {'seconds':>8s} {'records/s':>10s} {'vs off':>7s}  |  us/record: {'de-identify':>11s} "
                  f"{'(CPU)':>8s} {'audit':>8s} {'(CPU)':>8s} {'write':>7s}")
            for mode, m in sums.items():
                print(f"  {mode:10s} {m['total']:8.3f} {n / m['total']:10.1f} {m['total'] / off - 1:+7.1%}  |  {'':10s} "
                      + " ".join(f"{m[part] / n * 1e6:{w}.{p}f}" for part, w, p in (
                          ("deidentify", 11, 0), ("deidentify cpu", 8, 0), ("audit", 8, 1), ("audit cpu", 8, 1),
                          ("write", 7, 0))))
            print("  overhead (target <= +10%; 'off again' shows the noise): " + ", ".join(
                f"{name} {sums[name]['total'] / off - 1:+.1%}" for name in trails))
            print("  the audit itself, as a share of de-identification: " + ", ".join(
                f"{name} {sums[name]['audit'] / deidentify:.1%} wall, {sums[name]['audit cpu'] / deidentify_cpu:.1%} CPU"
                for name in trails))
        for name, trail in trails.items():
            print(f"{name}: {append_rates(trail)}")
            print(f"{name}: {anchor_ratio(trail)}")
            trail.close()
    finally:
        if admin is not None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            admin.dispose()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
