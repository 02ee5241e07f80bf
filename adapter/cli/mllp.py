"""`deid-adapter mllp`: receive HL7v2 over MLLP, de-identify, queue durably, ACK, forward."""
from __future__ import annotations

import asyncio
import errno
import functools
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
from adapter.cli.common import CharsetOpt, KeyFile, LlmModel, LlmUrl, ProfileOpt, RulesOpt, charset_codec, fail
from adapter.engines import fhir_engine, profiles, with_vault_key
from fhir_transforms.errors import SettingsError
from adapter.mllp import client, listener as edge
from fhir_transforms.hl7v2 import stream
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from text_deid.stack import SETTINGS_OF, STACKS
from adapter import settings


Pool = Union[Executor, edge.WorkerProcesses]


class Pools:
    """Where the CPU-bound de-identification runs: `small` for most messages, `large` for those of
    --large-message-bytes and more. Worker processes (their spawner forked now, after the engine is built and
    before any thread starts) use every core; 0 workers runs each lane on one thread of this process."""

    def __init__(self, engine: Callable[[str], str], workers: int, large_workers: int):
        self.spawner = edge.WorkerSpawner(engine) if workers > 0 else None
        self.small = self._pool(workers, "deid")
        self.large = self._pool(max(1, large_workers), "deid-large")

    def _pool(self, count: int, name: str) -> Pool:
        if self.spawner is None:
            return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        return edge.WorkerProcesses(self.spawner, count)

    def shutdown(self) -> None:
        """Stop the workers (after the listener has finished with them) and the spawner."""
        self.small.shutdown(wait=True, cancel_futures=True)
        self.large.shutdown(wait=True, cancel_futures=True)
        if self.spawner is not None:
            self.spawner.close()


def _hl7_engine(key_file, profile: Optional[str], stack: Optional[str], llm=None,
                rules: Optional[Path] = None, charset: str = "") -> HL7Deidentifier:
    """The HL7v2 engine the `hl7` command uses, with the same key, profile (or site rules), stack and LLM options."""
    base = fhir_engine(key_file, profile, stack, False, None, llm, rules=rules)  # a bad rules file: exit 2 before listening
    try:
        engine = HL7Deidentifier(profiles(profile, rules).hl7, base.pseudo, base.stack, base.clock, charset=charset)
        with_vault_key(base.pseudo, engine.profile.methods)
        return engine
    except SettingsError as e:
        fail(str(e))


# The help keeps its line breaks, so its long paragraph is one line, written in pieces.
LISTENER_HELP = ("""Receive HL7v2 over MLLP; de-identify each message, queue it durably, ACK AA, and forward it downstream.

    AE: the message cannot be de-identified as given, or reuses the MSH-10 of a different message. AR: bad frame, no MSH, """
     """unsupported MSH-18, too large, refused, over the time limit, or the queue is unavailable. The ERR segment names the """
     """problem, never a value.

    SIGTERM or Ctrl-C: stop accepting, finish the messages in hand, flush the queue, exit 0.

    `deid-adapter mllp send FILE… --to HOST:PORT` sends messages to a listener and prints each ACK code.
    """)


mllp_app = typer.Typer(help="Receive HL7v2 over MLLP, de-identify, queue durably, ACK, forward; `mllp send` to try it.",
                       invoke_without_command=True)


