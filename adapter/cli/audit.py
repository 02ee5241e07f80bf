"""`deid-adapter audit verify|export`, `deid-adapter vault reidentify|reverse-fpe` and `deid-adapter keys init|rotate|list`
(the key files of pseudonyms, the audit trail and the vault: never printing a key)."""
from __future__ import annotations

import csv
import io
import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from adapter import files as fhir_files
from adapter.audit import trail as audit
from adapter.audit.trail import AuditError, AuditTrail
from adapter.audit.vault import ReidentificationDenied, Vault, VaultError, vault_url
from adapter.audit.vault import reidentify as relink
from adapter.audit.vault import decrypt as decrypt_value
from adapter.audit.vault import reverse_fpe as reverse
from adapter.cli.auditing import (
    ActorOpt,
    AuditKeyOpt,
    AuditOpt,
    VaultKeyOpt,
    open_trail,
)
from adapter.cli.common import fail
from fhir_transforms import keys

EXIT_BROKEN = 1  # audit verify: the chain does not hold

audit_app = typer.Typer(help="Verify and export the audit trail.", no_args_is_help=True)
vault_app = typer.Typer(help="The re-identification vault (off unless a command runs with --vault).", no_args_is_help=True)

VaultStoreOpt = typer.Option(None, "--vault-store", envvar="DEID_ADAPTER_VAULT", show_envvar=True,
                             help="Vault store: a SQLAlchemy URL or a SQLite path. "
                                  "Default ~/.local/state/deid-adapter/vault.sqlite.")


def _trail_for_reading(target: Optional[str], key_file: Optional[Path]) -> AuditTrail:
    if str(target).lower() == audit.OFF:
        fail("--audit off: there is no trail to read")
    return open_trail(target, key_file)


@audit_app.command("verify")
def verify(target: Optional[str] = AuditOpt, key_file: Optional[Path] = AuditKeyOpt,
           as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
           allow_empty: bool = typer.Option(False, "--allow-empty", help="A missing or empty trail is expected "
                                                                         "(a new install): exit 0 for it."),
           anchor: Optional[Path] = typer.Option(None, "--anchor", envvar="DEID_ADAPTER_AUDIT_ANCHOR",
                                                 show_envvar=True, help="The store's anchor file (default: beside a "
                                                 "SQLite store, else in the state folder).")) -> None:
    """Walk the chain; report the first broken record (changed, deleted, inserted, reordered, wrong signature, truncated),
    or a store behind its anchor or disagreeing with it (rolled back).

    Read-only: the store is opened as it is and nothing is created or written. Exit 0 when the chain holds, 1 when
    it does not or when it holds no record, 2 when the store or key cannot be read or there is no trail
    (no database file, no audit tables); --allow-empty accepts a missing or empty trail."""
    if str(target).lower() == audit.OFF:
        fail("--audit off: there is no trail to read")
    start = time.perf_counter()
    try:
        report = AuditTrail.open(target, key_file, read_only=True, anchor=anchor).verify()
    except audit.TrailMissing as e:
        if not allow_empty:
            fail(f"{e}; --allow-empty if no trail is expected")
        _say_empty(str(e), as_json)
        return
    except AuditError as e:
        fail(str(e))
    elapsed = time.perf_counter() - start
    if report.ok and report.records == 0:
        if not allow_empty:
            fail("the audit trail holds no records; --allow-empty if none are expected", EXIT_BROKEN)
        _say_empty("the audit trail holds no records", as_json)
        return
    if as_json:
        typer.echo(json.dumps({**report.to_json(), "seconds": round(elapsed, 3)}))
    elif report.ok:
        typer.echo(f"ok: {report.records} records, head checkpoint record {report.head_seq} {report.head_hash} "
                   f"({elapsed:.2f} s)")
    else:
        typer.echo(f"BROKEN at record {report.broken.seq} ({report.broken.kind}): {report.broken.message}")
    if not report.ok:
        raise typer.Exit(EXIT_BROKEN)


def _say_empty(what: str, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"ok": True, "records": 0, "empty": what}))
    else:
        typer.echo(f"ok (--allow-empty): {what}")


CSV_COLUMNS = ("seq", "time", "actor", "channel", "operation", "data_format", "profile", "rules_version", "stack",
               "key_id", "input_sha256", "output_sha256", "phi_categories", "phi_locations", "purpose", "detail")


def _csv_row(rec: dict) -> dict:
    counts: dict[str, int] = {}
    for f in rec["findings"]:
        counts[f["category"]] = counts.get(f["category"], 0) + 1
    detail = rec["detail"]
    return {**{c: rec[c] for c in CSV_COLUMNS if c in rec},
            "phi_categories": ";".join(f"{c}:{n}" for c, n in sorted(counts.items())),
            "phi_locations": len(rec["findings"]),
            "purpose": detail.get("reason", ""),
            "detail": json.dumps(detail, sort_keys=True, ensure_ascii=False) if detail else ""}


