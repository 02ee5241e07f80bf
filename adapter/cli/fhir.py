"""`deid-adapter fhir`: de-identify FHIR R4 and R5 files and folders."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import typer

from adapter import files as fhir_files
from adapter.audit.trail import AuditError
from adapter.cli import auditing
from adapter.cli.common import (
    check_output_apart,
    EXIT_BAD_INPUT,
    EXIT_REFUSED,
    FhirVersionOpt,
    FhirVersion,
    KeyFile,
    LlmModel,
    LlmUrl,
    ProfileOpt,
    RulesOpt,
    StackOpt,
    Validation,
    fail,
)
from adapter.engines import fhir_engine
from adapter.release import gathered
from fhir_transforms.r4 import stream
from fhir_transforms.errors import InputError, RecordRefused
from adapter import settings

# A Bundle file this size or larger is de-identified entry by entry with validation off (fhir_transforms/r4/stream.py):
# memory stays within a small multiple of the file. Smaller ones are done whole, which reads the entries once
# rather than three times: on the shared Synthea bundles (0.2-1.5 MB) streaming cost ~2.5x the CPU of the engine.
STREAM_FROM_BYTES = 8 * 1024 * 1024


def fhir(
    input: Path = typer.Argument(..., help="A Bundle or resource .json, an .ndjson file, or a folder of those."),
    output: Path = typer.Argument(..., help="Where to write; mirrors INPUT."),
    profile: Optional[str] = ProfileOpt,
    rules: Optional[Path] = RulesOpt,
    stack: Optional[str] = StackOpt,
    key_file: Optional[Path] = KeyFile,
    validate: Validation = typer.Option(Validation.full, "--validate",
                                        help="full: validate every input and output with its version's models (R4B's for R4); "
                                             "sample: one record in 20 (trusted bulk input); off: none."),
    today: Optional[str] = typer.Option(None, "--today", help="Reference day for ages (YYYY-MM-DD); default: today."),
    fhir_version: FhirVersion = FhirVersionOpt,
    llm_url: Optional[str] = LlmUrl,
    llm_model: Optional[str] = LlmModel,
    audit: Optional[str] = auditing.AuditOpt,
    audit_key_file: Optional[Path] = auditing.AuditKeyOpt,
    actor: Optional[str] = auditing.ActorOpt,
    vault: bool = auditing.VaultFlag,
    vault_key_file: Optional[Path] = auditing.VaultKeyOpt,
    keep_file_names: bool = typer.Option(False, "--keep-file-names",
                                         help="Keep each input file's name even where it holds a known identifier of "
                                              "its record (default: such a file is named by a keyed pseudonym)."),
) -> None:
    """De-identify FHIR R4 or R5 input into OUTPUT. Bad files are reported and skipped; the exit code says so."""
    # the arguments first, the models last: a wrong argument is answered before a model loads
    check_output_apart(input, output)
    try:
        inputs = fhir_files.list_inputs(input)
        if validate is Validation.full:
            fhir_files.check_validation_size(inputs)
    except InputError as e:
        fail(str(e))
    single = input.is_file()
    if not inputs:
        fail(f"{input}: no .json or .ndjson files")
    if not single and output.exists() and not output.is_dir():
        fail(f"{output}: exists and is not a folder (INPUT is a folder)")
    engine = fhir_engine(key_file, profile, stack, validate is Validation.full, today, settings.llm(llm_url, llm_model),
                         vault_key_file, fhir_version.value, rules)
    root = output if output.is_dir() or not single else None  # a folder written into: no link may lead out of it
    account = auditing.open_session(engine, "fhir", audit, audit_key_file, actor, vault, vault_key_file)
    # the NDJSON inputs are one release (a bulk export): every patient's identifiers are looked for in every line
    ndjson = [path for path, _ in inputs if path.suffix == ".ndjson"]
    release = gathered(ndjson, engine) if ndjson else None
    counts = {"written": 0, "bad_input": 0, "refused": 0, "skipped": 0, "resources": 0, "bundles": 0, "in_bundles": 0,
              "refused_lines": 0}
    for path, rel in inputs:
        engine.release = None
        target = (output / rel.name if output.is_dir() else output) if single else output / rel
        try:
            if root is not None:
                fhir_files.check_inside(target, root)  # before anything is audited
            if (entries := _stream(engine, path, validate, account, target, root, rel, keep_file_names)) is not None:
                counts["written"] += 1
                counts["bundles"] += 1
                counts["in_bundles"] += entries
                continue
            if path.suffix == ".ndjson":
                engine.release = release
                written, refused_lines = _ndjson(engine, path, rel, target, root, validate, account, keep_file_names)
                counts["refused_lines"] += refused_lines
                counts["written"] += written is not None
                counts["resources"] += written or 0
                continue
            f = fhir_files.read(path, rel)
            results, audited, refused, known = _deidentify_file(engine, f, validate)
            if not keep_file_names:
                target = fhir_files.private_name(target, known, engine.pseudo)
            data = fhir_files.serialize(results, f.ndjson)
            auditing.record_file(account, audited, data, f.ndjson)  # durable before the output exists
            fhir_files.write_atomic(target, data, root)
        except AuditError as e:
            fail(str(e))
        except fhir_files.NoResources as e:
            counts["skipped"] += 1
            typer.echo(f"skipped  {e}", err=True)
        except InputError as e:
            account.discard()
            counts["bad_input"] += 1
            typer.echo(f"bad input  {e}", err=True)
        except _Refused as e:  # a Bundle read entry by entry: refused and audited, nothing written
            counts["refused"] += 1
            typer.echo(f"refused  {e.args[0]}", err=True)
        except RecordRefused as e:  # a Bundle or resource file: all or nothing
            account.refused(f.raw[0], str(e), str(path), f.resources[0].get("resourceType", ""))
            try:
                account.commit()
            except AuditError as audit_error:
                fail(str(audit_error))
            counts["refused"] += 1
            typer.echo(f"refused  {e}", err=True)
        else:
            counts["written"] += 1
            bundles = [len(_entries(r)) for r in results if r.get("resourceType") == "Bundle"]
            counts["bundles"] += len(bundles)
            counts["in_bundles"] += sum(bundles)
            counts["resources"] += len(results) - len(bundles)
            typer.echo(f"ok  {rel} ({_held(len(results) - len(bundles), len(bundles), sum(bundles))})", err=True)
    typer.echo(
        f"{counts['written']} file(s) written to {output} "
        f"({_held(counts['resources'], counts['bundles'], counts['in_bundles'])}), "
        f"{counts['refused']} refused, {counts['bad_input']} bad input, {counts['skipped']} skipped (no resources)"
        + (f", {counts['refused_lines']} NDJSON line(s) refused" if counts["refused_lines"] else ""),
        err=True,
    )
    if counts["bad_input"]:
        raise typer.Exit(EXIT_BAD_INPUT)
    if counts["refused"] or counts["refused_lines"]:
        raise typer.Exit(EXIT_REFUSED)
    if not counts["written"]:
        fail("nothing to write: no input file held FHIR resources")


def _entries(bundle: dict) -> list:
    return [e for e in bundle.get("entry") or [] if isinstance(e, dict) and e.get("resource")]


def _held(alone: int, bundles: int, in_bundles: int) -> str:
    """What files held: resources on their own and in Bundles, a Bundle counted by its entries' resources."""
    parts = [f"{alone} resource(s)"] if alone or not bundles else []
    if bundles:
        parts.append(f"{in_bundles} resource(s) in {bundles} Bundle(s)")
    return ", ".join(parts)


