"""`deid-adapter mllp`: receive HL7v2 over MLLP, de-identify, queue durably, ACK, forward."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import sys
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Union

import typer

from adapter.audit import trail as audit
from adapter.cli import auditing
from adapter.cli.common import KeyFile, LlmModel, LlmUrl, fail
from adapter.engines import fhir_engine
from adapter.mllp import listener as edge
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import load_hl7_profile
from fhir_transforms.rules import ProfileError
from text_deid.stack import LlmSettings


def make_pool(engine: Callable[[str], str], workers: int) -> Union[Executor, edge.WorkerProcesses]:
    """Where the CPU-bound de-identification runs. Worker processes (forked now, after the engine is built and
    before any thread starts) use every core; 0 workers runs it on one thread of this process."""
    if workers <= 0:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="deid")
    return edge.WorkerProcesses(engine, workers)


def _hl7_engine(key_file, profile: str, stack: Optional[str], llm=None) -> Callable[[str], str]:
    """The HL7v2 engine the `hl7` command uses, with the same key, profile, stack and LLM options."""
    base = fhir_engine(key_file, profile, stack, False, None, llm)
    try:
        return HL7Deidentifier(load_hl7_profile(profile), base.pseudo, base.stack, base.clock).deidentify
    except ProfileError as e:
        fail(str(e))


def mllp(
    listen: str = typer.Option(..., "--listen", help="HOST:PORT to accept MLLP connections on."),
    forward: str = typer.Option(..., "--forward", help="Downstream HOST:PORT (MLLP), or a folder (one file a message)."),
    store: Path = typer.Option(Path("mllp-queue.sqlite"), "--store", help="SQLite store-and-forward queue."),
    profile: str = typer.Option("safe-harbor", "--profile", help="safe-harbor (default) or longitudinal."),
    stack: Optional[str] = typer.Option(None, "--stack", help="Text stack: patterns, no-llm, precision-first, ..."),
    key_file: Optional[Path] = KeyFile,
    llm_url: Optional[str] = LlmUrl,
    llm_model: Optional[str] = LlmModel,
    workers: Optional[int] = typer.Option(None, "--workers", help="De-identification processes; default: one per "
                                                                  "CPU; 0: one thread of this process."),
    max_message_bytes: int = typer.Option(edge.DEFAULT_MAX_FRAME, "--max-message-bytes",
                                          help="Larger frames are answered AR and skipped."),
    ack_timeout: float = typer.Option(30.0, "--ack-timeout", help="Seconds to wait for the downstream ACK."),
    retry_max_delay: float = typer.Option(30.0, "--retry-max-delay", help="Cap of the retry backoff (seconds)."),
    dedupe_hours: float = typer.Option(24.0, "--dedupe-hours",
                                       help="How long a sender's MSH-10 is remembered to drop its resends."),
    audit: Optional[str] = auditing.AuditOpt,
    audit_key_file: Optional[Path] = auditing.AuditKeyOpt,
) -> None:
    """Receive HL7v2 over MLLP; de-identify each message, queue it durably, ACK AA, and forward it downstream.

    AE: the message cannot be de-identified as given. AR: bad frame, no MSH, unsupported MSH-18, too large, refused, or the queue is unavailable. The ERR segment names the problem, never a value.

    SIGTERM or Ctrl-C: stop accepting, finish the messages in hand, flush the queue, exit 0.
    """
    try:
        listen_at = edge.parse_address(listen)
    except ValueError as e:
        fail(f"--listen: {e}")
    target = edge.make_target(forward, ack_timeout)
    engine = _hl7_engine(key_file, profile, stack, LlmSettings(llm_url, llm_model))
    trail = auditing.open_trail(audit, audit_key_file)
    audit_hook = _audit_hook(trail, engine.__self__) if trail is not None else None
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s deid-adapter mllp %(levelname)s %(message)s")
    workers = (os.cpu_count() or 1) if workers is None else workers
    pool = make_pool(engine, workers)
    try:
        with asyncio.Runner(loop_factory=edge.loop_factory()) as runner:
            runner.run(_run(engine, listen_at, target, store, pool, max(1, workers), max_message_bytes,
                            retry_max_delay, dedupe_hours * 3600, audit_hook))
    except OSError as e:
        fail(f"cannot listen on {listen}: {e.strerror or e}")
    except sqlite3.Error as e:
        fail(f"{store}: cannot use the queue: {e}")
    except RuntimeError as e:
        typer.echo(f"deid-adapter: mllp stopped: {e}", err=True)
        raise typer.Exit(1)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _audit_hook(trail, engine) -> edge.AuditHook:
    """One audit record per message, written by the listener before it queues and ACKs (or NAKs) the message;
    the messages that finish together are appended in one transaction."""
    info = audit.engine_info(engine)  # one de-identifier for the listener's life: its versions serialized once

    def record(events: list[edge.AuditEvent]) -> list[int]:
        entries = []
        for e in events:
            common = dict(actor=f"mllp:{e.peer}", channel="mllp", data_format="hl7v2", input=e.message, info=info)
            if e.output is not None:
                entries.append(audit.deidentification(engine, output=e.output, **common))
            else:
                entries.append(audit.refusal(engine, reason=e.reason or "refused", **common))
        return trail.append(entries)
    return record


async def _run(deidentify, listen_at, target, store, pool, parallel, max_frame, backoff_cap, dedupe_window_s,
               audit_hook) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await edge.serve(deidentify, listen_at, target, store, executor=pool, parallel=parallel, stop=stop,
                     max_frame=max_frame, backoff_cap=backoff_cap, dedupe_window_s=dedupe_window_s, audit=audit_hook)
