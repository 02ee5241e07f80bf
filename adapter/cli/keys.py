"""`deid-adapter keys init|rotate|list`: create, rotate and list key files (never printing a key)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

import typer

from adapter.cli.common import fail
from fhir_transforms import keys

keys_app = typer.Typer(help="Create and inspect pseudonymization keys.", no_args_is_help=True)


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


@keys_app.command("rotate")
def keys_rotate(path: Path = typer.Argument(..., help="The key file to rotate (any purpose).")) -> None:
    """Put a new key at PATH and keep the old one as PATH.<old key id>.

    New pseudonyms differ from the old ones, and every output names its key id, so old and new data are
    never silently joined. Keep retired keys: they verify old audit records and open old vault entries."""
    try:
        old, new, archive = keys.rotate_key_file(path)
    except keys.KeyError_ as e:
        fail(str(e))
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    typer.echo(f"key {new.key_id} written to {path}; retired key {old.key_id} kept at {archive}")


@keys_app.command("list")
def keys_list(paths: List[Path] = typer.Argument(..., help="Key files; each one's retired keys are listed too.")) -> None:
    """Key id, purpose, creation time and state of each key (never the key)."""
    for path in paths:
        try:
            purpose = keys.key_purpose(path)
            ring = keys.key_ring(path, purpose)
        except keys.KeyError_ as e:
            fail(str(e))
        for file, key, current in ring:
            try:
                created = json.loads(file.read_text()).get("created", "")
            except (OSError, ValueError):
                created = ""
            typer.echo(f"{key.key_id}\t{purpose}\t{'current' if current else 'retired'}\t{created or '-'}\t{file}")