def _stream(engine, path: Path, validate: Validation, account, target: Path, root, rel: Path,
            keep_file_names: bool) -> int | None:
    """A .json Bundle with validation off, de-identified entry by entry (fhir_transforms/r4/stream.py) to the same
    bytes as the whole-record path, without holding it whole: the number of its entries written; None for anything
    else (read and done as usual).
    RecordRefused and InputError propagate as from that path, with nothing written."""
    engine.validate = validate is Validation.full or (validate is Validation.sample and _sampled(path, 1))
    if engine.validate or path.suffix != ".json" or path.stat().st_size < STREAM_FROM_BYTES:
        return None
    bundle = fhir_files.read_bundle(path)
    if bundle is None or not stream.streamable(engine, bundle.header):
        return None
    writer = fhir_files.EntryWriter(target, root)
    try:
        try:
            result, before = stream.deidentify_entries(engine, bundle.header, bundle.before, bundle.entries,
                                                       writer.add, str(path))
        except RecordRefused as e:
            account.refused(bundle.digest, str(e), str(path), "Bundle")
            try:
                account.commit()
            except AuditError as audit_error:
                fail(str(audit_error))
            raise _Refused(e) from None
        del bundle.text
        if not keep_file_names:
            writer.target = fhir_files.private_name(target, result.known, engine.pseudo)
        digest = writer.finish(result.resource, before)
        account.deidentified(bundle.digest, digest, result.findings, str(path), "Bundle")
        account.commit()  # durable before the output exists
        writer.publish()
    finally:
        writer.discard()
    typer.echo(f"ok  {rel} ({_held(0, 1, writer.count)})", err=True)
    return writer.count