@audit_app.command("export")
def export(target: Optional[str] = AuditOpt, key_file: Optional[Path] = AuditKeyOpt,
           fmt: str = typer.Option("csv", "--format", help="csv or json."),
           output: Optional[Path] = typer.Option(None, "--out", help="Write here (default stdout)."),
           since: Optional[str] = typer.Option(None, "--since", help="From this UTC time (ISO 8601), inclusive."),
           until: Optional[str] = typer.Option(None, "--until", help="Before this UTC time (ISO 8601)."),
           operation: Optional[List[str]] = typer.Option(None, "--operation",
                                                         help="Only these operations (deidentify, refuse, review, "
                                                              "reidentify, reidentify-denied); repeatable."),
           check: bool = typer.Option(True, "--verify/--no-verify", help="Verify the chain first (default) and "
                                                                       "refuse to export a broken one.")) -> None:
    """Accounting of disclosures: one row per audit record (who, when, what, which rules and key, PHI categories found)."""
    if fmt not in ("csv", "json"):
        fail(f"--format must be csv or json, not {fmt!r}")
    trail = _trail_for_reading(target, key_file)
    try:
        if check:
            report = trail.verify()
            if not report.ok:
                fail(f"the audit chain is broken at record {report.broken.seq} ({report.broken.kind}): "
                     f"{report.broken.message}; not exporting (--no-verify to export anyway)", EXIT_BROKEN)
        rows = list(trail.export(since, until, operation or ()))
    except AuditError as e:
        fail(str(e))
    if fmt == "json":
        data = json.dumps({"records": rows, "count": len(rows)}, ensure_ascii=False, indent=1) + "\n"
    else:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(_csv_row(r) for r in rows)
        data = buf.getvalue()
    if output:
        fhir_files.write_atomic(output, data.encode())
        typer.echo(f"{len(rows)} record(s) written to {output}", err=True)
    else:
        sys.stdout.write(data)


@vault_app.command("reidentify")
def reidentify(pseudonym: str = typer.Argument(..., help="A pseudonym from a de-identified output."),
               reason: str = typer.Option(..., "--reason", help="Why (required; recorded verbatim in the audit "
                                                                "trail, so name the request, not the patient)."),
               vault_key_file: Optional[Path] = VaultKeyOpt, vault_store: Optional[str] = VaultStoreOpt,
               target: Optional[str] = AuditOpt, key_file: Optional[Path] = AuditKeyOpt,
               actor: Optional[str] = ActorOpt) -> None:
    """Return the original behind PSEUDONYM, with the vault key only; every attempt is audited first.

    Prints one JSON line per match: pseudonym, namespace, key_id (the pseudonym key), original."""
    if not reason.strip():
        fail("--reason must say why")
    trail = _trail_for_reading(target, key_file)
    ring, key_problem = _vault_ring(vault_key_file)
    try:
        store = Vault(vault_url(vault_store))
        found = relink(store, trail, pseudonym, ring, actor=actor or audit.default_actor(), reason=reason,
                       key_problem=key_problem)
    except ReidentificationDenied as e:
        fail(f"re-identification denied: {key_problem or e} (the attempt is recorded in the audit trail)")
    except (VaultError, AuditError) as e:
        fail(str(e))
    for r in found:
        typer.echo(json.dumps({"pseudonym": r.pseudonym, "namespace": r.namespace, "key_id": r.key_id,
                               "original": r.original}, ensure_ascii=False))


def _vault_ring(vault_key_file: Optional[Path]) -> tuple[list[keys.Key], str | None]:
    """The vault key ring, or none and why: an attempt without a usable key is still audited, then denied."""
    if not vault_key_file:
        return [], None
    try:
        return [k for _, k, _ in keys.key_ring(vault_key_file, "vault")], None
    except keys.KeyError_ as e:
        return [], str(e)


@vault_app.command("decrypt")
def decrypt(value: str = typer.Argument(..., help="A value an `encrypt` rule wrote (enc1.… for AES-SIV)."),
            reason: str = typer.Option(..., "--reason", help="Why (required; recorded verbatim in the audit trail, "
                                                             "so name the request, not the patient)."),
            vault_key_file: Optional[Path] = VaultKeyOpt,
            fmt: str = typer.Option("aes-siv", "--format", help="The rule's format: aes-siv or fpe."),
            alphabet: str = typer.Option("digits", "--alphabet", help="With --format fpe: the rule's alphabet."),
            keep_prefix: int = typer.Option(0, "--keep-prefix", help="With --format fpe: the rule's keep_prefix."),
            check_digit: str = typer.Option("none", "--check-digit", help="With --format fpe: the rule's check_digit."),
            target: Optional[str] = AuditOpt, audit_key_file: Optional[Path] = AuditKeyOpt,
            actor: Optional[str] = ActorOpt) -> None:
    """Return the original behind an `encrypt` value, with the vault key only; every attempt is audited first.

    Prints one JSON line: value, vault_key_id, original."""
    if not reason.strip():
        fail("--reason must say why")
    if fmt not in ("aes-siv", "fpe"):
        fail("--format is aes-siv or fpe")
    trail = _trail_for_reading(target, audit_key_file)
    ring, key_problem = _vault_ring(vault_key_file)
    options = {"format": fmt} if fmt == "aes-siv" else {
        "format": fmt, "alphabet": alphabet, "keep_prefix": keep_prefix, "check_digit": check_digit}
    try:
        original, key_id = decrypt_value(trail, value, ring, options, actor=actor or audit.default_actor(),
                                         reason=reason, key_problem=key_problem)
    except ReidentificationDenied as e:
        fail(f"re-identification denied: {key_problem or e} (the attempt is recorded in the audit trail)")
    except (VaultError, AuditError, ValueError) as e:
        fail(str(e))
    typer.echo(json.dumps({"value": value, "vault_key_id": key_id, "original": original}, ensure_ascii=False))


