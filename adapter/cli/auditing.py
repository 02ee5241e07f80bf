"""What every de-identifying command shares about the audit trail and the vault: their options, opening the
trail, and the audit session of a run."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from adapter.audit import trail as audit
from adapter.audit.trail import AuditError, AuditSession, AuditTrail
from adapter.audit.vault import Vault, VaultError, vault_url
from adapter.cli.common import fail
from fhir_transforms import keys

AuditOpt = typer.Option(None, "--audit", envvar=audit.AUDIT_ENV, show_envvar=True,
                        help="Audit store: a SQLAlchemy URL (postgresql://…) or a SQLite path; 'off' records nothing. "
                             "Default ~/.local/state/deid-adapter/audit.sqlite.")
AuditKeyOpt = typer.Option(None, "--audit-key-file", envvar=audit.AUDIT_KEY_ENV, show_envvar=True,
                           help="Audit key (signs the trail). Default audit.key beside the default store, made on first use.")
ActorOpt = typer.Option(None, "--actor", envvar=audit.ACTOR_ENV, show_envvar=True,
                        help="Who acts, for the audit trail. Default user@host.")
VaultFlag = typer.Option(False, "--vault", help="Store each pseudonym's original, encrypted with the vault key, for "
                                                "controlled re-identification (off by default).")
VaultKeyOpt = typer.Option(None, "--vault-key-file", envvar="DEID_ADAPTER_VAULT_KEY_FILE", show_envvar=True,
                           help="Vault key (`keys init --purpose vault PATH`).")

def open_trail(target: Optional[str], key_file: Optional[Path]) -> Optional[AuditTrail]:
    """The audit trail the options name, None for 'off'; exit 2 when it cannot be opened."""
    if str(target).lower() == audit.OFF:
        typer.echo("deid-adapter: audit trail off: nothing of this run is recorded", err=True)
        return None
    try:
        return AuditTrail.open(target, key_file)
    except AuditError as e:
        fail(str(e))


def open_session(engine, data_format: str, target: Optional[str], key_file: Optional[Path], actor: Optional[str],
                 vault: bool = False, vault_key_file: Optional[Path] = None, channel: str = "cli") -> AuditSession:
    """The audit session of one command run; with --vault, the engine's pseudonyms also go to the vault."""
    trail = open_trail(target, key_file)
    store = None
    if vault:
        try:
            store = Vault(vault_url(), keys.load_key(vault_key_file, "vault"))
        except (keys.KeyError_, VaultError) as e:
            fail(f"vault: {e}")
        engine.pseudo.on_issue = store.recorder(engine.pseudo.key_id)
    return AuditSession(trail, engine, actor=actor or audit.default_actor(), channel=channel,
                        data_format=data_format, vault=store)


def record_file(account: AuditSession, audited: list, data: bytes, ndjson: bool) -> None:
    """Audit the records of one output file and commit: (input, resource type, findings, where) per record,
    and the file's bytes.

    A record's output hash is that of the bytes written for it (the .json file, or its NDJSON line without the
    newline), so `sha256sum` of a released file matches; the input hash is of the input as given (its bytes
    as read, or a held record's canonical JSON)."""
    written = data.split(b"\n")[:-1] if ndjson else [data]
    for (given, root, findings, where), out in zip(audited, written, strict=True):
        account.deidentified(given, out, findings, where, root)
    account.commit()
