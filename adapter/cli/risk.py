"""`deid-adapter risk`: the re-identification risk and compliance report of a release. Registered in adapter/cli/main.py.

Exit 0 when the report is written (whatever its verdict, unless --fail-under), 1 when a --fail-under check
fails, 2 on bad usage or input (nothing written), 3 when the text stack refuses a gold note.
"""
from __future__ import annotations

import json
import sys
import types
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

import typer

from adapter.audit import trail as audit
from adapter.audit.trail import _adapter_version, engine_versions
from adapter.cli.common import LlmModel, LlmUrl, fail, known_from_json
from adapter.risk import measures as risk
from adapter.risk import report as risk_report
from fhir_transforms.hl7v2.rules import load_hl7_profile
from text_deid import evaluation
from text_deid.spans import DetectorError
from text_deid.stack import StackUnavailable
from adapter import settings
from adapter.engines import text_stack

EXIT_THRESHOLD = 1
EXIT_REFUSED = 3
StackOpt = typer.Option(None, "--stack", help="Text stack for the gold sample: patterns, no-llm, precision-first, "
                                              "recall-first, balanced (use the one the release was made with).")


def risk_command(
    release_dir: Path = typer.Argument(..., metavar="OUT_DIR",
                                       help="A de-identified FHIR export (bundles or NDJSON) or HL7v2 folder."),
    quasi: str = typer.Option(",".join(risk.DEFAULT_QUASI), "--quasi",
                              help=f"Quasi-identifiers, comma separated, from: {', '.join(risk.QUASI_IDENTIFIERS)}."),
    k: int = typer.Option(5, "--k", min=1, help="Target k: classes smaller than this count as at risk."),
    sensitive: str = typer.Option("condition", "--sensitive",
                                  help="Sensitive attribute for l-diversity: condition (Condition.code, DG1-3) or none."),
    population: Optional[int] = typer.Option(None, "--population", min=1,
                                             help="Size of the population the release was drawn from (journalist and "
                                                  "marketer risks); default: the release is the whole population."),
    gold: Optional[Path] = typer.Option(None, "--gold",
                                        help="Gold-annotated JSONL of the site's own notes: residual PHI estimate."),
    stack: Optional[str] = StackOpt,
    report: Optional[Path] = typer.Option(None, "--report", help="Write the HTML report here and the JSON beside it "
                                                                 "(same name, .json); default: JSON on stdout."),
    fail_under: Optional[List[str]] = typer.Option(None, "--fail-under", metavar="CHECKS",
                                                   help="Checks such as 'k_anonymity>=5,prosecutor_max<=0.2,"
                                                        "residual_phi_chars_upper<=100' (repeatable): exit 1 if one fails. "
                                                        f"Metrics: {', '.join(risk.METRIC_NAMES)}."),
    audit_store: Optional[str] = typer.Option(None, "--audit", envvar="DEID_ADAPTER_AUDIT", show_envvar=True,
                                              help="Audit store the release was recorded in (URL or SQLite path); "
                                                   "default ~/.local/state/deid-adapter/audit.sqlite if it exists."),
    audit_key_file: Optional[Path] = typer.Option(None, "--audit-key-file", envvar="DEID_ADAPTER_AUDIT_KEY_FILE",
                                                  show_envvar=True, help="Audit key, to verify the trail."),
    llm_url: Optional[str] = LlmUrl,
    llm_model: Optional[str] = LlmModel,
) -> None:
    """Re-identification risk (k-anonymity, l-diversity, prosecutor/journalist/marketer), residual PHI and versions.

    Figures only: no value, code or text of the release is written to the report."""
    names = [q.strip() for q in quasi.split(",") if q.strip()]
    unknown = [q for q in names if q not in risk.QUASI_IDENTIFIERS]
    if unknown or not names:
        fail(f"--quasi: unknown quasi-identifier(s) {', '.join(unknown) or '(none given)'} "
             f"(known: {', '.join(risk.QUASI_IDENTIFIERS)})")
    if sensitive not in risk.SENSITIVE_ATTRIBUTES:
        fail(f"--sensitive: {sensitive!r} is not one of {', '.join(risk.SENSITIVE_ATTRIBUTES)}")
    try:
        thresholds = [risk.Threshold("k_anonymity", ">=", k)] + risk.parse_thresholds(fail_under or [])
    except ValueError as e:
        fail(str(e))
    if report and report.suffix.lower() == ".json":
        fail("--report names the HTML file; the JSON is written beside it")
    gold_records = _load_gold(gold) if gold else None
    try:
        release = risk.read_release(release_dir)
    except risk.ReleaseError as e:
        fail(str(e))
    typer.echo(f"read {release.files} file(s), {release.items} {'resources' if release.format == 'fhir' else 'messages'}, "
               f"{len(release.rows)} patients", err=True)

    figures = {"generated": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    figures.update(risk.analyze(risk.Table.from_release(release, names), k, population, sensitive))
    figures["release"] = {"format": release.format, "files": release.files, "items": release.items,
                          "narrative_chars": release.narrative_chars, "unreadable_files": release.unreadable_files,
                          "key_ids": sorted(release.key_ids), "profiles": sorted(release.profiles)}
    figures["audit"] = audit_coverage(release, audit_store, audit_key_file)
    if gold_records is not None:
        figures["residual_phi"] = _residual(gold_records, stack, release.narrative_chars, gold, llm_url, llm_model)
    figures["versions"] = _versions(release, figures)
    figures["thresholds"] = risk.check(thresholds, figures)
    figures["verdict"] = "pass" if all(c["passed"] for c in figures["thresholds"]) else "fail"

    if report:
        try:
            risk_report.write_json(figures, report.with_suffix(".json"))
            risk_report.write_html(figures, report)
        except OSError as e:
            fail(f"{report}: {e.strerror}")
        typer.echo(f"report written to {report} and {report.with_suffix('.json')}", err=True)
    else:
        sys.stdout.write(json.dumps(figures, indent=2) + "\n")
    said = set()  # --k's check and a --fail-under gate on the same figure are one result: said once
    for c in figures["thresholds"]:
        if (c["check"], c["passed"]) not in said:
            said.add((c["check"], c["passed"]))
            typer.echo(f"{'pass' if c['passed'] else 'FAIL'}  {c['check']}  (value {c['value']})", err=True)
    gates = figures["thresholds"][1:]
    failed_gates = [c for c in gates if not c["passed"]]
    typer.echo(f"{len(release.rows)} patient(s), k-anonymity {figures['k_anonymity']}, prosecutor risk at most "
               f"{figures['risks']['prosecutor_max']:g}; " + (f"{len(failed_gates)} of {len(gates)} --fail-under "
                                                              "check(s) failed" if gates else "no --fail-under check"),
               err=True)
    if failed_gates:
        raise typer.Exit(EXIT_THRESHOLD)


def _load_gold(path: Path) -> list[dict]:
    try:
        return evaluation.load_jsonl(path)
    except (OSError, ValueError) as e:
        fail(str(e))


def _residual(records: list[dict], stack_name: Optional[str], narrative_chars: int, gold: Path,
              llm_url: Optional[str] = None, llm_model: Optional[str] = None) -> dict:
    try:
        stack = text_stack(stack_name, settings.llm(llm_url, llm_model))
    except StackUnavailable as e:
        fail(str(e))
    predicted = {}
    for rec in records:
        if not isinstance(rec.get("id"), str) or not isinstance(rec.get("text"), str):
            fail(f"{gold}: each line needs a string id and a string text")
        try:
            predicted[rec["id"]] = [s.to_json() for s in stack.detect(rec["text"], known_from_json(rec))]
        except DetectorError as e:
            fail(f"{gold}: record {rec['id']}: refused: {e}", EXIT_REFUSED)
    try:
        result = risk.residual_phi(records, predicted, narrative_chars)
    except ValueError as e:
        fail(f"{gold}: {e}")
    result["stack"] = stack.name
    result["stack_versions"] = _stack_versions(stack)
    return result


def _stack_versions(stack) -> dict:
    return engine_versions(types.SimpleNamespace(stack=stack))["versions"]["detectors"]


def _versions(release: risk.Release, figures: dict) -> dict:
    """Adapter, profile/rules, stack, detector/model/prompt versions and key ids, from the release and its audit trail."""
    audit = figures["audit"]
    out = {"deid-adapter": _adapter_version(),
           "profile": sorted(release.profiles) or ["unknown"],
           "key_id": sorted(release.key_ids) or ["unknown"]}
    if release.format == "hl7v2":
        out["hl7v2_profile_versions"] = _hl7_profile_versions(release.profiles)
    recorded = audit.get("recorded_with") or []
    out["rules_version"] = sorted({r["rules_version"] for r in recorded}) or ["not in the audit trail"]
    out["release_stack"] = sorted({r["stack"] for r in recorded}) or ["not in the audit trail"]
    out["release_detectors"] = [r["versions"] for r in recorded] or "not in the audit trail"
    if figures.get("residual_phi"):
        out["evaluated_stack"] = figures["residual_phi"]["stack"]
        out["evaluated_detectors"] = figures["residual_phi"]["stack_versions"]
    return out


def _hl7_profile_versions(profiles) -> dict:
    out = {}
    for name in profiles:
        try:
            out[name] = f"{load_hl7_profile(name).version} (installed; MSH-8 names the profile, not its version)"
        except Exception:  # an unknown profile name is reported, not fatal: the report is still evidence
            out[name] = "unknown"
    return out


def audit_coverage(release: risk.Release, target: Optional[str], key_file: Optional[Path]) -> dict:
    """The audit records whose output hash is an output of this release: sequence and time range, chain check.

    Degrades to a status line when there is no store or the store cannot be read.
    """
    total = release.output_records
    if target and str(target).lower() == "off":
        return {"status": "not read (--audit off)", "release_records": total}
    if not target and not settings.audit_store() and not (audit.state_dir() / "audit.sqlite").exists():
        return {"status": "no audit store found (pass --audit)", "release_records": total}
    if not key_file and not settings.audit_key_file() and not (audit.state_dir() / "audit.key").exists():
        return {"status": "no audit key found (pass --audit-key-file)", "release_records": total}
    try:
        trail = audit.AuditTrail.open(target, key_file)
        try:
            verified = trail.verify()
            seqs, times, recorded, found = [], [], {}, set()
            for rec in trail.export(operations=("deidentify",)):
                if rec["output_sha256"] in release.output_hashes:
                    found.add(release.output_hashes[rec["output_sha256"]])
                    seqs.append(rec["seq"])
                    times.append(rec["time"])
                    sig = (rec["profile"], rec["rules_version"], rec["stack"], rec["key_id"],
                           json.dumps(rec["versions"], sort_keys=True))
                    recorded[sig] = {"profile": rec["profile"], "rules_version": rec["rules_version"],
                                     "stack": rec["stack"], "key_id": rec["key_id"], "versions": rec["versions"]}
        finally:
            trail.close()
    except Exception as e:  # noqa: BLE001 - any failure of another component's store degrades to a status line
        return {"status": f"audit trail not read: {type(e).__name__}", "release_records": total}
    return {
        "status": "read",
        "store": trail.display_url,
        "chain_verified": verified.ok,
        "release_records": total,
        "release_records_in_trail": len(found),
        "release_records_not_in_trail": total - len(found),
        "audit_records_matched": len(seqs),
        "first_seq": min(seqs) if seqs else None,
        "last_seq": max(seqs) if seqs else None,
        "first_time": min(times) if times else None,
        "last_time": max(times) if times else None,
        "recorded_with": list(recorded.values()),
    }