@vault_app.command("reverse-fpe")
def reverse_fpe(pseudonym: str = typer.Argument(..., help="An `fpe` pseudonym from a de-identified output."),
                system: str = typer.Option(..., "--system", help="The identifier's system (FHIR Identifier.system; "
                                                                 "for HL7v2 the system its CX-4 authority maps to)."),
                reason: str = typer.Option(..., "--reason", help="Why (required; recorded verbatim in the audit "
                                                                 "trail, so name the request, not the patient)."),
                key_file: Path = typer.Option(..., "--key-file", help="The pseudonym key of the output (the FPE key "
                                                                      "is derived from it)."),
                alphabet: str = typer.Option("digits", "--alphabet", help="The rule's alphabet setting."),
                keep_prefix: int = typer.Option(0, "--keep-prefix", help="The rule's keep_prefix setting."),
                check_digit: str = typer.Option("none", "--check-digit", help="The rule's check_digit setting."),
                target: Optional[str] = AuditOpt, audit_key_file: Optional[Path] = AuditKeyOpt,
                actor: Optional[str] = ActorOpt) -> None:
    """Return the original behind a format-preserving (FF3-1) pseudonym, with the key only; every attempt is audited first.

    Prints one JSON line: pseudonym, namespace, key_id (compare it with the key id the output names), original."""
    if not reason.strip():
        fail("--reason must say why")
    trail = _trail_for_reading(target, audit_key_file)
    key, key_problem = None, None
    try:
        key = keys.load_key(key_file)
    except keys.KeyError_ as e:
        key_problem = str(e)
    options = {"alphabet": alphabet, "keep_prefix": keep_prefix, "check_digit": check_digit}
    try:
        original = reverse(trail, pseudonym, system, key, options, actor=actor or audit.default_actor(), reason=reason)
    except ReidentificationDenied as e:
        fail(f"re-identification denied: {key_problem or e} (the attempt is recorded in the audit trail)")
    except (VaultError, AuditError) as e:
        fail(str(e))
    typer.echo(json.dumps({"pseudonym": pseudonym, "namespace": "identifier|" + system, "key_id": key.key_id,
                           "original": original}, ensure_ascii=False))


keys_app = typer.Typer(help="Create and inspect pseudonymization keys.", no_args_is_help=True)


@keys_app.command("init")
def keys_init(path: Path = typer.Argument(..., help="Where to write the new key (mode 0600)."),
              exist_ok: bool = typer.Option(False, "--exist-ok", help="Keep an existing key file instead of failing."),
              purpose: str = typer.Option("pseudonym", "--purpose", help="pseudonym (default), audit or vault.")) -> None:
    """Create a new random key file. The key id is printed; the key never is."""
    if exist_ok and path.exists():
        try:
            key = keys.load_key(path, purpose)
        except keys.KeyError_ as e:
            fail(str(e))
        typer.echo(f"key {key.key_id} kept at {path}")
        return
    try:
        key = keys.init_key_file(path, purpose)
    except keys.KeyError_ as e:
        fail(str(e))
    except FileExistsError:
        fail(f"{path} exists; refusing to overwrite a key (pseudonyms made with it would no longer match)")
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    typer.echo(f"key {key.key_id} written to {path}")


@keys_app.command("rotate")
def keys_rotate(path: Path = typer.Argument(..., help="The key file to rotate (any purpose).")) -> None:
    """Put a new key at PATH and keep the old one as PATH.<old key id>.

    New pseudonyms differ from the old ones, and every output names its key id, so old and new data are
    never silently joined. Keep retired keys: they verify old audit records and open old vault entries."""
    try:
        old, new, archive = keys.rotate_key_file(path)
    except keys.KeyError_ as e:
        fail(str(e))
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    typer.echo(f"key {new.key_id} written to {path}; retired key {old.key_id} kept at {archive}")


@keys_app.command("list")
def keys_list(paths: List[Path] = typer.Argument(..., help="Key files; each one's retired keys are listed too.")) -> None:
    """Key id, purpose, creation time and state of each key (never the key)."""
    for path in paths:
        try:
            purpose = keys.key_purpose(path)
            ring = keys.key_ring(path, purpose)
        except keys.KeyError_ as e:
            fail(str(e))
        for file, key, current in ring:
            try:
                created = json.loads(file.read_text()).get("created", "")
            except (OSError, ValueError):
                created = ""
            typer.echo(f"{key.key_id}\t{purpose}\t{'current' if current else 'retired'}\t{created or '-'}\t{file}")
