"""What every command shares: exit codes, `fail`, the options many commands take, and the engine they build."""
from __future__ import annotations

import gc
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from adapter.engines import EngineSettingsError, fhir_engine
from fhir_transforms import keys
from fhir_transforms.r4.record import Deidentifier
from text_deid.spans import KnownIdentifier
from text_deid.stack import LlmSettings

EXIT_OK, EXIT_BAD_INPUT, EXIT_REFUSED = 0, 2, 3
GC_THRESHOLD = 50_000  # objects allocated between young-generation collections (Python's default: 700)

KeyFile = typer.Option(None, "--key-file", envvar=keys.KEY_FILE_ENV, help="Key file (or DEID_ADAPTER_KEY_FILE).",
                       show_envvar=True)
StackOpt = typer.Option(None, "--stack", help="Text stack: patterns, no-llm, precision-first, recall-first, balanced.")
LlmUrl = typer.Option(None, "--llm-url", envvar="DEID_ADAPTER_LLM_URL", help="Ollama endpoint for the LLM stacks.")
LlmModel = typer.Option(None, "--llm-model", envvar="DEID_ADAPTER_LLM_MODEL", help="Ollama model for the LLM stacks.")


class Validation(str, Enum):
    full = "full"
    sample = "sample"
    off = "off"


def tune_gc() -> None:
    """De-identification allocates millions of short-lived, acyclic JSON objects; with Python's default
    threshold the cycle collector ran so often that it took ~16% of the fast path (benchmarks/fhir_throughput.py)."""
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    """Print the message on stderr and end the command with the exit code (2: bad usage or input)."""
    typer.echo(f"deid-adapter: {message}", err=True)
    raise typer.Exit(code)


def deidentifier(key_file: Optional[Path], profile: str, stack: Optional[str], validate: bool, today: Optional[str],
                 llm: Optional[LlmSettings] = None) -> Deidentifier:
    """The FHIR engine for these options, or exit 2 naming what is wrong with them."""
    try:
        return fhir_engine(key_file, profile, stack, validate, today, llm)
    except EngineSettingsError as e:
        fail(str(e))


def known_from_json(rec: dict) -> list[KnownIdentifier]:
    """The `known` list of a JSONL record (../shared/DESIGN.md); malformed entries are ignored."""
    return [KnownIdentifier(k["value"], k["category"]) for k in rec.get("known") or []
            if isinstance(k, dict) and isinstance(k.get("value"), str) and isinstance(k.get("category"), str)]
