"""What every command shares: exit codes and the errors they stand for, `fail`, and the options many commands
take. Kept light: the group imports it to list commands without loading any engine."""
from __future__ import annotations

import errno
import gc
import socket
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from fhir_transforms import keys
from fhir_transforms.errors import InputError, RecordRefused, SettingsError
from fhir_transforms.hl7v2 import message as er7
from text_deid.spans import KnownIdentifier

EXIT_OK, EXIT_BAD_INPUT, EXIT_REFUSED = 0, 2, 3
# An error that ends a command → its exit code; the group maps them here, in one place (../shared/DESIGN.md).
EXIT_CODES: dict[type[Exception], int] = {SettingsError: EXIT_BAD_INPUT, InputError: EXIT_BAD_INPUT,
                                          RecordRefused: EXIT_REFUSED}
GC_THRESHOLD = 50_000  # objects allocated between young-generation collections (Python's default: 700)

KeyFile = typer.Option(None, "--key-file", envvar=keys.KEY_FILE_ENV, help="Key file (or DEID_ADAPTER_KEY_FILE).",
                       show_envvar=True)
StackOpt = typer.Option(None, "--stack", help="Text stack: patterns, no-llm, precision-first, recall-first, balanced.")
LlmUrl = typer.Option(None, "--llm-url", envvar="DEID_ADAPTER_LLM_URL", help="Ollama endpoint for the LLM stacks.")
ProfileOpt = typer.Option(None, "--profile", help="safe-harbor (default), longitudinal or longitudinal-fpe.")
RulesOpt = typer.Option(None, "--rules", help="A site rules file (YAML) over the packaged profile it extends "
                                              "(docs/rules.md); `deid-adapter rules check FILE` checks one.")
LlmModel = typer.Option(None, "--llm-model", envvar="DEID_ADAPTER_LLM_MODEL", help="Ollama model for the LLM stacks.")
CharsetOpt = typer.Option(None, "--charset", help="HL7v2: the character set of messages whose MSH-18 is empty "
                                                  "(8859/1, UNICODE UTF-8 ...: HL7 table 0211); MSH-18 wins.")


class Validation(str, Enum):
    full = "full"
    sample = "sample"
    off = "off"


class FhirVersion(str, Enum):
    r4 = "r4"
    r5 = "r5"
    stu3 = "stu3"
    auto = "auto"


FhirVersionOpt = typer.Option(FhirVersion.auto, "--fhir-version",
                              help="The FHIR version of the input: r4, r5, stu3, or auto (each record's fhirVersion, "
                                   "versioned meta.profile, version-only resource types or STU3-only elements; "
                                   "none: r4). The output stays in the input's version.")


def tune_gc() -> None:
    """De-identification allocates millions of short-lived, acyclic JSON objects; with Python's default
    threshold the cycle collector ran so often that it took ~16% of the fast path (benchmarks/fhir_throughput.py)."""
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


def charset_codec(name: str | None) -> str:
    """The codec `--charset` names ('' without the option); an unknown or ambiguous name ends the command (exit 2)."""
    if not name:
        return ""
    codec = er7.charset_codec(name)
    if codec is None:
        fail(f"--charset: unknown character set {name[:24]!r} (HL7 table 0211: 8859/1, UNICODE UTF-8 ...)")
    return codec


def check_output_apart(input: Path, output: Path) -> None:
    """OUTPUT may be neither INPUT nor inside it: the next run over INPUT would read its own outputs as input."""
    if input.resolve() == output.resolve():
        fail("OUTPUT must differ from INPUT")
    if input.is_dir() and output.resolve().is_relative_to(input.resolve()):
        fail("OUTPUT must not be a folder inside INPUT (a later run would de-identify its own outputs)")


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    """Print the message on stderr and end the command with the exit code (2: bad usage or input)."""
    typer.echo(f"deid-adapter: {message}", err=True)
    raise typer.Exit(code)


def known_from_json(rec: dict) -> list[KnownIdentifier]:
    """The `known` list of a JSONL record (../shared/DESIGN.md); malformed entries are ignored."""
    return [KnownIdentifier(k["value"], k["category"]) for k in rec.get("known") or []
            if isinstance(k, dict) and isinstance(k.get("value"), str) and isinstance(k.get("category"), str)]


def listening_socket(host: str, port: int) -> socket.socket:
    """A server's socket, bound and listening (port 0: one the system chooses): a port in use, or an address not
    of this machine, is exit 2 with what to change."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            fail(f"port {port} is in use (on {host}); choose another with --port")
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}")


def host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve_app(app, sock: socket.socket, ssl_certfile: Optional[Path], ssl_keyfile: Optional[Path], about: str,
              **options) -> None:
    """Run an ASGI app on uvicorn on `sock` (`options`: more of uvicorn's settings); say `about` (where it listens)
    on stderr once it does. SIGTERM or Ctrl-C: uvicorn finishes the requests in hand and the app's shutdown, and
    the command exits 0."""
    import uvicorn

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                typer.echo(about, err=True)

        async def shutdown(self, sockets=None) -> None:
            await super().shutdown(sockets)
            getattr(self, "_captured_signals", []).clear()  # stopped as asked: not raised again to kill the process

    # uvicorn trusts X-Forwarded-For and -Proto from 127.0.0.1 unless told: no proxy is trusted unless named
    options = {"proxy_headers": False, **options}
    Announcing(uvicorn.Config(app, access_log=False, log_level="warning",
                              ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
                              ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None, **options)).run(sockets=[sock])