class _Refused(Exception):
    pass


def _ndjson(engine, path: Path, rel: Path, target: Path, root, validate: Validation, account,
            keep_file_names: bool) -> tuple[int | None, int]:
    """An NDJSON file de-identified a line at a time, its output written as it goes to a temporary file that is
    renamed into place at the end (nothing partial is published): memory stays that of a line, whatever the
    file's size. A line refused is audited and reported, and the file written without it: (resources written,
    or None where no line was left; lines refused). InputError (any line) and AuditError propagate, nothing written."""
    refused: list = []
    writer, count, named = _ndjson_pass(engine, path, target, root, validate, account, frozenset(), refused)
    try:
        if refused:  # their neighbours are written, these are listed
            writer.discard()
            account.discard()  # the audit rows and pseudonyms pending include the refused lines'
            for n, raw, reason, where, rtype in refused:
                account.refused(raw, reason, where, rtype)  # replaces what is pending: one at a time
                account.commit()
                typer.echo(f"refused  {reason}", err=True)
            if not count:
                return None, len(refused)
            again: list = []  # the same output again, its audit rows and vault entries only
            writer, count, named = _ndjson_pass(engine, path, target, root, validate, account,
                                                frozenset(n for n, *_ in refused), again)
            if again:
                raise RecordRefused(f"{path}: a line was refused on the second reading only (a bug; nothing written)")
        if named and not keep_file_names:
            target = fhir_files.pseudonymous_name(target, engine.pseudo)
        account.commit()  # durable before the output exists
        writer.publish(target)
    finally:
        writer.discard()
    typer.echo(f"ok  {rel} ({count} resource{'s' * (count != 1)})", err=True)
    return count, len(refused)


def _ndjson_pass(engine, path: Path, target: Path, root, validate: Validation, account, skip: frozenset[int],
                 refused: list) -> tuple[fhir_files.LinesWriter, int, bool]:
    """One reading of an NDJSON file (but the lines in `skip`): (its output, not yet in place; the resources
    written; whether the file name holds a known identifier of them). Each line written is audited (pending);
    each refused is listed in `refused` as (line, bytes, reason, where, resourceType)."""
    writer = fhir_files.LinesWriter(target, root)
    name_words = fhir_files.file_name_words(target)
    count, named, seen, untyped = 0, False, 0, 0
    try:
        for n, raw, res in fhir_files.ndjson_records(path, skip):
            seen += 1
            if "resourceType" not in res:
                untyped = untyped or seen
                continue
            rtype = res["resourceType"]
            engine.validate = validate is Validation.full or (validate is Validation.sample and _sampled(path, n))
            where = f"{path}: line {n}"
            try:
                result = engine.deidentify(res, where, consume=True)  # read for this call only
            except RecordRefused as e:
                refused.append((n, raw, str(e), where, rtype))
                continue
            line = fhir_files.compact(result.resource)
            writer.add(line)
            account.deidentified(raw, line, result.findings, where, rtype)  # the output line without its newline
            named = named or fhir_files.names_file(name_words, result.known)
            count += 1
        if untyped and not count and not refused:  # (a bulk client's log.ndjson)
            raise fhir_files.NoResources(f"{path}: holds no FHIR resources (no line has a resourceType); skipped")
        if untyped:
            raise InputError(f"{path}: resource {untyped} has no resourceType")
    except BaseException:
        writer.discard()
        raise
    return writer, count, named


def _deidentify_file(engine, f: fhir_files.FhirFile, validate: Validation) -> tuple[list, list, list, set]:
    """De-identify a file's records: (outputs, audit rows, refused, the records' known identifiers). A Bundle or
    resource file is one record (RecordRefused propagates); an NDJSON line refused is listed as (line, raw, reason,
    where, resourceType)."""
    results, audited, refused, known = [], [], [], set()
    for n, res, raw in zip(f.lines, f.resources, f.raw):
        engine.validate = validate is Validation.full or (validate is Validation.sample and _sampled(f.path, n))
        where = f"{f.path}: line {n}" if f.ndjson else str(f.path)
        try:
            result = engine.deidentify(res, where, consume=True)  # read for this call only
        except RecordRefused as e:
            if not f.ndjson:
                raise
            refused.append((n, raw, str(e), where, res.get("resourceType", "")))
            continue
        results.append(result.resource)
        known.update(result.known)
        audited.append((raw, res["resourceType"], result.findings, where))
    return results, audited, refused, known


def _sampled(path: Path, n: int) -> bool:
    """Deterministic 1-in-20 sample, so a rerun validates the same records."""
    return hashlib.sha256(f"{path.name}:{n}".encode()).digest()[0] % 20 == 0


