"""`deid-adapter serve` and `deid-adapter tokens`: run the HTTP service and manage its client tokens."""
from __future__ import annotations

import logging
import sys
from datetime import date
from pathlib import Path
from typing import List, Optional

import typer

from adapter.cli import auditing
from adapter.cli.common import (
    CharsetOpt,
    FhirVersion,
    LlmModel,
    LlmUrl,
    ProfileOpt,
    RulesOpt,
    charset_codec,
    fail,
    host_text,
    listening_socket,
    serve_app,
)
from adapter.http.auth import (
    OPERATIONS,
    TOKENS_ENV,
    TokenFileError,
    TokenStore,
    add_client,
)
from adapter.http.admission import default_budget_mb
from adapter.http.connections import HEADER_TIMEOUT_S, with_header_timeout
from adapter.http.service import ServiceConfig, create_app
from conformance.check import check
from fhir_transforms import dates, keys
from fhir_transforms.errors import SettingsError
from text_deid.stack import DEFAULT_STACK, StackUnavailable
from adapter.engines import profiles, text_stack
from adapter import settings

SWITCH_INTERVAL_S = 0.0005
tokens_app = typer.Typer(help="Manage the HTTP service's client tokens.", no_args_is_help=True)
conformance_app = typer.Typer(help="Check a $de-identify server against the Safe Harbor checks.", no_args_is_help=True)


def serve(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8080, "--port"),
    tokens: Path = typer.Option(..., "--tokens", envvar=TOKENS_ENV, help="File of hashed client tokens."),
    key_file: Optional[Path] = typer.Option(None, "--key-file", envvar=keys.KEY_FILE_ENV),
    profile: Optional[str] = ProfileOpt,
    rules: Optional[Path] = RulesOpt,
    stack: Optional[str] = typer.Option(None, "--stack"),
    workers: int = typer.Option(2, "--workers", help="Threads doing de-identification (bounded pool)."),
    max_body_mb: float = typer.Option(20.0, "--max-body-mb"),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="Per-request de-identification time limit."),
    ssl_certfile: Optional[Path] = typer.Option(None, "--ssl-certfile", help="Terminate TLS here (else use a reverse proxy)."),
    ssl_keyfile: Optional[Path] = typer.Option(None, "--ssl-keyfile"),
    today: Optional[str] = typer.Option(None, "--today", help="Reference day for ages (YYYY-MM-DD)."),
    audit: Optional[str] = auditing.AuditOpt,
    audit_key_file: Optional[Path] = auditing.AuditKeyOpt,
    llm_url: Optional[str] = LlmUrl,
    llm_model: Optional[str] = LlmModel,
    fhir_version: FhirVersion = typer.Option(FhirVersion.auto, "--fhir-version",
                                             help="The FHIR version of requests that name none (media type "
                                                  "fhirVersion or the fhirVersion parameter): r4, r5, stu3 or auto."),
    charset: Optional[str] = CharsetOpt,
    max_inflight_mb: Optional[int] = typer.Option(
        None, "--max-inflight-mb", help="Estimated memory of all requests in flight (default: half the machine's); "
                                        "a request over it alone is 413, one that does not fit now 503 + Retry-After."),
    per_client_concurrency: int = typer.Option(
        0, "--per-client-concurrency", help="A client's requests worked on at once (0: all workers but one)."),
    per_client_queue: int = typer.Option(8, "--per-client-queue",
                                         help="A client's requests waiting beyond those; more are 429 + Retry-After."),
    max_connections: int = typer.Option(256, "--max-connections",
                                        help="Open connections and requests; beyond it uvicorn answers 503."),
    keep_alive_s: int = typer.Option(5, "--keep-alive-s", help="An idle kept-alive connection is closed after this."),
    header_timeout_s: float = typer.Option(HEADER_TIMEOUT_S, "--header-timeout-s",
                                           help="A connection whose request headers are not in by then is closed."),
    body_timeout_s: float = typer.Option(30.0, "--body-timeout-s", help="A body not in by then is a 408."),
) -> None:
    """Serve POST /fhir/$de-identify, POST /hl7v2/$de-identify, GET /fhir/metadata, /healthz, /readyz, /metrics."""
    llm = settings.llm(llm_url, llm_model)
    codec = charset_codec(charset)
    try:
        key = keys.load_key(key_file)
        store = TokenStore.load(tokens)
        chosen = profiles(profile, rules)  # a bad rules file: exit 2 with its line, before listening
        text_stack(stack, llm)
    except (keys.KeyError_, TokenFileError, SettingsError, StackUnavailable) as e:
        fail(str(e))
    clock = (lambda d=date.fromisoformat(today): d) if today else dates.today
    trail = auditing.open_trail(audit, audit_key_file)
    config = ServiceConfig(key, store, chosen.name, stack, int(max_body_mb * 1024 * 1024), timeout_s, workers, clock,
                           trail, llm=llm, site=chosen if chosen.site is not None else None,
                           fhir_version=fhir_version.value, charset=codec,
                           max_inflight_mb=max_inflight_mb or default_budget_mb(),
                           per_client_concurrency=per_client_concurrency, per_client_queue=per_client_queue,
                           body_timeout_s=body_timeout_s)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sock = listening_socket(host, port)
    bound = sock.getsockname()
    # Beside a heavy request's pure-Python detectors, a small request waits for the GIL at each of its many steps:
    # a shorter switch interval than Python's 5 ms keeps those waits short (benchmarks/service_heavy_load.py).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    serve_app(create_app(config), sock, ssl_certfile, ssl_keyfile,
              f"deid-adapter serve: listening on {'https' if ssl_certfile else 'http'}://{host_text(bound[0])}:{bound[1]} "
              f"(profile {chosen.name}, stack {stack or DEFAULT_STACK}, key {key.key_id})",
              limit_concurrency=max_connections, timeout_keep_alive=keep_alive_s,
              http=with_header_timeout(header_timeout_s),
              # a stop waits for the requests in hand at most one request's time limit: queued ones are cancelled
              timeout_graceful_shutdown=timeout_s)


@tokens_app.command("add")
def tokens_add(file: Path = typer.Argument(..., help="Token file (created 0600)."),
               client: str = typer.Option(..., "--client"),
               operation: List[str] = typer.Option(list(OPERATIONS), "--op", help=f"Allowed: {', '.join(OPERATIONS)}")) -> None:
    """Add a client; its token is printed once and only its SHA-256 is stored."""
    try:
        token = add_client(file, client, operation)
    except TokenFileError as e:
        fail(str(e))
    typer.echo(token)
    typer.echo(f"client {client} added to {file} ({', '.join(operation)}); its token, on stdout, is shown this once only",
               err=True)


@conformance_app.command("check")
def conformance_check(url: str = typer.Argument(..., help="Base URL of a $de-identify server."),
                      samples: Path = typer.Option(..., "--samples", help="Folder of FHIR .json/.ndjson samples."),
                      token: str = typer.Option(..., "--token", envvar="DEID_ADAPTER_TOKEN")) -> None:
    """Post every sample, then check the answers: no leaked identifier, references resolve, outputs valid."""
    import json

    import httpx

    try:
        report = check(url, token, samples)
    except httpx.HTTPError as e:
        fail(f"{url}: {type(e).__name__}")
    typer.echo(json.dumps(report.to_json()))
    raise typer.Exit(0 if report.passed else 1)
