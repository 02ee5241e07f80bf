"""`deid-adapter bulk IN OUT`: de-identify a FHIR Bulk Data export (NDJSON), resumable, locally or on Spark."""
from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from adapter.audit.trail import AuditError
from adapter.audit.trail import default_actor as audit_default_actor
from adapter.bulk.export import deidentify_export
from adapter.engines import profiles
from adapter.bulk.spark import SparkUnavailable, check_spark
from adapter.cli import auditing
from adapter.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_REFUSED,
    FhirVersion,
    FhirVersionOpt,
    KeyFile,
    LlmModel,
    LlmUrl,
    ProfileOpt,
    RulesOpt,
    fail,
)
from fhir_transforms import keys
from fhir_transforms.errors import InputError, SettingsError
from fhir_transforms.rules import ProfileError
from text_deid.stack import StackUnavailable
from adapter import settings


class Engine(str, Enum):
    local = "local"
    spark = "spark"


def bulk(
    input: Path = typer.Argument(..., help="A FHIR Bulk Data export folder (.ndjson files, and its manifest if any)."),
    output: Path = typer.Argument(..., help="Where to write: the same layout, a new manifest, deid-summary.json."),
    engine: Engine = typer.Option(Engine.local, "--engine", help="local (a process pool) or spark."),
    workers: int = typer.Option(os.cpu_count() or 1, "--workers", min=1,
                                help="Worker processes (local), or N of Spark's local[N]."),
    master: Optional[str] = typer.Option(None, "--master", help="Spark master URL (spark engine); default local[WORKERS]."),
    profile: Optional[str] = ProfileOpt,
    rules: Optional[Path] = RulesOpt,
    stack: Optional[str] = typer.Option(None, "--stack", help="Text stack: patterns, no-llm, precision-first, "
                                                              "recall-first, balanced."),
    key_file: Optional[Path] = KeyFile,
    validate: str = typer.Option("full", "--validate", help="full, sample (1 resource in 20) or off."),
    today: Optional[str] = typer.Option(None, "--today", help="Reference day for ages (YYYY-MM-DD); default: today, "
                                                              "or the day an interrupted run started."),
    fhir_version: FhirVersion = FhirVersionOpt,
    fail_fast: bool = typer.Option(False, "--fail-fast", help="Stop at the first refused resource."),
    chunk_kb: int = typer.Option(1024, "--chunk-kb", min=1, help="Input bytes per unit of work and checkpoint."),
    llm_url: Optional[str] = LlmUrl,
    llm_model: Optional[str] = LlmModel,
    audit_store: Optional[str] = auditing.AuditOpt,
    audit_key_file: Optional[Path] = auditing.AuditKeyOpt,
    actor: Optional[str] = auditing.ActorOpt,
) -> None:
    """De-identify a bulk export into OUTPUT. Refused resources are listed in the summary; the rest is written.

    Killed and started again with the same arguments, it resumes from its checkpoint journal.
    Exit 0: all written; 2: bad usage or resources that are not valid FHIR; 3: resources refused.
    """
    from datetime import date

    if validate not in ("full", "sample", "off"):
        fail(f"--validate must be full, sample or off, not {validate!r}")
    try:
        if today:
            date.fromisoformat(today)
        key = keys.load_key(key_file)
        profiles(profile, rules)  # a bad profile or rules file (its lines named): before any input is read
    except (keys.KeyError_, ValueError) as e:
        fail(str(e))
    if engine is Engine.spark:
        try:
            check_spark()
        except SparkUnavailable as e:
            fail(str(e))
    trail = auditing.open_trail(audit_store, audit_key_file)
    try:
        outcome = deidentify_export(input, output, key.secret, profile=profile, rules=rules, stack=stack, validate=validate,
                                    today=today, engine=engine.value, workers=workers, master=master,
                                    chunk_bytes=chunk_kb * 1024, fail_fast=fail_fast, llm=settings.llm(llm_url, llm_model),
                                    trail=trail, actor=actor or audit_default_actor(), fhir_version=fhir_version.value)
    except (InputError, SettingsError, ProfileError, StackUnavailable, AuditError) as e:
        fail(str(e))
    if outcome.stopped:
        raise typer.Exit(EXIT_REFUSED)
    typer.echo(f"bulk: {outcome.written:,} resources written to {output}, {outcome.refused} refused, "
               f"{outcome.invalid} not valid FHIR (see deid-summary.json); "
               f"{outcome.resumed_chunks} chunks taken from an interrupted run", err=True)
    if outcome.invalid:
        raise typer.Exit(EXIT_BAD_INPUT)
    if outcome.refused:
        raise typer.Exit(EXIT_REFUSED)
