"""`deid-adapter hl7 IN OUT`: de-identify ER7 files (one or several messages each, batches too)."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

import typer

from adapter import files as fhir_files
from adapter.audit import trail as audit
from adapter.cli import auditing
from adapter.cli.common import (
    check_output_apart,
    EXIT_BAD_INPUT,
    EXIT_REFUSED,
    CharsetOpt,
    KeyFile,
    LlmModel,
    LlmUrl,
    ProfileOpt,
    RulesOpt,
    charset_codec,
    fail,
)
from adapter.engines import fhir_engine, profiles, with_vault_key
from fhir_transforms.errors import InputError, RecordRefused, SettingsError
from fhir_transforms.hl7v2 import stream
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from adapter import settings

SUFFIXES = (".hl7", ".txt", ".er7")


def list_inputs(root: Path) -> list[tuple[Path, Path]]:
    """(path, path relative to the input root) for a file, or every .hl7/.txt/.er7 under a folder, sorted."""
    if root.is_file():
        return [(root, Path(root.name))]
    if not root.is_dir():
        raise InputError(f"{root}: no such file or folder")
    found = sorted(p for p in root.rglob("*")
                   if p.suffix.lower() in SUFFIXES and (p.is_file() or fhir_files.is_dangling(p)))
    fhir_files.check_links(root, found)
    return [(p, p.relative_to(root)) for p in found]


def hl7(
    input: Path = typer.Argument(..., help="An ER7 file (.hl7, .txt, .er7) or a folder of them."),
    output: Path = typer.Argument(..., help="Where to write; mirrors INPUT."),
    profile: Optional[str] = ProfileOpt,
    rules: Optional[Path] = RulesOpt,
    stack: Optional[str] = typer.Option(None, "--stack", help="Text stack: patterns, no-llm, precision-first, "
                                                              "recall-first, balanced."),
    key_file: Optional[Path] = KeyFile,
    today: Optional[str] = typer.Option(None, "--today", help="Reference day for ages (YYYY-MM-DD); default: today."),
    llm_url: Optional[str] = LlmUrl,
    llm_model: Optional[str] = LlmModel,
    audit_store: Optional[str] = auditing.AuditOpt,
    audit_key_file: Optional[Path] = auditing.AuditKeyOpt,
    actor: Optional[str] = auditing.ActorOpt,
    vault_key_file: Optional[Path] = auditing.VaultKeyOpt,
    charset: Optional[str] = CharsetOpt,
) -> None:
    """De-identify HL7v2 ER7 messages into OUTPUT. Bad files are reported and skipped; the exit code says so."""
    # the arguments first, the models last: a wrong argument is answered before a model loads
    check_output_apart(input, output)
    try:
        inputs = list_inputs(input)
    except InputError as e:
        fail(str(e))
    if not inputs:
        fail(f"{input}: no .hl7, .txt or .er7 files")
    codec = charset_codec(charset)
    try:
        hl7_rules = profiles(profile, rules).hl7
    except SettingsError as e:
        fail(str(e))
    base = fhir_engine(key_file, profile, stack, False, today, settings.llm(llm_url, llm_model), rules=rules)
    engine = HL7Deidentifier(hl7_rules, base.pseudo, base.stack, base.clock, charset=codec)
    try:
        with_vault_key(base.pseudo, engine.profile.methods, vault_key_file)
    except SettingsError as e:
        fail(str(e))
    trail = auditing.open_trail(audit_store, audit_key_file)
    who = {"actor": actor or audit.default_actor(), "channel": "cli", "data_format": "hl7v2"}
    single = input.is_file()
    counts = {"written": 0, "bad_input": 0, "refused": 0, "messages": 0}
    for path, rel in inputs:
        target = (output / rel.name if output.is_dir() else output) if single else output / rel
        try:
            try:
                text = engine.read(path.read_bytes()).text
            except OSError as e:
                raise InputError(f"{e.strerror}") from None
            with tempfile.TemporaryFile() as spool:  # a file written as read (`stream.py`), published whole
                out = fhir_files.HashingWriter(spool)
                result = stream.write_file(engine, text, out)
                if trail is not None:  # durable before the output exists; one record per file
                    trail.record_deidentification(engine, input=fhir_files.text_digest(text), output=out.digest,
                                                  findings=result.findings, **who)
                fhir_files.write_atomic(target, spool)
        except audit.AuditError as e:
            fail(str(e))
        except InputError as e:
            counts["bad_input"] += 1
            typer.echo(f"bad input  {path}: {e}", err=True)
        except RecordRefused as e:
            counts["refused"] += 1
            typer.echo(f"refused  {path}: {e}", err=True)
            if trail is not None:
                trail.record_refusal(engine, input=fhir_files.text_digest(text), reason=str(e), **who)
        else:
            n = result.messages
            counts["written"] += 1
            counts["messages"] += n
            typer.echo(f"ok  {rel} ({n} message{'s' * (n != 1)})", err=True)
    typer.echo(f"{counts['written']} file(s) written to {output} ({counts['messages']} messages), "
               f"{counts['refused']} refused, {counts['bad_input']} bad input", err=True)
    if counts["bad_input"]:
        raise typer.Exit(EXIT_BAD_INPUT)
    if counts["refused"]:
        raise typer.Exit(EXIT_REFUSED)
