"""`deid-adapter text detect|redact` and `deid-adapter eval`: the text stack on JSONL notes."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from adapter import files as fhir_files
from adapter import json_input
from adapter.cli.common import (
    EXIT_REFUSED,
    KeyFile,
    LlmModel,
    LlmUrl,
    StackOpt,
    fail,
    known_from_json,
)
from fhir_transforms import keys
from fhir_transforms.pseudonym import Pseudonymizer
from text_deid import evaluation, replace
from text_deid.spans import DetectorError
from text_deid.stack import (
    LlmSettings,
    StackUnavailable,
    detector_versions,
)
from text_deid.surrogates import Surrogates
from adapter.engines import text_stack
from adapter import settings

text_app = typer.Typer(help="Run the text stack on JSONL notes.", no_args_is_help=True)


def _read_jsonl(path: Optional[Path]) -> list[dict]:
    stream = path.open(encoding="utf-8") if path else sys.stdin
    records = []
    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            rec = json_input.loads(line)
        except json_input.JsonInputError as e:
            fail(f"{path or 'stdin'}: line {n}: {e}")
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or not isinstance(rec.get("text"), str):
            fail(f"{path or 'stdin'}: line {n}: each line needs a string id and a string text")
        records.append(rec)
    return records


def _text_stack(stack_name: Optional[str], llm: LlmSettings):
    try:
        return text_stack(stack_name, llm)
    except StackUnavailable as e:
        fail(str(e))


def _text_results(stack, records, build):
    """The rows `build` makes of each record and its spans, and how many spans were found in all."""
    out, found = [], 0
    for rec in records:
        try:
            spans = stack.detect(rec["text"], known_from_json(rec))
        except DetectorError as e:
            fail(f"record {rec['id']}: refused: {e}", EXIT_REFUSED)
        out.append(build(rec, spans))
        found += len(spans)
    return out, found


def _summary(rows: list, done: str, output: Optional[Path], stack, found: int, what: str) -> None:
    """The command's last line, on stderr: notes, where they went, the stack and the spans (counts only)."""
    typer.echo(f"{len(rows)} note(s) {done} {output or 'stdout'} (stack {stack.name}): {found} span(s) {what}",
               err=True)


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
    chosen = _text_stack(stack, settings.llm(llm_url, llm_model))
    rows, found = _text_results(chosen, _read_jsonl(input),
                                lambda rec, spans: {"id": rec["id"], "spans": [s.to_json() for s in spans]})
    _write_jsonl(rows, output)
    _summary(rows, "read, their spans written to", output, chosen, found, "found")


@text_app.command("redact")
def text_redact(stack: Optional[str] = StackOpt, surrogates: bool = typer.Option(False, "--surrogates"),
                input: Optional[Path] = typer.Option(None, "--in"), output: Optional[Path] = typer.Option(None, "--out"),
                key_file: Optional[Path] = KeyFile, llm_url: Optional[str] = LlmUrl,
                llm_model: Optional[str] = LlmModel) -> None:
    """JSONL in; JSONL {id, text} out with [CATEGORY] tags, or keyed surrogates with --surrogates."""
    replacement = replace.tag
    if surrogates:
        try:
            replacement = Surrogates(Pseudonymizer(keys.load_key(key_file)))
        except keys.KeyError_ as e:
            fail(str(e))
    chosen = _text_stack(stack, settings.llm(llm_url, llm_model))
    rows, found = _text_results(chosen, _read_jsonl(input),
                                lambda rec, spans: {"id": rec["id"], "text": replace.apply(rec["text"], spans, replacement)})
    _write_jsonl(rows, output)
    _summary(rows, "redacted to", output, chosen, found, "surrogates" if surrogates else "tagged")


def eval_(gold: Path = typer.Argument(..., help="Gold JSONL: {id, text, spans:[{start,end,category}]}"),
          stack: Optional[str] = StackOpt, as_json: bool = typer.Option(False, "--json"),
          compare: Optional[str] = typer.Option(None, "--compare", metavar="OTHER",
                                                help="Second stack: paired differences (STACK - OTHER) on the same resamples."),
          cluster: Optional[str] = typer.Option(None, "--cluster", metavar="FIELD",
                                                help="Bootstrap over groups of lines sharing this field's value "
                                                     "(e.g. template), not over lines."),
          llm_url: Optional[str] = LlmUrl, llm_model: Optional[str] = LlmModel) -> None:
    """Span recall and precision, character recall, over-redaction and strict F1, with 95% bootstrap intervals.
    Prints counts and rates only, never note text."""
    try:
        records = evaluation.load_jsonl(gold)
    except (OSError, ValueError) as e:
        fail(str(e))
    llm = settings.llm(llm_url, llm_model)
    text_stack = _text_stack(stack, llm)
    name = text_stack.name
    def predictions(stack) -> dict:
        return dict(_text_results(stack, records, lambda rec, spans: (rec["id"], [s.to_json() for s in spans]))[0])

    predicted = predictions(text_stack)
    try:
        result = evaluation.evaluate(records, predicted, cluster=cluster)
        if compare:
            other = predictions(_text_stack(compare, llm))
            result = {"stack": name, "compare": compare, name: result,
                      compare: evaluation.evaluate(records, other, cluster=cluster),
                      "paired": evaluation.compare(records, predicted, other, cluster=cluster)}
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