@mllp_app.callback(invoke_without_command=True, help=LISTENER_HELP)
def mllp(
    ctx: typer.Context,
    listen: Optional[str] = typer.Option(None, "--listen", help="HOST:PORT to accept MLLP connections on."),
    forward: Optional[str] = typer.Option(None, "--forward",
                                          help="Downstream HOST:PORT (MLLP), or a folder (one file a message)."),
    store: Path = typer.Option(Path("mllp-queue.sqlite"), "--store", help="SQLite store-and-forward queue."),
    profile: Optional[str] = ProfileOpt,
    rules: Optional[Path] = RulesOpt,
    stack: Optional[str] = typer.Option(None, "--stack", help="Text stack: patterns, no-llm, precision-first, ..."),
    key_file: Optional[Path] = KeyFile,
    llm_url: Optional[str] = LlmUrl,
    llm_model: Optional[str] = LlmModel,
    workers: Optional[int] = typer.Option(None, "--workers", help="De-identification processes; default: one per "
                                                                  "CPU; 0: one thread of this process."),
    max_message_bytes: int = typer.Option(edge.DEFAULT_MAX_FRAME, "--max-message-bytes", min=1,
                                          help="Larger messages are answered AR (the ERR names the limit) and "
                                               "skipped; the connection stays open."),
    large_message_bytes: int = typer.Option(edge.LARGE_MESSAGE, "--large-message-bytes", min=1,
                                            help="Messages of this size or more are de-identified by their own "
                                                 "workers, so they never hold up short ones."),
    large_workers: int = typer.Option(1, "--large-workers", min=1,
                                      help="Worker processes for large messages (besides --workers)."),
    message_timeout: Optional[float] = typer.Option(
        None, "--message-timeout", min=0.001,
        help=f"Seconds de-identifying a message may take, per started {edge.LARGE_MESSAGE // 1024} KiB of it; then "
             f"it is answered AR, nothing is forwarded, and its worker process is replaced. Default: "
             f"{edge.DEFAULT_MESSAGE_TIMEOUT:g}, or the stack's own detector time limit when it calls an LLM."),
    allow: list[str] = typer.Option([], "--allow", help="Accept connections only from this CIDR or address "
                                                        "(repeatable); others are dropped. Default: any client."),
    ack_timeout: float = typer.Option(30.0, "--ack-timeout", help="Seconds to wait for the downstream ACK."),
    retry_max_delay: float = typer.Option(30.0, "--retry-max-delay", help="Cap of the retry backoff (seconds)."),
    dedupe_hours: float = typer.Option(24.0, "--dedupe-hours",
                                       help="How long a sender's MSH-10 is remembered to drop its resends."),
    audit: Optional[str] = auditing.AuditOpt,
    audit_key_file: Optional[Path] = auditing.AuditKeyOpt,
    charset: Optional[str] = CharsetOpt,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    if listen is None or forward is None:
        fail("mllp needs --listen HOST:PORT and --forward HOST:PORT|FOLDER (or: mllp send FILE… --to HOST:PORT)")
    try:
        listen_at = edge.parse_address(listen)
    except ValueError as e:
        fail(f"--listen: {e}")
    try:
        networks = edge.parse_allow(allow)
    except ValueError as e:
        fail(f"--allow: {e}")
    target = edge.make_target(forward, ack_timeout)
    codec = charset_codec(charset)
    deid = _hl7_engine(key_file, profile, stack, settings.llm(llm_url, llm_model), rules, codec)
    engine = functools.partial(stream.deidentify_message, deid)  # a long message a window of segments at a time
    trail = auditing.open_trail(audit, audit_key_file)
    audit_hook = _audit_hook(trail, deid) if trail is not None else None
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s deid-adapter mllp %(levelname)s %(message)s")
    workers = (os.cpu_count() or 1) if workers is None else workers
    pools = Pools(engine, workers, large_workers)
    limits = dict(max_frame=max_message_bytes, large_from=large_message_bytes, allow=networks,
                  charset=codec or deid.profile.charset,
                  message_timeout=message_timeout or _default_message_timeout(deid.stack),
                  about=f"profile {deid.profile.name}, stack {deid.stack.name}, key {deid.pseudo.key_id}")
    try:
        with asyncio.Runner(loop_factory=edge.loop_factory()) as runner:
            runner.run(_run(engine, listen_at, target, store, pools, max(1, workers), retry_max_delay,
                            dedupe_hours * 3600, audit_hook, limits))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            fail(f"port {listen_at[1]} is in use (on {listen_at[0]}); choose another with --listen")
        fail(f"cannot listen on {listen}: {e.strerror or e}")
    except sqlite3.Error as e:
        fail(f"{store}: cannot use the queue: {e}")
    except RuntimeError as e:
        typer.echo(f"deid-adapter: mllp stopped: {e}", err=True)
        raise typer.Exit(1)
    finally:
        pools.shutdown()


def _default_message_timeout(stack) -> float:
    """An LLM answers in seconds to minutes: a stack that calls one keeps its own time limit (it fails the record
    closed itself); any other is held to DEFAULT_MESSAGE_TIMEOUT."""
    if any(SETTINGS_OF.get(part) == "llm" for part in STACKS.get(stack.name, ())):
        return max(edge.DEFAULT_MESSAGE_TIMEOUT, stack.timeout_s)
    return edge.DEFAULT_MESSAGE_TIMEOUT


def _audit_hook(trail, engine) -> edge.AuditHook:
    """One audit record per message, written by the listener before it queues and ACKs (or NAKs) the message;
    the messages that finish together are appended in one transaction."""
    info = audit.engine_info(engine)  # one de-identifier for the listener's life: its versions serialized once

    def record(events: list[edge.AuditEvent]) -> list[int]:
        entries = []
        for e in events:
            common = dict(actor=f"mllp:{e.peer}", channel="mllp", data_format="hl7v2", input=e.message, info=info)
            if e.output is not None:
                entries.append(audit.deidentification(engine, output=e.output, findings=e.findings, **common))
            else:
                entries.append(audit.refusal(engine, reason=e.reason or "refused", **common))
        return trail.append(entries)
    return record


async def _run(deidentify, listen_at, target, store, pools: Pools, parallel, backoff_cap, dedupe_window_s,
               audit_hook, limits: dict) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await edge.serve(deidentify, listen_at, target, store, executor=pools.small, parallel=parallel, stop=stop,
                     large_executor=pools.large, backoff_cap=backoff_cap, dedupe_window_s=dedupe_window_s,
                     audit=audit_hook, **limits)


@mllp_app.command("send")
def send(
    files: list[Path] = typer.Argument(..., help="ER7 files: one or several messages each; LF or CR LF line ends "
                                                  "are sent as CR."),
    to: str = typer.Option(..., "--to", help="HOST:PORT of an MLLP listener."),
    timeout: float = typer.Option(30.0, "--timeout", min=0.001, help="Seconds to wait for each ACK."),
) -> None:
    """Send HL7v2 messages over MLLP, one at a time, and print each one's ACK code (never its content).

    Exit 0 when every message is answered AA (or CA); 1 when one is answered AE or AR, or not at all (the rest
    are then not sent); 2 for a file that holds no message, or a peer that does not resolve."""
    try:
        host, port = edge.parse_address(to)
    except ValueError as e:
        fail(f"--to: {e}")
    batches = []
    for path in files:
        try:
            batches.append((path, client.messages_of(path.read_bytes())))
        except OSError as e:
            fail(f"{path}: {e.strerror or e}")
        except ValueError as e:
            fail(f"{path}: {e}")
    labelled = [(f"{path} #{n}" if len(messages) > 1 else str(path), m)
                for path, messages in batches for n, m in enumerate(messages, 1)]
    codes: dict[str, int] = {}
    try:
        answers = client.send([m for _, m in labelled], host, port, timeout)
        for (label, _), answer in zip(labelled, answers):
            typer.echo(f"{label}: {answer.code or '-'}" + (f" ({answer.problem})" if answer.problem else ""))
            key = answer.code if not answer.problem else "unanswered"
            codes[key] = codes.get(key, 0) + 1
    except client.NotSent as e:
        fail(str(e), 2 if "does not resolve" in str(e) else 1)
    sent = sum(codes.values())
    counts = ", ".join(f"{n} {code}" for code, n in sorted(codes.items()))
    not_sent = len(labelled) - sent
    typer.echo(f"{sent} message(s) sent to {to}: {counts}" + (f"; {not_sent} not sent" if not_sent else ""), err=True)
    if set(codes) - {"AA", "CA"} or not_sent:
        raise typer.Exit(1)
