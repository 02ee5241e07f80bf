"""The whole bulk run, on the engine asked for: the local process pool (adapter/bulk/job.py) or Spark
(adapter/bulk/spark.py). Kept apart from both so that neither engine imports the other."""
from __future__ import annotations

import contextlib
import secrets
import sys
import time
from pathlib import Path
from typing import Callable

from adapter.bulk.job import (Outcome, discover, Journal, run_identity, Settings, run_local, PatientIndex, scan, Export, run,
                              DEFAULT_CHUNK_BYTES, WORK_DIR)
from adapter.bulk.spark import spark_engine
from fhir_transforms import dates
from fhir_transforms.errors import InputError
from fhir_transforms.keys import key_id_for
from fhir_transforms.r4 import versions
from text_deid.stack import LlmSettings
from adapter import engines


def deidentify_export(root: Path, out: Path, secret: bytes, *, profile: str | None = None, rules: Path | None = None,
                      stack: str | None = None,
                      validate: str = "full", today: str | None = None, engine: str = "local", workers: int = 1,
                      master: str | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES, fail_fast: bool = False,
                      tty: bool | None = None, llm: LlmSettings | None = None, trail=None, actor: str = "bulk",
                      fhir_version: str = versions.DEFAULT,
                      log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> Outcome:
    """The whole bulk run: discover, pass 1 (chunks and patient index), pass 2 on `engine`, finish.

    Raises InputError for an input that is not a bulk export; StackUnavailable / SettingsError (a bad profile or
    rules file) as the CLI does.
    """
    root, out = Path(root), Path(out)
    if out.resolve() == root.resolve() or out.resolve().is_relative_to(root.resolve()):
        raise InputError("OUTPUT must not be INPUT or a folder inside it")
    files, skipped, manifest_name, manifest_fields = discover(root)
    if not files:
        raise InputError(f"{root}: no .ndjson file with FHIR resources")
    chosen = engines.profiles(profile, rules)  # SettingsError: a bad profile or rules file, before any work
    profile = chosen.name
    versions.check(fhir_version)
    text_stack = engines.text_stack(stack, llm)  # once in the driver: pass 1 and an in-process pass 2 share it
    identity = f"{profile}+{chosen.site.sha256}" if chosen.site else profile  # resumed only with the same rules
    journal = Journal(out / WORK_DIR, run_identity(root, files, key_id_for(secret), identity, text_stack.name, validate,
                                                   chunk_bytes, fhir_version), secret)
    day = journal.open(today, lambda: dates.today().isoformat())
    settings = Settings(secret, profile, text_stack.name, day, validate, str(journal.work / "patients.sqlite"),
                        secrets.token_bytes(32), llm, actor, str(Path(rules).resolve()) if rules else None,
                        fhir_version)
    started = time.monotonic()
    if engine == "spark":
        context = spark_engine(root, settings, workers, master)  # Spark starts now, while pass 1 runs
    else:
        context = contextlib.nullcontext(lambda todo: run_local(root, settings, todo, workers, text_stack))
    with context as engine_fn:
        index = PatientIndex(Path(settings.index_path), settings.index_key, create=True)
        chunks, patients = scan(root, files, index, settings.engine(text_stack), validate, chunk_bytes)
        export = Export(root, files, chunks, skipped, manifest_name, manifest_fields, patients)
        log(f"bulk: pass 1: {len(files)} files, {export.resources:,} resources in {len(chunks)} chunks, "
            f"{patients:,} patients indexed ({time.monotonic() - started:.1f} s)")
        outcome = run(export, out, settings, journal, engine_fn, fail_fast=fail_fast, tty=tty, log=log, trail=trail)
    log(f"bulk: {engine} engine, {time.monotonic() - started:.1f} s in all")
    return outcome
