"""`deid-adapter keys init`: create a key file."""
from __future__ import annotations

from pathlib import Path

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


