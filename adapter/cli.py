"""`deid-adapter`: the command line. Exit 0 ok, 2 bad usage or input, 3 refused (../shared/DESIGN.md)."""
from __future__ import annotations

import gc
import hashlib
import json
import sys
from datetime import date
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from adapter import audit_cli, fhir_files
from adapter.cli_options import KeyFile, LlmModel, LlmUrl, StackOpt
from adapter.audit import AuditError
from fhir_transforms import dates, keys
from fhir_transforms.errors import InputError, RecordRefused
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.record import Deidentifier
from fhir_transforms.rules import ProfileError, load_profile
from text_deid.stack import LlmSettings, StackUnavailable, build_stack, detector_versions

EXIT_OK, EXIT_BAD_INPUT, EXIT_REFUSED = 0, 2, 3

app = typer.Typer(help="De-identify FHIR R4 and HL7v2 under HIPAA Safe Harbor, with keyed pseudonyms.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
keys_app = typer.Typer(help="Create and inspect pseudonymization keys.", no_args_is_help=True)
text_app = typer.Typer(help="Run the text stack on JSONL notes.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(text_app, name="text")
GC_THRESHOLD = 50_000  # objects allocated between young-generation collections (Python's default: 700)


def tune_gc() -> None:
    """De-identification allocates millions of short-lived, acyclic JSON objects; with Python's default
    threshold the cycle collector ran so often that it took ~16% of the fast path (benchmarks/fhir_throughput.py)."""
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


@app.callback()
def _process_settings() -> None:
    tune_gc()


class Validation(str, Enum):
    full = "full"
    sample = "sample"
    off = "off"




def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"deid-adapter: {message}", err=True)
    raise typer.Exit(code)


def _deidentifier(key_file, profile: str, stack: Optional[str], validate: bool, today: Optional[str],
                  llm: Optional[LlmSettings] = None) -> Deidentifier:
    try:
        key = keys.load_key(key_file)
        prof = load_profile(profile)
        text_stack = build_stack(stack, llm)
        clock = (lambda d=date.fromisoformat(today): d) if today else dates.today
    except (keys.KeyError_, ProfileError, StackUnavailable, ValueError) as e:
        fail(str(e))
    return Deidentifier(prof, Pseudonymizer(key), text_stack, clock, validate)


@app.command()
def fhir(
    input: Path = typer.Argument(..., help="A Bundle or resource .json, an .ndjson file, or a folder of those."),
    output: Path = typer.Argument(..., help="Where to write; mirrors INPUT."),
    profile: str = typer.Option("safe-harbor", "--profile", help="safe-harbor (default) or longitudinal."),
    stack: Optional[str] = StackOpt,
    key_file: Optional[Path] = KeyFile,
    validate: Validation = typer.Option(Validation.full, "--validate",
                                        help="full: validate every input and output with the R4B models; "
                                             "sample: one record in 20 (trusted bulk input); off: none."),
    today: Optional[str] = typer.Option(None, "--today", help="Reference day for ages (YYYY-MM-DD); default: today."),
    llm_url: Optional[str] = LlmUrl,
    llm_model: Optional[str] = LlmModel,
    audit: Optional[str] = audit_cli.AuditOpt,
    audit_key_file: Optional[Path] = audit_cli.AuditKeyOpt,
    actor: Optional[str] = audit_cli.ActorOpt,
    vault: bool = audit_cli.VaultFlag,
    vault_key_file: Optional[Path] = audit_cli.VaultKeyOpt,
) -> None:
    """De-identify FHIR R4 input into OUTPUT. Bad files are reported and skipped; the exit code says so."""
    engine = _deidentifier(key_file, profile, stack, validate is Validation.full, today, LlmSettings(llm_url, llm_model))
    if input.resolve() == output.resolve():
        fail("OUTPUT must differ from INPUT")
    try:
        inputs = fhir_files.list_inputs(input)
    except InputError as e:
        fail(str(e))
    single = input.is_file()
    if not inputs:
        fail(f"{input}: no .json or .ndjson files")
    if not single and output.exists() and not output.is_dir():
        fail(f"{output}: exists and is not a folder (INPUT is a folder)")
    root = output if output.is_dir() or not single else None  # a folder written into: no link may lead out of it
    account = audit_cli.open_session(engine, "fhir", audit, audit_key_file, actor, vault, vault_key_file)
    counts = {"written": 0, "bad_input": 0, "refused": 0, "skipped": 0, "resources": 0}
    for path, rel in inputs:
        target = (output / rel.name if output.is_dir() else output) if single else output / rel
        try:
            if root is not None:
                fhir_files.check_inside(target, root)  # before anything is audited
            f = fhir_files.read(path, rel)
            results, audited = [], []
            for n, (res, raw) in enumerate(zip(f.resources, f.raw), 1):
                engine.validate = validate is Validation.full or (
                    validate is Validation.sample and _sampled(path, n))
                where = f"{path}: line {n}" if f.ndjson else str(path)
                result = engine.deidentify(res, where, consume=True)  # read for this call only
                results.append(result.resource)
                audited.append((raw, res["resourceType"], result.findings, where))
            data = fhir_files.serialize(results, f.ndjson)
            audit_cli.record_file(account, audited, data, f.ndjson)  # durable before the output exists
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
        except RecordRefused as e:
            account.refused(raw, str(e), where, res.get("resourceType", ""))
            try:
                account.commit()
            except AuditError as audit_error:
                fail(str(audit_error))
            counts["refused"] += 1
            typer.echo(f"refused  {e}", err=True)
        else:
            counts["written"] += 1
            counts["resources"] += len(results)
            typer.echo(f"ok  {rel} ({len(results)} resource{'s' * (len(results) != 1)})", err=True)
    typer.echo(
        f"{counts['written']} file(s) written to {output} ({counts['resources']} resource(s)), "
        f"{counts['refused']} refused, {counts['bad_input']} bad input, {counts['skipped']} skipped (no resources)",
        err=True,
    )
    if counts["bad_input"]:
        raise typer.Exit(EXIT_BAD_INPUT)
    if counts["refused"]:
        raise typer.Exit(EXIT_REFUSED)
    if not counts["written"]:
        fail("nothing to write: no input file held FHIR resources")


def _sampled(path: Path, n: int) -> bool:
    """Deterministic 1-in-20 sample, so a rerun validates the same records."""
    return hashlib.sha256(f"{path.name}:{n}".encode()).digest()[0] % 20 == 0


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


def _read_jsonl(path: Optional[Path]) -> list[dict]:
    stream = path.open(encoding="utf-8") if path else sys.stdin
    records = []
    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{path or 'stdin'}: line {n}: invalid JSON: {e.msg}")
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or not isinstance(rec.get("text"), str):
            fail(f"{path or 'stdin'}: line {n}: each line needs a string id and a string text")
        records.append(rec)
    return records


def _known(rec: dict):
    from text_deid.spans import KnownIdentifier

    return [KnownIdentifier(k["value"], k["category"]) for k in rec.get("known") or []
            if isinstance(k, dict) and isinstance(k.get("value"), str) and isinstance(k.get("category"), str)]


def _text_stack(stack_name: Optional[str], llm: LlmSettings):
    try:
        return build_stack(stack_name, llm)
    except StackUnavailable as e:
        fail(str(e))


def _text_results(stack, records, build):
    from text_deid.spans import DetectorError

    out = []
    for rec in records:
        try:
            spans = stack.detect(rec["text"], _known(rec))
        except DetectorError as e:
            fail(f"record {rec['id']}: refused: {e}", EXIT_REFUSED)
        out.append(build(rec, spans))
    return out


def _write_jsonl(rows: list[dict], path: Optional[Path]) -> None:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if path:
        fhir_files.write_atomic(path, data.encode())
    else:
        sys.stdout.write(data)


@text_app.command("detect")
def text_detect(stack: Optional[str] = StackOpt, input: Optional[Path] = typer.Option(None, "--in"),
                output: Optional[Path] = typer.Option(None, "--out"), llm_url: Optional[str] = LlmUrl,
                llm_model: Optional[str] = LlmModel) -> None:
    """JSONL {id, text, known?} in; JSONL {id, spans} out (offsets and categories, never text)."""
    rows = _text_results(_text_stack(stack, LlmSettings(llm_url, llm_model)), _read_jsonl(input),
                         lambda rec, spans: {"id": rec["id"], "spans": [s.to_json() for s in spans]})
    _write_jsonl(rows, output)


@text_app.command("redact")
def text_redact(stack: Optional[str] = StackOpt, surrogates: bool = typer.Option(False, "--surrogates"),
                input: Optional[Path] = typer.Option(None, "--in"), output: Optional[Path] = typer.Option(None, "--out"),
                key_file: Optional[Path] = KeyFile, llm_url: Optional[str] = LlmUrl,
                llm_model: Optional[str] = LlmModel) -> None:
    """JSONL in; JSONL {id, text} out with [CATEGORY] tags, or keyed surrogates with --surrogates."""
    from text_deid import replace

    replacement = replace.tag
    if surrogates:
        from text_deid.surrogates import Surrogates

        try:
            replacement = Surrogates(Pseudonymizer(keys.load_key(key_file)))
        except keys.KeyError_ as e:
            fail(str(e))
    rows = _text_results(_text_stack(stack, LlmSettings(llm_url, llm_model)), _read_jsonl(input),
                         lambda rec, spans: {"id": rec["id"], "text": replace.apply(rec["text"], spans, replacement)})
    _write_jsonl(rows, output)


@app.command("eval")
def eval_(gold: Path = typer.Argument(..., help="Gold JSONL: {id, text, spans:[{start,end,category}]}"),
          stack: Optional[str] = StackOpt, as_json: bool = typer.Option(False, "--json"),
          compare: Optional[str] = typer.Option(None, "--compare", metavar="OTHER",
                                                help="Second stack: paired differences (STACK - OTHER) on the same resamples."),
          llm_url: Optional[str] = LlmUrl, llm_model: Optional[str] = LlmModel) -> None:
    """Span recall and precision, character recall, over-redaction and strict F1, with 95% bootstrap intervals.
    Prints counts and rates only, never note text."""
    from text_deid import evaluation

    try:
        records = evaluation.load_jsonl(gold)
    except (OSError, ValueError) as e:
        fail(str(e))
    llm = LlmSettings(llm_url, llm_model)
    text_stack = _text_stack(stack, llm)
    name = text_stack.name
    predicted = dict(_text_results(text_stack, records, lambda rec, spans: (rec["id"], [s.to_json() for s in spans])))
    try:
        result = evaluation.evaluate(records, predicted)
        if compare:
            other = dict(_text_results(_text_stack(compare, llm), records,
                                       lambda rec, spans: (rec["id"], [s.to_json() for s in spans])))
            result = {"stack": name, "compare": compare, name: result, compare: evaluation.evaluate(records, other),
                      "paired": evaluation.compare(records, predicted, other)}
    except ValueError as e:
        fail(f"{gold}: {e}")
    if not compare:
        result["stack"] = name
        result["detectors"] = detector_versions(text_stack)  # the prompt's version and hash, for LLM stacks
        typer.echo(json.dumps(result, indent=2) if as_json else evaluation.format_table(result) + "".join(
            f"{d}: model {v['model']}, prompts {v['prompt_version']}\n"
            for d, v in result["detectors"].items() if "prompt_version" in v))
    elif as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(f"Stack {name}\n" + evaluation.format_table(result[name]) + f"\nStack {compare}\n"
                   + evaluation.format_table(result[compare]) + "\n"
                   + evaluation.format_comparison(result["paired"], name, compare))


# The HL7v2 edge's commands live in their own modules; registered last because they reuse this module's helpers.
from adapter import hl7_cli, mllp_cli  # noqa: E402

app.command("hl7")(hl7_cli.hl7)
app.command("mllp")(mllp_cli.mllp)
from adapter import service_cli  # noqa: E402

app.command("serve")(service_cli.serve)
app.add_typer(service_cli.tokens_app, name="tokens")
app.add_typer(service_cli.conformance_app, name="conformance")
from adapter import bulk_cli  # noqa: E402

app.command("bulk")(bulk_cli.bulk)
from adapter import risk_cli; app.command("risk")(risk_cli.risk_command)  # noqa: E402,E702

app.add_typer(audit_cli.audit_app, name="audit")
app.add_typer(audit_cli.vault_app, name="vault")
keys_app.command("rotate")(audit_cli.keys_rotate)
keys_app.command("list")(audit_cli.keys_list)
from adapter import review_cli; app.add_typer(review_cli.review_app, name="review")  # noqa: E402,E702


def main() -> None:
    app()


if __name__ == "__main__":
    main()
